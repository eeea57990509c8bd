"""The per-seed values a sweep's declared question is decided on, read from its stored runs, and the look of a
sequential plan the experiment loop asks for after each round (``look_record``); the decision itself is made by
normlab.decide.looks, so the loop (normlab.experiments.sequential) needs nothing from the report.

Per-seed values of the primary metric come from the learning-rate analysis (normlab.experiments.lrgrid, the same
numbers as the report's tables): ``lr_sensitivity`` is a seed's LR sensitivity over the grid, ``best_loss`` its
best final loss over the grid, ``final_loss`` its final loss (on a grid: at its best learning rate). The learned
flags are each seed's at its best learning rate (the unigram level its runs recorded).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from normlab.decide.looks import Learned, Values, look
from normlab.decide.question import Question, stored_question
from normlab.errors import NormlabError
from normlab.experiments.lrgrid import GridReport, SeedGrid, analyze, grid_runs_from_rows
from normlab.experiments.store import Store
from normlab.experiments.sweepspec import SweepSpec, stored_sweep
from normlab.rundir.readers import read_summary

METRIC_OF: dict[str, Callable[[SeedGrid], float]] = {
    "lr_sensitivity": lambda s: s.sensitivity,
    "best_loss": lambda s: s.best,
    "final_loss": lambda s: s.best,
}


def primary_values(grid: GridReport, primary: str) -> Values:
    """``{variant: {seed: value of the primary metric}}`` from the grid analysis."""
    get = METRIC_OF[primary]
    return {g.name: {s.seed: float(get(s)) for s in g.seeds} for g in grid.groups}


def learned_flags(grid: GridReport) -> Learned:
    """``{variant: {seed: learned at its best learning rate}}`` (normlab.decide.guard; None: no unigram level)."""
    return {g.name: {s.seed: s.learned for s in g.seeds} for g in grid.groups}


def stored_spec(sweep_dir: Path) -> SweepSpec:
    """The stored sweep spec (``SWEEP_DIR/sweep.yaml``) typed, the empty spec when absent or unreadable."""
    return stored_sweep(sweep_dir) or SweepSpec()


def stored_grid(sweep_dir: Path) -> GridReport:
    """The grid analysis of the runs stored in ``sweep_dir`` (its results store and each run's summary.json)."""
    store = Store(Path(sweep_dir) / "results.sqlite")
    rows = store.runs()
    summaries = {}
    for r in rows:
        try:
            summaries[r["run_id"]] = read_summary(Path(sweep_dir) / "runs" / r["run_id"])
        except NormlabError:
            summaries[r["run_id"]] = None
    return analyze(grid_runs_from_rows(rows, store.curves(), summaries))


def decided_values(sweep_dir: Path) -> tuple[Question, Values, Learned]:
    """The declared question of the sweep in ``sweep_dir`` over the groups that ran, its per-seed values and the
    learned flags."""
    grid = stored_grid(sweep_dir)
    q = stored_question(stored_spec(sweep_dir), [g.name for g in grid.groups])
    return q, primary_values(grid, q.primary), learned_flags(grid)


def look_record(sweep_dir: Path, k: int) -> dict[str, Any]:
    """Look ``k`` (0-based) of ``sweep_dir``'s sequential plan, recomputed from the stored runs of the first
    ``looks[j]`` seeds for every look ``j <= k`` (normlab.decide.looks.look)."""
    spec = stored_spec(sweep_dir)
    if spec.looks is None:
        raise NormlabError(f"{sweep_dir} has no sequential plan")
    q, values, learned = decided_values(sweep_dir)
    return look(q, values, learned, list(spec.seeds), spec.looks, k)
