"""Running the claims suite: its runs are one sweep trained by ``normlab.experiments.sweepdir`` (the runner of
``normlab compare``: results store, resume, Ctrl-C, worker logs, live TensorBoard, the Ray executor), then every
claim is measured per seed from the run directories and ``claims.json`` is written.

``OUT`` is a sweep directory::

    OUT/results.sqlite, OUT/sweep.yaml     the store of the sweep ``claims-<budget>`` (its identity: the budget name)
    OUT/runs/<run id>/                     one run; run id = <variant>-s<seed>[-lr<lr>]-<resolved config hash[:8]>
    OUT/logs/<run id>.log, OUT/tb/<run id>/   the trainer's output and TensorBoard scalars
    OUT/claims.json                        the measurements and verdicts

- ``--only`` and ``--seeds`` add runs to the same store; a re-run trains only what is missing.
- A run's id holds the hash of the full config normlab resolves its spec to, so a changed spec or library default
  is a new run that is trained, never a finished one silently reused; the log and ``claims.json`` ``retrained``
  say "its spec or resolved config changed". A finished run whose ``fingerprint.json`` (normlab.rundir.fingerprint) does
  not match what the current code builds is moved to ``OUT/stale/`` and trained again (the runner does it), and
  ``retrained`` names the reason.
- Runs of the layout before this one (``OUT/runs/<variant>/seed<k>[/lr<lr>]`` with ``claims_spec.json``) that
  match their spec, finished and match their fingerprint are moved to ``OUT/runs/<run id>`` and reused.
- ``--reuse SWEEP_DIR`` copies finished runs of another sweep (e.g. the demo's) trained from exactly the same
  resolved config instead of training them; runs that sweep is still training are waited for, after the runs it
  does not hold have trained.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime
import json
import shutil
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import torch

from normlab.config import planned_config
from normlab.errors import EXIT_INTERRUPTED, NormlabError
from normlab.experiments.claims.budgets import Budget
from normlab.experiments.claims.docs import claim_scale
from normlab.experiments.claims.measures import Context, measure
from normlab.experiments.claims.measures_lr import sens_from_details
from normlab.experiments.claims.specs import CLAIM_NAMES, CLAIMS, TESTS, claim_seeds, confirms, spec_hash
from normlab.decide.verdicts import SIGNIFICANCE_TESTS, judge_family
from normlab.decide.verdicts import claim_verdict as verdict
from normlab.experiments.worker import finished_summary
from normlab.experiments.worker import record as record_run
from normlab.experiments.claims.variants import GRID_VARIANTS, lr_dir, variant_config
from normlab.experiments.entry import run as run_sweep
from normlab.experiments.estimate import check_device
from normlab.experiments.sweepdir import COMPARE_LOCK, check_sweep_dir, registration
from normlab.experiments.store import FINAL, Store
from normlab.experiments.sweep import Sweep, PlannedRun
from normlab.io import read_json, read_json_object, write_json
from normlab.locks import lock_taken
from normlab.rundir.files import CHECKPOINTS_DIR, FINGERPRINT_FILE, SUMMARY_FILE
from normlab.rundir.fingerprint import check_run
from normlab.rundir.readers import read_summary

if TYPE_CHECKING:
    from normlab.experiments.claims.specs import Claim

CHANGED = "its spec or resolved config changed"


class SuiteStopped(Exception):
    """The runs did not all finish (interrupted, or some failed): nothing was measured. ``exit_code``: 130 when
    interrupted, 1 when a run failed."""

    def __init__(self, message: str, exit_code: int, out: Path, failed: list[str] | None = None):
        super().__init__(message)
        self.exit_code, self.out, self.failed = exit_code, out, failed or []


def run_id(variant: str, seed: int, lr: float | None, config_hash: str) -> str:
    """``<variant>-s<seed>[-lr<lr>]-<config hash[:8]>``."""
    return f"{variant}-s{seed}{'' if lr is None else f'-lr{lr:g}'}-{config_hash[:8]}"


def run_label(r: "PlannedRun") -> str:
    """``variant[@lr<lr>]/seed<k>``: how the log and ``claims.json`` ``retrained`` name a run."""
    lr = r.axes.get("train.lr")
    return f"{r.variant}{'' if lr is None else f'@lr{lr:g}'}/seed{r.seed}"


def claims_sweep(budget: Budget, variants: list[str], n_seeds: int) -> "Sweep":
    """The sweep ``claims-<budget>`` of ``variants`` x seeds (x the grid's learning rates for a grid variant), deep
    models first (the longest runs start early, so parallel workers finish together). Its hash depends on the
    budget's name only, so every ``--only`` / ``--seeds`` selection shares one store."""
    runs = []
    for seed in budget.seed_list(n_seeds):
        for v in variants:
            for lr in (budget.grid_lrs if v in GRID_VARIANTS else (None,)):
                rc = planned_config(variant_config(v, budget, seed, lr))
                axes = {"variant": v} if lr is None else {"variant": v, "train.lr": lr, "grid_group": v}
                h = rc.hash()
                runs.append(PlannedRun(run_id(v, seed, lr, h), v, seed, axes, {}, rc.to_dict(), h))
    runs.sort(key=lambda r: -r.config["model"]["depth"])
    name = f"claims-{budget.name}"
    return Sweep(name, {"name": name, "claims_budget": budget.name}, runs, list(variants),
                 f"normlab claims --budget {budget.name}",
                 rerun=f"normlab claims --budget {budget.name} --out <its folder>")


def seed_runs(sweep: "Sweep", out: Path, seed: int, variants: tuple[str, ...]) -> dict[str, Any]:
    """One seed's run directories of ``variants``: variant -> run directory, or for a grid variant lr -> run
    directory (what a measurement gets)."""
    got: dict[str, Any] = {}
    for r in sweep.runs:
        if r.seed != seed or r.variant not in variants:
            continue
        lr = r.axes.get("train.lr")
        if lr is None:
            got[r.variant] = out / "runs" / r.run_id
        else:
            got.setdefault(r.variant, {})[lr] = out / "runs" / r.run_id
    return {v: got[v] for v in variants}


def _as_json(runs: dict[str, Any], out: Path) -> dict[str, Any]:
    """Variant -> run directory (or lr -> run directory for a grid variant), each relative to the claims directory
    ``out`` (``runs/<run id>``): the stored results name no path of the machine that made them."""
    def rel(p: Path) -> str:
        return Path(p).relative_to(out).as_posix()

    return {v: ({f"{lr:g}": rel(p) for lr, p in sorted(d.items())} if isinstance(d, dict) else rel(d))
            for v, d in runs.items()}


# -- the output directory ---------------------------------------------------------------------------------------
def open_out(out: Path, sweep: "Sweep") -> None:
    """Make ``out`` this budget's claims sweep directory (an existing one is resumed); refuse a file, another
    sweep's directory, or a non-empty directory that holds no claims results."""
    if out.exists() and not out.is_dir():
        raise NormlabError(f"--out {out} is a file; give a directory")
    if (out / "results.sqlite").is_file():
        check_sweep_dir(sweep, out)
        return
    if out.is_dir() and any(out.iterdir()) and not ((out / "claims.json").is_file() or (out / "runs").is_dir()):
        raise NormlabError(f"--out {out} exists and holds neither claims results nor a sweep; choose another --out")
    try:
        out.mkdir(parents=True, exist_ok=True)
        Store(out / "results.sqlite").create(sweep.name, sweep.hash)
    except OSError as e:
        raise NormlabError(f"cannot write --out {out}: {e.strerror or e}") from None


def spec_record(cfg: dict) -> dict:
    """What an old-layout run's ``claims_spec.json`` holds: its spec and the full config it resolved to."""
    record = {"spec": cfg, "resolved": planned_config(copy.deepcopy(cfg)).to_dict()}
    return json.loads(json.dumps(record))  # as it reads back from disk (tuples -> lists)


def old_reuse_reason(run_dir: Path, cfg: dict) -> str | None:
    """None when the old-layout run in ``run_dir`` can be reused for ``cfg``: its ``claims_spec.json`` matches
    (spec and resolved config), it finished (completed or diverged), and its fingerprint matches what the current
    code builds; otherwise why not."""
    spec, summ = run_dir / "claims_spec.json", run_dir / SUMMARY_FILE
    if not (spec.is_file() and summ.is_file()):
        return "incomplete run directory"
    try:  # regular files under the size cap; a summary of the wrong shape or types is unreadable too
        if read_json(spec, "claims spec") != spec_record(cfg):
            return CHANGED
        status = (read_summary(run_dir) or {}).get("status")
    except NormlabError:
        return "unreadable claims_spec.json or summary.json"
    if status not in ("completed", "diverged"):
        return f"status {status}"
    return check_run(run_dir)


def migrate_old_layout(out: Path, sweep: "Sweep", specs: dict[str, dict], log: Callable[[str], None]) -> int:
    """Move reusable runs of the old layout (``OUT/runs/<variant>/seed<k>[/lr<lr>]``) to ``OUT/runs/<run id>``;
    returns how many. ``specs``: run id -> the spec dict it was trained from. Runs that cannot be reused stay
    where they are (the log says why)."""
    moved, kept = [], {}
    for r in sweep.runs:
        old = out / "runs" / r.variant / f"seed{r.seed}"
        lr = r.axes.get("train.lr")
        old = old if lr is None else lr_dir(old, lr)
        new = out / "runs" / r.run_id
        if new.exists() or not (old / "claims_spec.json").is_file():
            continue
        why = old_reuse_reason(old, specs[r.run_id])
        if why is None:
            old.rename(new)
            (new / "claims_spec.json").unlink()
            moved.append(r.run_id)
            for parent in old.parents:  # the emptied seed<k> and <variant> folders go
                if parent == out / "runs" or any(parent.iterdir()):
                    break
                parent.rmdir()
        else:
            kept.setdefault(why, []).append(run_label(r))
    if moved:
        record_finished(out, sweep, moved)
        log(f"moved {len(moved)} finished run(s) of the old layout (runs/<variant>/seed<k>) to runs/<run id>")
    for why, names in kept.items():
        log(f"not reusing {len(names)} old-layout run(s) ({why}): {_names(names)}")
    return len(moved)


def record_finished(out: Path, sweep: "Sweep", run_ids: list[str]) -> None:
    """Register ``sweep``'s runs in the store and record the finished runs ``run_ids`` already in ``OUT/runs`` (moved
    or copied there) as the sweep worker does for a run it need not train, without starting a process for each."""
    store = Store(out / "results.sqlite")
    store.register(registration(sweep))
    for rid in run_ids:
        summary = finished_summary(out / "runs" / rid)
        if summary is not None:
            store.start(rid, calls_trainer=False)
            record_run(store, out, rid, summary, peak_mem_mb=None)


def _names(names: list[str]) -> str:
    return ", ".join(names[:6]) + (" ..." if len(names) > 6 else "")


def why_retrain(out: Path, sweep: "Sweep") -> dict[str, list[str]]:
    """Why finished runs will be trained again: reason -> run labels. A stored finished run of the same variant,
    seed and learning rate under another run id (its spec or resolved config changed), or a run of this sweep whose
    fingerprint no longer matches (the runner moves it to ``OUT/stale/`` and trains it again)."""
    rows = {r["run_id"]: r for r in Store(out / "results.sqlite").runs()}
    ids = {r.run_id for r in sweep.runs}
    old = {(r["variant"], r["seed"], (r["axes"] or {}).get("train.lr")) for r in rows.values()
           if r["status"] in FINAL and r["run_id"] not in ids}
    out_why: dict[str, list[str]] = {}
    for r in sweep.runs:
        row, rd = rows.get(r.run_id), out / "runs" / r.run_id
        if row is not None and row["status"] in FINAL:
            why = check_run(rd) if (rd / FINGERPRINT_FILE).is_file() else None
        elif (r.variant, r.seed, r.axes.get("train.lr")) in old:
            why = CHANGED
        else:
            why = None
        if why is not None:
            out_why.setdefault(why, []).append(run_label(r))
    return out_why


# -- training ---------------------------------------------------------------------------------------------------
def train_runs(sweep: "Sweep", out: Path, *, workers: int | None, log: Callable[[str], None],
               reuse: Path | None = None, executor: str = "local", address: str | None = None) -> str:
    """Train the unfinished runs of ``sweep`` in ``out`` with one torch thread each (``normlab.experiments.run``;
    with one local worker, in this process); with ``reuse``
    the runs that sweep holds are copied (waited for while it trains them) after the others trained. Returns the
    runner's status (``completed`` or ``interrupted``)."""
    if executor == "local" and workers == 1:  # tiny runs: no process start-up per run
        executor = "inline"

    def go(s: "Sweep") -> str:
        return run_sweep(s, out, executor=executor, workers=workers, log=log, address=address, threads=1).status

    if reuse is None:
        return go(sweep)
    theirs = {_resolved_key(r["config"]) for r in Store(reuse / "results.sqlite").runs()}
    held = [r for r in sweep.runs if _resolved_key(r.config) in theirs and not _finished(out / "runs" / r.run_id)]
    if not held:
        return go(sweep)
    first = [r for r in sweep.runs if r not in held]
    record_finished(out, sweep, [])  # every run's store row (its position in the whole sweep) before a part trains
    if first and go(dataclasses.replace(sweep, runs=first)) == "interrupted":
        return "interrupted"
    copied = []
    for r in held:
        src = find_reusable(reuse, r.config)
        if src is not None:
            _copy_run(src, out / "runs" / r.run_id)
            copied.append(r.run_id)
    record_finished(out, sweep, copied)
    log(f"copied {len(copied)} of {len(held)} run(s) from {reuse}"
        + ("; the others are trained here" if len(copied) < len(held) else ""))
    return go(sweep)


def _finished(run_dir: Path) -> bool:
    return finished_summary(run_dir) is not None


def _copy_run(src: Path, dest: Path) -> None:
    """Copy a finished run (without its checkpoints) to ``dest``: into a temporary sibling, then renamed."""
    tmp = dest.parent / f".{dest.name}.copy"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.rmtree(dest, ignore_errors=True)
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(src, tmp, ignore=shutil.ignore_patterns(CHECKPOINTS_DIR))
    tmp.rename(dest)


# -- the suite --------------------------------------------------------------------------------------------------
def run_suite(claims: list["Claim"], budget: Budget, out: Path, *, seeds: int | None = None,
              workers: int | None = 1, log: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True),
              reuse: Path | None = None, executor: str = "local", address: str | None = None,
              progress: Callable[[str], None] | None = None) -> dict:
    """Train what is missing, measure every claim per seed, return ``{claims: [...], ...}`` (also written to
    ``OUT/claims.json``). Raises ``SuiteStopped`` (nothing measured) when the runs did not all finish.
    ``progress``: called with each claim's name as its measurement starts (``normlab claims`` draws a bar)."""
    if seeds is not None and seeds < 1:
        raise NormlabError(f"--seeds must be >= 1, got {seeds}")
    # a claim pre-registered with its own seed count (Claim.seeds) gets it unless --seeds overrides every claim
    per_claim = {c.name: seeds if seeds is not None else (c.seeds or budget.seeds) for c in claims}
    n_seeds = max(per_claim.values(), default=budget.seeds)
    t0 = time.time()
    needed = sorted({v for c in claims for v in c.variants})
    sweep = claims_sweep(budget, needed, n_seeds)
    if executor == "local":  # a budget whose runs ask for cuda, on a machine without: one line, its estimated time
        check_device(sweep.name, [r.config for r in sweep.runs])
    open_out(out, sweep)
    specs = {r.run_id: variant_config(r.variant, budget, r.seed, r.axes.get("train.lr")) for r in sweep.runs}
    migrate_old_layout(out, sweep, specs, log)
    retrain = why_retrain(out, sweep)
    store = Store(out / "results.sqlite")
    calls = {r["run_id"]: r["train_calls"] for r in store.runs()}
    log(f"claims ({budget.name}): {len(claims)} claim(s), {n_seeds} seed(s), {len(sweep.runs)} run(s) -> {out}")
    for why, names in retrain.items():  # say why a finished run is trained again
        log(f"retraining {len(names)} run(s) ({why}): {_names(names)}")
    t_train = time.time()
    status = train_runs(sweep, out, workers=workers, log=log, reuse=reuse, executor=executor, address=address)
    train_s = time.time() - t_train
    rows = {r["run_id"]: r for r in store.runs()}
    if status == "interrupted":
        raise SuiteStopped(f"interrupted; finished runs are kept in {out}. Re-run the same command to resume.",
                           EXIT_INTERRUPTED, out)
    failed = [r.run_id for r in sweep.runs if rows[r.run_id]["status"] not in FINAL]
    if failed:
        raise SuiteStopped(f"{len(failed)} run(s) did not finish ({_names(failed)}); see {out / 'logs'}; re-run the "
                           "same command to retry them", 1, out, failed)
    trained = sum(rows[r.run_id]["train_calls"] > calls.get(r.run_id, 0) for r in sweep.runs)
    torch.set_num_threads(1)
    ctx = Context(budget)
    results = []
    for c in claims:
        if progress is not None:
            progress(c.name)
        base = {"name": c.name, "claim": c.claim, "paper": c.paper, "metric": c.metric, "expected": c.expected}
        t = time.time()
        values, details, runs = [], [], []
        for seed in budget.seed_list(per_claim[c.name]):
            rd = seed_runs(sweep, out, seed, c.variants)
            val, det = measure(c, ctx, rd)
            values.append(val)
            details.append(det)
            runs.append(_as_json(rd, out))
        v = verdict(values, c.direction, null=c.null, margin=c.margin, tolerance=c.tolerance)
        results.append({**base, "measured": v["measured"], "ci": v["ci"], "verdict": v["verdict"], "n": v["n"],
                        "reason": v["reason"], "direction": c.direction, "null": c.null, "margin": c.margin,
                        "tolerance": c.tolerance, "values": values, "seeds": budget.seed_list(per_claim[c.name]),
                        "details": details, "runs": runs, "scale": claim_scale({"runs": runs}, out),
                        "measure_s": time.time() - t, **spec_fields(c)})
        log(f"{c.name}: measured ({v['reason']}; the verdict is judged with the family)")
    report = {"format": "normlab-claims-v1", "budget": budget.name, "budget_spec": budget.to_dict(),
              "seeds": n_seeds, "out": str(out), "trained_runs": trained, "reused_runs": len(sweep.runs) - trained,
              "retrained": retrain, "train_s": train_s, "elapsed_s": time.time() - t0, "claims": results,
              "finished_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M")}
    return save_report(out / "claims.json", report)


