"""The one entry to run an experiment: ``run(sweep, out, executor=...)``, for the CLI (``normlab compare``,
``normlab claims``), the Python API (``normlab.compare``) and the claims suite.

A sweep without a sequential plan runs once (``normlab.experiments.sweepdir.run_sweep``: store, resume, stacked groups,
then the runs alone on the executor); one with a plan (``sequential:`` in the sweep file, or ``--until-decided``) runs
in rounds, a look after each, until every primary comparison is decided (``normlab.experiments.sequential
.run_until_decided``). Every round and every executor goes through the one scheduling loop
(``normlab.experiments.scheduling.drive``) and its one signal handler (``normlab.interrupt``).

    >>> from normlab.experiments.entry import run            # doctest: +SKIP
    >>> outcome = run(load_sweep(preset="quick"), Path("runs/quick"), executor="local")
    >>> outcome.status, outcome.counts()
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from normlab.errors import NormlabError
from normlab.experiments.executors import EXECUTORS
from normlab.experiments.sweepdir import SweepOutcome, run_sweep
from normlab.experiments.sequential import run_until_decided
from normlab.experiments.sweep import Sweep

EXECUTOR_NAMES = ("inline", *EXECUTORS)  # inline: the runs one after another in this process


def run(sweep: Sweep, out: Path, *, executor: str = "local", workers: int | None = None, threads: int | None = None,
        address: str | None = None, stack: str | None = None, log: Callable[[str], None] | None = None,
        budget_s: float | None = None) -> SweepOutcome:
    """Run ``sweep`` into the sweep directory ``out``, once or in rounds (module docstring); returns the outcome
    (with a plan: the last round's, ``trained`` over every round, ``until_decided`` = why it stopped, the seeds
    spent, the number of looks). ``executor``: ``local`` worker processes, ``inline`` (this process, one worker),
    or ``ray`` tasks on the cluster at ``address``; with a plan, each look is decided by normlab.decide.looks on
    the stored per-seed values (normlab.experiments.looks). ``budget_s``: start no round that would end past it."""
    if executor not in EXECUTOR_NAMES:
        raise NormlabError(f"executor must be one of {', '.join(EXECUTOR_NAMES)}, got '{executor}'")
    kw: dict[str, Any] = {"workers": workers, "threads": threads, "address": address, "stack": stack, "log": log,
                          "executor": "local" if executor == "inline" else executor, "inline": executor == "inline"}
    if sweep.resolved.looks is None:
        return run_sweep(sweep, out, **kw)
    res = run_until_decided(sweep, out, budget_s=budget_s, **kw)
    outcome = res.outcome
    outcome.trained = res.trained
    if res.stopped == "interrupted":
        outcome.status = "interrupted"
    outcome.until_decided = {"stopped": res.stopped, "seeds_spent": res.seeds_spent, "looks": len(res.looks)}
    return outcome
