"""Seeds until decided: run a sweep's sequential plan in rounds, a look after each, through the sweep runner.

Round ``k`` trains the runs of the first ``looks[k]`` seeds of the plan (normlab.decide.plan) with
``run_sweep`` on the same sweep directory, so the store, resume, Ctrl-C and the Ray executor behave as for any
sweep: an interrupted round is resumed by re-running the same command, which recomputes the earlier looks from
the stored runs (the decision at a look depends only on its seeds, so it is the same every time). After each round
``look_record(sweep_dir, k)`` (normlab.experiments.looks: the stored per-seed values, decided by normlab.decide.looks)
returns the look's record; the loop stops when it says every primary comparison is decided, at the plan's
cap, or before a round that the time budget cannot fit (estimated as the longest round so far). The plan is
written to the store's meta (``sequential_plan``) before the first run, and the looks (``sequential``) after each.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from normlab.errors import NormlabError
from normlab.decide.plan import LOOKS_META, PLAN_META
from normlab.experiments.sweepdir import SweepOutcome, check_sweep_dir, run_sweep
from normlab.experiments.looks import look_record
from normlab.experiments.store import Store
from normlab.experiments.sweep import Sweep


@dataclass
class SequentialOutcome:
    """What ``run_until_decided`` did: the last round's runner outcome, the looks' records, why it stopped
    (``decided``; ``undecidable``: what is not decided cannot be, a model did not learn; ``max_seeds``, ``budget``,
    ``interrupted`` or ``failed``) and the seeds spent."""

    outcome: SweepOutcome
    looks: list[dict[str, Any]] = field(default_factory=list)
    stopped: str = ""
    seeds_spent: int = 0
    trained: list[str] = field(default_factory=list)


def round_sweep(sweep: Sweep, n_seeds: int) -> Sweep:
    """The runs of the plan's first ``n_seeds`` seeds (same spec, so the same hash and run ids as the full plan)."""
    keep = set(sweep.resolved.seeds[:n_seeds])
    return dataclasses.replace(sweep, runs=[r for r in sweep.runs if r.seed in keep])


def store_plan(sweep: Sweep, sweep_dir: Path) -> None:
    """Write the plan into the store before anything runs (idempotent; a different stored plan is an error: the
    sweep hash already covers the plan, so this only guards a store written by hand)."""
    looks = sweep.resolved.looks
    if looks is None:
        raise NormlabError(f"sweep '{sweep.name}' has no sequential plan")
    existing = check_sweep_dir(sweep, sweep_dir)
    q = sweep.question  # normlab.decide.question: the declared primary, alpha (baseline: as written)
    if q is None:
        raise NormlabError(f"sweep '{sweep.name}' has no declared question; a sequential plan decides one")
    plan = {"looks": looks, "seeds": sweep.resolved.seeds, "alpha": q.alpha,
            "primary": q.primary if q.declared else None, "baseline": sweep.resolved.baseline}
    store = existing or Store(sweep_dir / "results.sqlite")
    if existing is None:
        sweep_dir.mkdir(parents=True, exist_ok=True)
        store.create(sweep.name, sweep.hash)
    old = store.meta().get(PLAN_META)
    if old is not None and json.loads(old) != plan:
        raise NormlabError(f"{sweep_dir} holds another sequential plan ({old}); use --out NEW_DIR")
    if old is None:
        store.set_meta(PLAN_META, json.dumps(plan, sort_keys=True))


def run_until_decided(sweep: Sweep, sweep_dir: Path, *, budget_s: float | None = None,
                      log: Callable[[str], None] | None = None, **run_kwargs: Any) -> SequentialOutcome:
    """Run ``sweep``'s sequential plan in rounds (module docstring): after each round the look's record
    (``look_record``: ``decided`` when nothing is left to decide); ``run_kwargs`` go to ``run_sweep`` (workers,
    executor, address, threads, inline)."""
    log = log or (lambda s: print(s, file=sys.stderr, flush=True))
    looks = sweep.resolved.looks
    if looks is None:
        raise NormlabError(f"sweep '{sweep.name}' has no sequential plan; add sequential: or use --until-decided")
    store_plan(sweep, sweep_dir)
    store = Store(sweep_dir / "results.sqlite")
    t0 = time.time()
    longest = 0.0
    result = SequentialOutcome(SweepOutcome(sweep_dir, "completed"))
    for k, n in enumerate(looks):
        if k and budget_s is not None and (time.time() - t0) + longest > budget_s:
            result.stopped = "budget"
            log(f"sequential: stopping before look {k + 1} ({n} seeds): the time budget ({budget_s:.0f}s) cannot fit "
                f"another round (the longest so far took {longest:.0f}s)")
            break
        t_round = time.time()
        log(f"sequential: round {k + 1}/{len(looks)}: seeds {sweep.resolved.seeds[:n]}")
        outcome = run_sweep(round_sweep(sweep, n), sweep_dir, log=log, **run_kwargs)
        longest = max(longest, time.time() - t_round) if outcome.trained else longest
        result.outcome = outcome
        result.trained += outcome.trained
        result.seeds_spent = n
        if outcome.status == "interrupted":
            result.stopped = "interrupted"
            break
        if any(r["status"] not in ("completed", "diverged") for r in outcome.runs):
            result.stopped = "failed"
            break
        look = look_record(sweep_dir, k)
        result.looks.append(look)
        store.set_meta(LOOKS_META, json.dumps({"looks": result.looks, "stopped": "", "seeds_spent": n}, default=float))
        if look.get("decided"):  # nothing left to decide: "undecidable" where a comparison is open because a model
            # did not learn (more seeds cannot undo that), "decided" where every comparison crossed its boundary
            result.stopped = ("decided" if all(c.get("decided_at_look") is not None for c in look["comparisons"])
                              else "undecidable")
            break
    else:
        result.stopped = "max_seeds"
    store.set_meta(LOOKS_META, json.dumps({"looks": result.looks, "stopped": result.stopped,
                                           "seeds_spent": result.seeds_spent}, default=float))
    result.outcome.wall_s = time.time() - t0
    return result