def save_report(path: Path, report: dict) -> dict:
    """Write ``report`` to ``path``, keeping the other claims of an existing file with the same budget and seeds
    (so ``--only`` updates its claims without dropping the rest); returns what was written."""
    merged = dict(report)
    if path.is_file() and not report.get("rendered_from"):
        try:
            old = read_json_object(path, "claims results")  # a regular file under the size cap, a JSON object
        except NormlabError:
            old = None
        if old and old.get("budget") == report["budget"] and old.get("seeds") == report["seeds"]:
            new = {c["name"]: c for c in report["claims"]}
            have = {c["name"]: c for c in old.get("claims", [])}
            merged["claims"] = [new.get(n) or have[n] for n in CLAIM_NAMES if n in new or n in have]
            if len(merged["claims"]) > len(report["claims"]):
                merged["partial_update"] = sorted(new)
    merged = judge(merged)
    write_json(path, merged)
    return merged


def spec_fields(c: "Claim") -> dict[str, Any]:
    """What a claim's result records of its pre-registered spec (so a stored result can be judged later, and a
    result measured under an earlier definition is recognised by its hash)."""
    return {"spec_hash": spec_hash(c), "test": c.test, "practical_margin": c.practical_margin,
            "observable": c.observable, "must_learn": list(c.must_learn), "args": list(c.args),
            "spec_seeds": c.seeds,
            "revised": [r.to_dict() for r in c.revised], "beside": list(c.beside)}


