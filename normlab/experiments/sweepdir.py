"""One pass over a sweep: its directory, resume, and which executor trains what; resumable, Ctrl-C safe.

The entry is ``normlab.experiments.run`` (entry.py: once, or in rounds until decided); every executor trains
through the one scheduling loop of ``normlab.experiments.scheduling``.

Layout of a sweep directory::

    SWEEP_DIR/sweep.yaml          the self-contained sweep (base config inlined); its hash is in the store
    SWEEP_DIR/results.sqlite      the results store (normlab.experiments.store)
    SWEEP_DIR/runs/<run id>/      one normlab run directory per run (config.yaml, metrics.jsonl, summary.json, ...)
    SWEEP_DIR/logs/<run id>.log   the worker's stdout/stderr (training progress lines)
    SWEEP_DIR/tb/<run id>/        TensorBoard scalars, written live (``tensorboard --logdir SWEEP_DIR/tb``)
    SWEEP_DIR/report.html, report.md, report_*.png   written by normlab.report

Parallelism: without ``--workers`` the packing is measured (normlab.experiments.packing: workers x threads with
the most summed tokens/s at the sweep's shape, cached). Otherwise ``workers`` processes (at most one per run; each
trains runs one after another, normlab.experiments.pool, so ``import torch`` is paid once per worker), each with
``threads = max(1, cores // workers)`` torch threads (``OMP_NUM_THREADS`` and ``torch.set_num_threads``), so
``workers * threads <= cores`` unless more workers than cores are asked for. Workers start in their own session, so
a terminal Ctrl-C reaches only this process, which forwards one SIGINT to each worker (the trainer checkpoints and
exits 130); a second Ctrl-C forwards a second one (the trainer stops at once, keeping its last checkpoint); a
third kills the workers. Every result is written by its worker in one SQLite transaction, so an interrupted sweep
leaves only whole rows; re-running the same command resumes interrupted runs and skips finished ones.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from normlab.config import stored_config
from normlab.data.cache import default_cache_dir
from normlab.errors import NormlabError
from normlab.experiments.design import record_design
from normlab.experiments.estimate import check_device
from normlab.experiments.executors import RayTasks, check_executor, cluster_cpus, cluster_gpus, connect, plan_ray
from normlab.experiments.packing import choose_packing
from normlab.experiments.scheduling import Inline, Processes, Stacked, drive
from normlab.experiments.store import FINAL, Store
from normlab.experiments.sweep import Sweep, dump_spec
from normlab.experiments.worker import plan_stacks
from normlab.io import write_text
from normlab.locks import exclusive_lock
from normlab.resources import available_cores, plan_workers
from normlab.rundir.files import FINGERPRINT_FILE
from normlab.rundir.fingerprint import check_run
from normlab.rundir.readers import load_data

COMPARE_LOCK = ".compare.lock"  # SWEEP_DIR/.compare.lock: one normlab compare per sweep directory (normlab.locks)


def default_sweep_dir(sweep: Sweep) -> Path:
    return Path("runs") / f"compare-{sweep.name}"


@dataclass
class SweepOutcome:
    """What one ``run_sweep`` call did (or, from ``experiments.entry.run``, a whole sequential plan: its last round,
    ``trained`` over every round, ``until_decided``: why it stopped, the seeds spent, the number of looks).
    ``status``: ``completed`` (nothing left to run) or ``interrupted``."""

    sweep_dir: Path
    status: str
    trained: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    workers: int = 0
    threads: int = 0
    wall_s: float = 0.0
    runs: list[dict[str, Any]] = field(default_factory=list)
    packing: dict[str, float] = field(default_factory=dict)  # measured summed tokens/s per "WxT" (packing.py)
    sweep_tokens_per_s: float | None = None  # tokens trained by this call's runs / its wall time
    until_decided: dict[str, Any] | None = None  # a sequential plan: {stopped, seeds_spent, looks}

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.runs:
            out[r["status"]] = out.get(r["status"], 0) + 1
        return out


def check_sweep_dir(sweep: Sweep, sweep_dir: Path) -> Store | None:
    """The existing store of ``sweep_dir`` if it belongs to ``sweep``, None for a new/empty dir; else an error."""
    store = Store(sweep_dir / "results.sqlite")
    if store.path.is_file():
        meta = store.meta()
        if meta.get("sweep_hash") != sweep.hash:
            raise NormlabError(
                f"{sweep_dir} holds sweep '{meta.get('sweep_name')}' (hash {meta.get('sweep_hash')}) "
                "from another sweep "
                f"file; this sweep has hash {sweep.hash}: use --out NEW_DIR, or delete {sweep_dir} to start over"
            )
        return store
    if sweep_dir.exists() and (not sweep_dir.is_dir() or any(sweep_dir.iterdir())):
        raise NormlabError(f"{sweep_dir} exists and is not a sweep directory (no results.sqlite); choose another --out")
    return None


def _prepare_data(configs: list[dict[str, Any]], log: Callable[[str], None]) -> None:
    """Build every distinct token cache once, here, before workers start (and check each corpus fits its context)."""
    seen = set()
    for c in configs:
        key = (repr(sorted(c["data"].items())), c["model"]["context"])
        if key in seen:
            continue
        seen.add(key)
        t0 = time.time()
        load_data(stored_config(c, "a planned run's config"))
        log(f"data {c['data']['source']} ({c['data']['tokenizer']}) ready in {time.time() - t0:.1f}s")


def run_sweep(sweep: Sweep, sweep_dir: Path, *, workers: int | None = None,
              log: Callable[[str], None] | None = None, executor: str = "local",
              address: str | None = None, threads: int | None = None, inline: bool = False,
              stack: str | None = None) -> SweepOutcome:
    """Run every unfinished run of ``sweep`` in ``sweep_dir`` once (see the module docstring); returns the outcome.
    ``executor``: ``local`` worker processes, or ``ray`` tasks on the cluster at ``address``
    (``normlab.experiments.executors``). ``threads``: torch threads per worker (default: cores // workers; the
    claims suite passes 1, which its bit-for-bit reproducible numbers depend on). ``inline``: train the runs one
    after another in this process instead of one worker process each (the local executor with one worker), for
    many tiny runs whose process start-up (~3 s: docs/benchmarks.md, sweep overhead) would dominate; the store, logs
    and Ctrl-C behave the same. ``stack``: ``--stack auto|on|off`` (default: each run's ``train.stack``): runs of one
    architecture train first, as stacked groups (normlab.experiments.worker.plan_stacks, normlab.train.stacked): in
    this process with the local executor, one Ray task per group with Ray; the others as without it. Every executor
    trains through the one scheduling loop, ``normlab.experiments.scheduling.drive``."""
    log = log or (lambda s: print(s, file=sys.stderr, flush=True))
    if workers is not None and workers < 1:
        raise NormlabError(f"--workers must be >= 1, got {workers}")
    check_executor(executor, address)
    if executor == "local":  # a Ray cluster may have the GPUs this machine lacks
        check_device(sweep.name, [r.config for r in sweep.runs])
    if inline and (executor != "local" or (workers or 1) != 1):
        raise NormlabError("inline training needs the local executor with one worker")
    t_start = time.time()
    existing = check_sweep_dir(sweep, sweep_dir)
    stored = {r["run_id"]: r for r in existing.runs()} if existing else {}
    todo = [r for r in sweep.runs if stored.get(r.run_id, {}).get("status") not in FINAL]
    stale = [r.run_id for r in sweep.runs if stored.get(r.run_id, {}).get("status") in FINAL
             and stored[r.run_id].get("config_hash") != r.config_hash]
    if stale:  # the sweep file is the same, but normlab now resolves it to a different full config
        log(f"note: {len(stale)} finished run(s) were trained under a different resolved config (normlab's defaults "
            f"changed since): {', '.join(stale[:4])}{' ...' if len(stale) > 4 else ''}; they are reused as they "
            "are -- use --out NEW_DIR to train them again")
    todo += _refingerprint(sweep, sweep_dir, stored, log)  # finished runs this code would not reproduce
    skipped = [r.run_id for r in sweep.runs if r.run_id not in {t.run_id for t in todo}]
    if todo:
        _prepare_data([r.config for r in todo], log)
    sweep_dir.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(sweep_dir / COMPARE_LOCK, str(sweep_dir), holder="normlab compare"):
        store = Store(sweep_dir / "results.sqlite")
        store.create(sweep.name, sweep.hash)
        # the declared question, before any run (design.py); a sweep built in code without one (claims) has none
        changed = record_design(store, sweep.design()) if sweep.question else []
        if changed:
            log(f"note: the sweep's design changed ({', '.join(changed)}); the change is recorded in the store, and "
                "if runs had already finished the report treats every comparison as exploratory")
        if changed or not (sweep_dir / "sweep.yaml").is_file():
            write_text(sweep_dir / "sweep.yaml", dump_spec(sweep))
        store.register(registration(sweep))
        ray = connect(address) if executor == "ray" and todo else None
        groups, stack_note = [], ""
        if todo:  # under Ray, auto stacks where the cluster's tasks get a GPU
            groups, _, stack_note = plan_stacks({r.run_id: r.config for r in todo}, stack,
                                                cuda=cluster_gpus(ray) if ray is not None else None)
        in_groups = {r for g in groups for r in g}
        alone = [r.run_id for r in todo if r.run_id not in in_groups]
        jobs = [*groups, *([r] for r in alone)]  # a stacked group is one job: one process, one Ray task
        n_workers, planned = plan_ray(ray, len(jobs), workers) if ray else plan_workers(max(len(alone), 1), workers)
        packing: dict[str, float] = {}
        if threads is not None:
            if threads < 1:
                raise NormlabError(f"threads must be >= 1, got {threads}")
        elif ray is None and workers is None and not inline and len(alone) > 1 and available_cores() > 1:  # .packing
            n_workers, planned, packing = _choose_packing(sweep, [r for r in todo if r.run_id in alone], log)
        threads = threads or planned
        outcome = SweepOutcome(sweep_dir, "completed", skipped=skipped, workers=n_workers, threads=threads,
                               packing=packing)
        how = f"; {n_workers} workers x {threads} threads" if todo else ""
        log(
            f"sweep '{sweep.name}': {len(sweep.runs)} runs, {len(todo)} to run, {len(skipped)} already done{how} "
            f"-> {sweep_dir}"
        )
        if todo:
            t_exec = time.time()
            asked = stack == "on" or (stack is None and any(r.config.get("train", {}).get("stack") in ("on", True)
                                                             for r in todo))
            if groups or asked:  # asked for: why a group trains alone is logged, from --stack or train.stack
                log(stack_note)
            if ray is not None:  # every job a Ray task, the stacked groups first
                outcome.status = drive(RayTasks(ray, store, sweep_dir, n_workers, threads), store, jobs, log,
                                       outcome.trained)
            elif groups:  # the stacked groups first (in this process), then the runs alone
                outcome.status = drive(Stacked(sweep_dir, threads, log), store, groups, log, outcome.trained)
            if ray is None and outcome.status != "interrupted" and alone:
                run_alone = (Inline(sweep_dir, threads, log) if inline
                             else Processes(sweep_dir, n_workers, threads, log, store, len(alone)))
                outcome.status = drive(run_alone, store, [[r] for r in alone], log, outcome.trained)
            outcome.wall_s = time.time() - t_start
            outcome.sweep_tokens_per_s = _sweep_tokens(store, outcome.trained) / max(time.time() - t_exec, 1e-9)
            log(f"sweep throughput {outcome.sweep_tokens_per_s:,.0f} tokens/s summed over {n_workers} workers "
                f"x {threads} threads")
            for k, v in (("workers", n_workers), ("threads", threads), ("executor", executor),
                         ("cores", cluster_cpus(ray) if ray else available_cores()),
                         ("wall_s", f"{outcome.wall_s:.1f}")):
                store.set_meta(k, str(v))
        mine = {r.run_id for r in sweep.runs}  # a sequential round is a subset of the store's runs: the rows of
        outcome.runs = [r for r in store.runs() if r["run_id"] in mine]  # later rounds are not this one's
    outcome.wall_s = time.time() - t_start
    return outcome


def registration(sweep: Sweep) -> list[dict[str, Any]]:
    """The store rows (``Store.register``) of ``sweep``'s runs, pending."""
    return [{"run_id": r.run_id, "position": i, "variant": r.variant, "seed": r.seed, "config_hash": r.config_hash,
             "axes": r.axes, "overrides": r.overrides, "config": r.config} for i, r in enumerate(sweep.runs)]


def _refingerprint(sweep: Sweep, sweep_dir: Path, stored: dict, log: Callable[[str], None]) -> list:
    """Finished runs whose ``fingerprint.json`` (normlab.rundir.fingerprint: resolved config, parameter
    names/shapes/order,
    normlab and torch versions) no longer matches what the current code builds: each is moved aside to
    ``SWEEP_DIR/stale/RUN_ID-<n>`` (kept, not deleted) and returned to be trained again, with the reason logged.
    Runs trained before fingerprints existed cannot be checked: they are reused, and the log says so."""
    again, legacy, why_all = [], [], {}
    for r in sweep.runs:
        if stored.get(r.run_id, {}).get("status") not in FINAL:
            continue
        rd = sweep_dir / "runs" / r.run_id
        if not (rd / FINGERPRINT_FILE).is_file():
            legacy.append(r.run_id) if rd.is_dir() else None
            continue
        why = check_run(rd)
        if why is None:
            continue
        n = 0
        while (sweep_dir / "stale" / f"{r.run_id}-{n}").exists():
            n += 1
        (sweep_dir / "stale").mkdir(exist_ok=True)
        rd.rename(sweep_dir / "stale" / f"{r.run_id}-{n}")
        why_all.setdefault(why, []).append(r.run_id)
        again.append(r)
    for why, ids in why_all.items():
        log(f"retraining {len(ids)} finished run(s) the current code would not reproduce ({why}; old run dirs kept "
            f"in {sweep_dir / 'stale'}): {', '.join(ids[:4])}{' ...' if len(ids) > 4 else ''}")
    if legacy:
        log(f"note: {len(legacy)} finished run(s) were trained before run fingerprints (no fingerprint.json), so "
            "whether the current code reproduces them cannot be checked; they are reused as they are")
    return again


def _choose_packing(sweep: Sweep, todo: list, log: Callable[[str], None]) -> tuple[int, int, dict[str, float]]:
    cfg = todo[0].config
    cache = (cfg.get("data") or {}).get("cache_dir") or default_cache_dir()
    return choose_packing(cfg, len(todo), available_cores(), Path(cache), log)


def _sweep_tokens(store: Store, run_ids: list[str]) -> float:
    """Tokens trained by ``run_ids`` (steps x batch x context x grad_accum of each, as resolved now)."""
    total = 0.0
    for run_id in run_ids:
        row = store.get(run_id)
        if row.get("step"):
            c = stored_config(json.loads(json.dumps(row["config"])), f"sweep run {run_id}")
            total += row["step"] * c.train.batch_size * c.model.context * c.train.grad_accum
    return total
