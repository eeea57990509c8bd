"""Running the claims suite: which runs to train (reusing complete runs in ``OUT/runs/<variant>/seed<k>``), training
them, measuring every claim per seed and writing ``claims.json``.

Every run directory holds ``claims_spec.json`` (the exact config dict it was trained from); a run is reused only when
that spec matches, ``summary.json`` says completed or diverged, and its fingerprint (``fingerprint.json``: resolved
config, parameter names/shapes/order, normlab and torch versions) matches what the current code builds
(``reuse_reason`` says why not; the log and ``claims.json`` ``retrained`` list it). ``--reuse SWEEP_DIR`` copies
finished runs of a sweep (e.g. the demo's) trained from exactly the same resolved config instead of training them.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from normlab.errors import NormlabError
from normlab.experiments.claims.budgets import Budget
from normlab.experiments.claims.specs import CLAIM_NAMES
from normlab.experiments.claims.stats import verdict
from normlab.experiments.claims.variants import GRID_VARIANTS, lr_dir, variant_config
from normlab.io import read_json, write_json

if TYPE_CHECKING:
    from normlab.experiments.claims.specs import Claim


def run_dir_for(out: Path, variant: str, seed: int, lr: float | None = None) -> Path:
    """``OUT/runs/<variant>/seed<k>`` (a grid variant's runs are its ``lr<lr>`` subfolders)."""
    d = out / "runs" / variant / f"seed{seed}"
    return d if lr is None else lr_dir(d, lr)


def spec_record(cfg: dict) -> dict:
    """What ``claims_spec.json`` holds: the run's spec and the full config normlab resolves it to now. A run is
    reused only when both match, so a changed library default (a new config key, a new default value) retrains
    it instead of silently mixing old and new results."""
    from normlab.config import config_from_dict

    record = {"spec": cfg, "resolved": config_from_dict(copy.deepcopy(cfg)).to_dict()}
    return json.loads(json.dumps(record))  # as it reads back from disk (tuples -> lists)


def reuse_reason(run_dir: Path, cfg: dict) -> str | None:
    """None when the run in ``run_dir`` can be reused for ``cfg``: its ``claims_spec.json`` matches (spec and the
    config normlab resolves it to now), it finished (completed or diverged), and its fingerprint (resolved config,
    parameter names/shapes/order, normlab and torch versions; normlab.fingerprint) matches what the current code
    builds. Otherwise a short reason to train it (again)."""
    spec, summ = run_dir / "claims_spec.json", run_dir / "summary.json"
    if not (spec.is_file() and summ.is_file()):
        return "not trained yet" if not run_dir.exists() else "incomplete run directory"
    try:
        if json.loads(spec.read_text()) != spec_record(cfg):
            return "its spec or resolved config changed"
        status = json.loads(summ.read_text()).get("status")
    except (OSError, json.JSONDecodeError):
        return "unreadable claims_spec.json or summary.json"
    if status not in ("completed", "diverged"):
        return f"status {status}"
    from normlab.fingerprint import check_run

    return check_run(run_dir)


def is_complete(run_dir: Path, cfg: dict) -> bool:
    return reuse_reason(run_dir, cfg) is None


def train_job(cfg: dict, run_dir: str, reuse: str | None = None) -> dict:
    """Train one run (fresh directory); top-level so worker processes can pickle it. With ``reuse`` (a sweep
    directory) a finished run of that sweep with exactly this resolved config is copied instead of trained."""
    import torch

    from normlab.config import config_from_dict
    from normlab.train.loop import train

    torch.set_num_threads(1)
    run_dir = Path(run_dir)
    if run_dir.exists():
        shutil.rmtree(run_dir)
    src = find_reusable(Path(reuse), cfg) if reuse else None
    if src is not None:
        shutil.copytree(src, run_dir, ignore=shutil.ignore_patterns("checkpoints"))
        write_json(run_dir / "claims_spec.json", spec_record(cfg))
        s = read_json(run_dir / "summary.json", "summary")
        return {"status": s["status"], "val_bpb": s.get("val_bpb"), "elapsed_s": 0.0, "tokens_per_s": None,
                "reused_from": str(src)}
    run_dir.mkdir(parents=True)
    write_json(run_dir / "claims_spec.json", spec_record(cfg))
    t0 = time.time()
    s = train(config_from_dict(copy.deepcopy(cfg)), run_dir, quiet=True)
    return {"status": s["status"], "val_bpb": s.get("val_bpb"), "elapsed_s": time.time() - t0,
            "tokens_per_s": s.get("tokens_per_s")}


def execute(jobs: list[tuple[str, int, dict, Path]], workers: int, log: Callable[[str], None],
            reuse: Path | None = None, ray: Any = None, out: Path | None = None) -> None:
    """Train ``jobs`` ``(variant, seed, cfg, run_dir)`` with ``workers`` processes (1 = in this process), or as
    Ray tasks when ``ray`` is a connected ``ray`` module (run directories under ``out``); with ``reuse`` (a sweep
    directory) runs it holds are copied (waited for while that sweep trains them), and the jobs it does not hold are
    trained first."""
    if not jobs:
        return
    n = len(jobs)
    rd = str(reuse) if reuse else None
    if reuse is not None:
        jobs = sorted(jobs, key=lambda j: registered_in(reuse, j[2]))

    def done(i: int, job, r: dict) -> None:
        bpb = "n/a" if r.get("val_bpb") is None else f"{r['val_bpb']:.4f}"
        how = f"copied from {r['reused_from']}" if r.get("reused_from") else (
            f"{r['elapsed_s']:.1f} s, {(r.get('tokens_per_s') or 0):,.0f} tok/s")
        log(f"[{i}/{n}] {job[0]} seed {job[1]}: {r['status']}, val bpb {bpb}, {how}")

    if ray is not None:
        from normlab.experiments.executors import run_ray_jobs

        if reuse is not None:  # runs the reused sweep holds are copied here, the rest go to the cluster
            held = [j for j in jobs if registered_in(reuse, j[2])]
            for i, job in enumerate(held, 1):
                done(i, job, train_job(job[2], str(job[3]), rd))
            jobs = [j for j in jobs if j not in held]
        run_ray_jobs(ray, jobs, out, done)
        return

    if workers <= 1:
        for i, job in enumerate(jobs, 1):
            done(i, job, train_job(job[2], str(job[3]), rd))
        return
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor, as_completed

    # deep runs first: the longest jobs start early so the two workers finish together (stable: keeps reuse order)
    order = sorted(jobs, key=lambda j: -j[2]["model"]["depth"]) if reuse is None else jobs
    env_old = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    os.environ.update({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
    try:
        with ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn")) as pool:
            futs = {pool.submit(train_job, j[2], str(j[3]), rd): j for j in order}
            for i, f in enumerate(as_completed(futs), 1):
                done(i, futs[f], f.result())
    finally:
        for k, v in env_old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run_suite(claims: list["Claim"], budget: Budget, out: Path, *, seeds: int | None = None, workers: int = 1,
              log: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True),
              reuse: Path | None = None, executor: str = "local", address: str | None = None) -> dict:
    """Train what is missing, measure every claim per seed, return ``{claims: [...], ...}`` (also written to
    ``OUT/claims.json``)."""
    import torch

    n_seeds = seeds if seeds is not None else budget.seeds
    if n_seeds < 1:
        raise NormlabError(f"--seeds must be >= 1, got {n_seeds}")
    t0 = time.time()
    out.mkdir(parents=True, exist_ok=True)
    needed = sorted({v for c in claims for v in c.variants})
    jobs, reused, retrain = [], 0, {}
    for seed in range(n_seeds):
        for v in needed:
            for lr in (budget.grid_lrs if v in GRID_VARIANTS else (None,)):
                cfg = variant_config(v, budget, seed, lr)
                rd = run_dir_for(out, v, seed, lr)
                why = reuse_reason(rd, cfg)
                if why is None:
                    reused += 1
                else:
                    jobs.append((v if lr is None else f"{v}@lr{lr:g}", seed, cfg, rd))
                    if why != "not trained yet":
                        retrain.setdefault(why, []).append(f"{jobs[-1][0]}/seed{seed}")
    log(f"claims ({budget.name}): {len(claims)} claim(s), {n_seeds} seed(s), {len(jobs)} run(s) to train, "
        f"{reused} reused, {workers} worker(s) -> {out}")
    for why, names in retrain.items():  # say why a finished run is trained again
        log(f"retraining {len(names)} run(s) ({why}): {', '.join(names[:6])}{' ...' if len(names) > 6 else ''}")
    t_train = time.time()
    ray = None
    if executor == "ray" and jobs:
        from normlab.experiments.executors import connect

        ray = connect(address)
    execute(jobs, workers, log, reuse, ray, out)
    train_s = time.time() - t_train
    torch.set_num_threads(1)
    from normlab.experiments.claims.measures import Context, measure

    ctx = Context(budget)
    results = []
    for c in claims:
        base = {"name": c.name, "claim": c.claim, "paper": c.paper, "metric": c.metric, "expected": c.expected}
        t = time.time()
        values, details, runs = [], [], []
        for seed in range(n_seeds):
            rd = {v: run_dir_for(out, v, seed) for v in c.variants}
            val, det = measure(c, ctx, rd)
            values.append(val)
            details.append(det)
            runs.append({v: str(p) for v, p in rd.items()})
        v = verdict(values, c.direction, null=c.null, margin=c.margin, tolerance=c.tolerance)
        results.append({**base, "measured": v["measured"], "ci": v["ci"], "verdict": v["verdict"], "n": v["n"],
                        "reason": v["reason"], "direction": c.direction, "null": c.null, "margin": c.margin,
                        "tolerance": c.tolerance, "values": values, "seeds": list(range(n_seeds)),
                        "details": details, "runs": runs, "measure_s": time.time() - t})
        log(f"{c.name}: {v['verdict']} ({v['reason']})")
    report = {"format": "normlab-claims-v1", "budget": budget.name, "budget_spec": budget.to_dict(),
              "seeds": n_seeds, "out": str(out), "trained_runs": len(jobs), "reused_runs": reused,
              "retrained": {why: names for why, names in retrain.items()},
              "train_s": train_s, "elapsed_s": time.time() - t0, "claims": results}
    save_report(out / "claims.json", report)
    return report


def save_report(path: Path, report: dict) -> dict:
    """Write ``report`` to ``path``, keeping the other claims of an existing file with the same budget and seeds
    (so ``--only`` updates its claims without dropping the rest); returns what was written."""
    merged = dict(report)
    if path.is_file():
        try:
            old = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            old = None
        if old and old.get("budget") == report["budget"] and old.get("seeds") == report["seeds"]:
            new = {c["name"]: c for c in report["claims"]}
            have = {c["name"]: c for c in old.get("claims", [])}
            merged["claims"] = [new.get(n) or have[n] for n in CLAIM_NAMES if n in new or n in have]
            if len(merged["claims"]) > len(report["claims"]):
                merged["partial_update"] = sorted(new)
    write_json(path, merged)
    return merged


# -- reusing a sweep's runs (normlab claims --reuse SWEEP_DIR) -----------------------------------------------------
def _resolved_key(cfg: dict[str, Any]) -> str:
    from normlab.config import config_from_dict

    return json.dumps(config_from_dict(copy.deepcopy(cfg)).to_dict(), sort_keys=True)


def find_reusable(sweep_dir: Path, cfg: dict[str, Any], wait_s: float = 7200.0) -> Path | None:
    """The run directory in ``sweep_dir`` (a ``normlab compare`` directory) trained from exactly the resolved config
    of ``cfg`` that finished (completed or diverged), or None. A matching run that is still pending or running in a
    sweep that is in progress is waited for (polling its store, up to ``wait_s``), so a claims run can share the
    runs of a demo that has not finished yet instead of training them twice."""
    import fcntl

    from normlab.experiments.store import FINAL, Store

    store = Store(sweep_dir / "results.sqlite")
    key = _resolved_key(cfg)
    t0 = time.time()
    while True:
        match = [r for r in store.runs() if _resolved_key(r["config"]) == key]
        if not match:
            return None
        done = [r for r in match if r["status"] in FINAL]
        if done:
            from normlab.fingerprint import check_run

            src = sweep_dir / "runs" / done[0]["run_id"]
            return src if check_run(src) is None else None  # the current code would not reproduce it: train
        try:  # is a compare still running in that directory?
            with open(sweep_dir / ".compare.lock", "a+") as f:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                fcntl.flock(f, fcntl.LOCK_UN)
            return None  # nobody is training it: the caller trains
        except OSError:
            pass
        if time.time() - t0 > wait_s:
            return None
        time.sleep(10)


def registered_in(sweep_dir: Path, cfg: dict[str, Any]) -> bool:
    """Whether ``sweep_dir``'s store has a run (any status) with the resolved config of ``cfg``."""
    from normlab.experiments.store import Store

    key = _resolved_key(cfg)
    return any(_resolved_key(r["config"]) == key for r in Store(sweep_dir / "results.sqlite").runs())