def report_unigram(report: dict) -> float | None:
    """The unigram bits/byte of the report's training split, from any claim's details that record it (every claim of
    one report trains on the same corpus and split, so it is one number); None if none does."""
    for c in report.get("claims") or []:
        for d in c.get("details") or []:
            if isinstance(d, dict) and isinstance(d.get("unigram_bpb"), (int, float)):
                return float(d["unigram_bpb"])
    return None


def remeasured(c: dict, spec: Any) -> dict:
    """A stored LR-sensitivity claim's values recomputed from its per-learning-rate losses under the current
    definition (normlab.experiments.lrgrid.lr_sensitivity: a collapsed run scores L_init, as a diverged one);
    where that changes them, the stored ones are kept as ``values_before`` with the reason, so the verdict is
    judged on the values the current metric gives (a measure redefined after a verdict: docs/claims.md)."""
    if spec is None or spec.measure != "sens_diff" or len(spec.args) < 2:
        return c
    new, notes = [], set()
    for v, d in zip(c["values"], c.get("details") or []):
        x, note = sens_from_details(d, *spec.args[:2]) if isinstance(d, dict) else (None, "no details")
        if x is None:
            return c
        new.append(x)
        if note:
            notes.add(note)
    if len(new) != len(c["values"]) or all(isinstance(a, (int, float)) and abs(a - b) < 1e-12
                                           for a, b in zip(c["values"], new)):
        return c
    raw = verdict(new, c["direction"], null=c.get("null", 0.0), margin=c.get("margin"), tolerance=c.get("tolerance"))
    return {**c, "values": new, "values_before": c.get("values_before", c["values"]),
            "measured_before": c.get("measured_before", c.get("measured")), "measured": raw["measured"],
            "ci": raw["ci"], "n": raw["n"],
            "remeasured": "LR sensitivity with collapsed runs scored at L_init, as diverged ones"
                          + (f"; {'; '.join(sorted(notes))}" if notes else "")}


def judge(report: dict, correction: str = "holm") -> dict:
    """``report`` with every claim's final verdict judged over the family of its claims (normlab.decide.verdicts
    .judge_family: Holm over the claims with a significance test, practical margins, observability,
    collapse rates). A stored claim without spec fields (measured before they were recorded) is judged with the
    test its direction implies and no margin; its ``spec_hash`` stays missing, so it reads as measured under an
    earlier definition."""
    specs = {s.name: s for s in CLAIMS}
    unigram = report_unigram(report)
    report = {**report, "claims": [remeasured(c, specs.get(c["name"])) for c in report["claims"]]}
    entries = []
    for c in report["claims"]:
        observable = c.get("observable") or ""
        must_learn = list(c.get("must_learn") or [])
        spec = specs.get(c["name"])
        details = [d for d in c.get("details") or [] if isinstance(d, dict)]
        if spec is not None and spec.observable and any(spec.observable in d for d in details):
            observable = spec.observable  # a current observability rule reads stored details only: it applies
        elif spec is not None and not spec.observable:
            observable = ""  # a rule the current definition replaced (by at_init) is not applied
        if spec is not None and spec.must_learn and all(k in d for d in details for k in spec.must_learn):
            must_learn = list(spec.must_learn)  # and the did-not-learn rule (not observable, p = 1 in the family)
        test = c.get("test") if c.get("test") in TESTS else {"exact": "exact", "within": "equivalence"}.get(
            c["direction"], "t")
        entries.append({"values": c["values"], "details": c.get("details") or [], "direction": c["direction"],
                        "null": c.get("null", 0.0), "margin": c.get("margin"), "tolerance": c.get("tolerance"),
                        "test": test, "practical_margin": c.get("practical_margin"),
                        "observable": observable, "args": c.get("args") or [], "must_learn": must_learn,
                        "at_init": spec.at_init if spec is not None else "",
                        "learn_unit": spec.learn_unit if spec is not None else "bits/byte",
                        "unigram_bpb": next((d["unigram_bpb"] for d in details if "unigram_bpb" in d), unigram)})
    judged = judge_family(entries, correction)
    current = {c.name: spec_hash(c) for c in CLAIMS}
    out = dict(report)
    out["claims"] = []
    for c, j in zip(report["claims"], judged):
        if report.get("rendered_from") and c.get("verdict") not in (None, j["verdict"]):
            j = {**j, "verdict_stored": c.get("verdict_stored", c["verdict"])}  # what the stored file said
        c = {**c, **j}
        spec = specs.get(c["name"])
        details = [d for d in c.get("details") or [] if isinstance(d, dict)]
        if spec is not None and spec.beside and details and all(k in d for d in details for k in spec.beside):
            c["beside"] = list(spec.beside)  # the current definition's at-init values, where stored
        c["current_definition"] = c.get("spec_hash") is not None and current.get(c["name"]) == c.get("spec_hash")
        # a definition revised after results on any of the seeds it is judged on is exploratory there (runs that
        # shaped a design cannot confirm it), whatever its p; on a seed block no revision saw, confirmatory
        c["exploratory"] = spec is not None and not confirms(spec.revised, claim_seeds(report, c))
        out["claims"].append(c)
    out["correction"] = correction
    # untestable members count as p = 1; the family holds every significance test and every TOST of a margin
    out["family_size"] = sum(e["test"] in SIGNIFICANCE_TESTS for e in entries) + sum(
        j.get("tost") is not None for j in judged)
    return out


# -- reusing a sweep's runs (normlab claims --reuse SWEEP_DIR) -----------------------------------------------------
NOT_RESULTS = ("threads", "track")
"""``train`` keys that change no number of a run (how many threads trained it, where its curves were logged): a
sweep's workers set their own thread count, so two configs that differ only here are the same run."""


def _resolved_key(cfg: dict[str, Any]) -> str:
    d = planned_config(copy.deepcopy(cfg)).to_dict()
    d["train"] = {k: v for k, v in d["train"].items() if k not in NOT_RESULTS}
    return json.dumps(d, sort_keys=True)


def find_reusable(sweep_dir: Path, cfg: dict[str, Any], wait_s: float = 7200.0) -> Path | None:
    """The run directory in ``sweep_dir`` (a ``normlab compare`` directory) trained from exactly the resolved config
    of ``cfg`` that finished (completed or diverged), or None. A matching run that is still pending or running in a
    sweep that is in progress is waited for (polling its store, up to ``wait_s``), so a claims run can share the
    runs of a demo that has not finished yet instead of training them twice."""
    store = Store(sweep_dir / "results.sqlite")
    key = _resolved_key(cfg)
    t0 = time.time()
    while True:
        match = [r for r in store.runs() if _resolved_key(r["config"]) == key]
        if not match:
            return None
        done = [r for r in match if r["status"] in FINAL]
        if done:
            src = sweep_dir / "runs" / done[0]["run_id"]
            return src if check_run(src) is None else None  # the current code would not reproduce it: train
        if not lock_taken(sweep_dir / COMPARE_LOCK):  # no compare still running in that directory
            return None  # nobody is training it: the caller trains
        if time.time() - t0 > wait_s:
            return None
        time.sleep(10)
