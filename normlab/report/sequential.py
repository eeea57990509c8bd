"""The decisions of a declared primary family: at each look of a sequential plan (Lan–DeMets O'Brien–Fleming-type
boundaries, t-based, with a group-sequential Holm over the family: normlab.stats.sequential), and side by side on a
second data source (replicated / contradicted / underpowered / not replicated, with the replication's power at
Holm's first level from its own spread). The verdicts are made by normlab.decide.verdicts; this module computes
the statistics they are made from (normlab.report.sequential_section renders them).

Every decision path applies the one did-not-learn guard (normlab.stats.learning): a comparison involving a model
that did not learn in a seed it uses is "not decided: did not learn" (or "...: baseline did not learn") and counts as
p = 1 in its Holm family (at a look: never tested, so never rejected).

Per-seed values of the primary metric come from the learning-rate analysis (normlab.experiments.lrgrid, the same
numbers as the report's tables): ``lr_sensitivity`` is a seed's LR sensitivity over the grid, ``best_loss`` its
best final loss over the grid, ``final_loss`` its final loss (on a grid: at its best learning rate, i.e. the best
loss). Each variant is compared with the baseline by the paired differences over the seeds both finished.

A look's record (``look_record``, stored in the sweep's meta by normlab.experiments.sequential) holds the seeds,
the information fraction, the boundary at the first and the last Holm level, and per comparison the estimate, the
normal-scale statistic ``z`` and the decision. A fixed design (no plan) decides by the declared correction (Holm
unless ``correction: bh``) of the paired t-tests' p-values over the family at ``alpha`` (``fixed_decisions``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from normlab.errors import NormlabError
from normlab.io import read_yaml_file
from normlab.decide.plan import LOOKS_META, fractions, looks_of
from normlab.decide.question import Question, stored_question
from normlab.experiments.store import Store
from normlab.decide.verdicts import (
    UNDECIDED,
    decision,
    family_adjusted,
    learning_guard,
    margin_verdict,
    rejects,
    replication,
)
from normlab.report.analysis import load
from normlab.experiments.lrgrid import GridReport, SeedGrid
from normlab.stats.intervals import paired_diff
from normlab.stats.planning import holm_first_level, paired_t_power
from normlab.stats.sequential import HolmLevels, nominal_p, paired_z, sequential_holm

REPLICATIONS_META = "replications"  # [{"source", "dir"}] in the original sweep's meta
METRIC_OF: dict[str, Callable[[SeedGrid], float]] = {
    "lr_sensitivity": lambda s: s.sensitivity,
    "best_loss": lambda s: s.best,
    "final_loss": lambda s: s.best,
}


def learned_flags(grid: GridReport) -> dict[str, dict[int, bool | None]]:
    """``{variant: {seed: learned at its best learning rate}}`` (normlab.stats.learning; None: no unigram level)."""
    return {g.name: {s.seed: s.learned for s in g.seeds} for g in grid.groups}


def _dnl(learned: dict[str, dict[int, bool | None]] | None, v: str, base: str, seeds: set[int] | None) -> str | None:
    """The did-not-learn guard (normlab.decide.verdicts.learning_guard) over ``seeds`` (all when None)."""
    if learned is None:
        return None

    def flags(name: str) -> list[bool | None]:
        return [f for s, f in learned.get(name, {}).items() if seeds is None or s in seeds]

    return learning_guard(flags(v), flags(base))


@lru_cache(maxsize=32)
def _levels(looks: tuple[int, ...], n_max: int, alpha: float, m: int) -> HolmLevels:
    return HolmLevels.build_t(looks, n_max, alpha, m)


def primary_values(grid: GridReport, primary: str) -> dict[str, dict[int, float]]:
    """``{variant: {seed: value of the primary metric}}`` from the report's grid analysis."""
    get = METRIC_OF[primary]
    return {g.name: {s.seed: float(get(s)) for s in g.seeds} for g in grid.groups}


def _spec(sweep_dir: Path) -> dict[str, Any]:
    """The stored sweep spec (``SWEEP_DIR/sweep.yaml``), {} when absent or unreadable."""
    try:
        spec = read_yaml_file(Path(sweep_dir) / "sweep.yaml", "sweep file")
    except NormlabError:
        return {}
    return spec if isinstance(spec, dict) else {}


def question_of(sweep_dir: Path, grid: GridReport) -> Question:
    """The declared question of the sweep in ``sweep_dir`` over the groups that ran (its family resolved)."""
    return stored_question(_spec(sweep_dir), [g.name for g in grid.groups])


def _pairs(values: dict[str, dict[int, float]], v: str, base: str, seeds: set[int] | None) -> list[tuple[float, float]]:
    a, b = values.get(v, {}), values.get(base, {})
    common = sorted(s for s in set(a) & set(b) if seeds is None or s in seeds)
    return [(a[s], b[s]) for s in common]


def _estimate(pairs: list[tuple[float, float]]) -> dict[str, Any]:
    if not pairs:
        return {"n": 0, "diff": None, "ci95": None, "p": None}
    d = paired_diff([a for a, _ in pairs], [b for _, b in pairs])
    return {"n": d.n, "diff": d.mean, "ci95": d.half, "p": d.p}


def look_record(sweep_dir: Path, k: int) -> dict[str, Any]:
    """Look ``k`` (0-based) of ``sweep_dir``'s sequential plan, recomputed from the stored runs of the first
    ``looks[j]`` seeds for every look ``j <= k`` (normlab.experiments.sequential calls it after each round)."""
    sweep_dir = Path(sweep_dir)
    spec = _spec(sweep_dir)
    if looks_of(spec) is None:
        raise ValueError(f"{sweep_dir} has no sequential plan")
    rep = load(sweep_dir)
    assert rep.grid is not None
    return _look(spec, rep.grid, k)


def _look(spec: dict[str, Any], grid: GridReport, k: int) -> dict[str, Any]:
    """Look ``k`` of the plan in ``spec`` from the grid analysis of the stored runs (``look_record``)."""
    looks = looks_of(spec)
    assert looks is not None
    q = stored_question(spec, [g.name for g in grid.groups])
    rep = grid
    values = primary_values(rep, q.primary)
    learned = learned_flags(rep)
    seeds = list(spec["seeds"])
    m = len(q.family)
    z = np.full((k + 1, m), np.nan)
    notes: list[str | None] = [None] * m
    for j in range(k + 1):
        keep = set(seeds[: looks[j]])
        for i, v in enumerate(q.family):
            # the one did-not-learn guard: a comparison involving a model that did not learn in a seed so far is
            # not tested from that look on (NaN: it stays in the family, never rejected, as p = 1)
            notes[i] = notes[i] or _dnl(learned, v, q.baseline, keep)
            pairs = _pairs(values, v, q.baseline, keep)
            if len(pairs) >= 2 and notes[i] is None:
                z[j, i] = paired_z(np.array([[a - b] for a, b in pairs]))[0]
    levels = _levels(tuple(looks[: k + 1]), looks[-1], q.alpha, max(m, 1))
    rejected = sequential_holm(z[None], levels)[0] if m else np.zeros(0, dtype=int)
    keep = set(seeds[: looks[k]])
    comps = []
    for i, v in enumerate(q.family):
        at = int(rejected[i])
        zz = z[at, i] if at >= 0 else z[k, i]
        comps.append({"variant": v, "baseline": q.baseline, "metric": q.primary,
                      **_estimate(_pairs(values, v, q.baseline, keep)),
                      "z": None if not np.isfinite(zz) else float(zz),
                      "decided_at_look": at + 1 if at >= 0 else None,
                      "decision": decision(float(zz), rejected=at >= 0, note=notes[i])})
    mm = max(m, 1)
    return {"look": k + 1, "seeds": looks[k], "fraction": fractions(looks)[k],
            "boundary_first": levels.bounds[mm][k], "boundary_last": levels.bounds[1][k],
            "nominal_p_first": nominal_p(levels.bounds[mm][k]), "alpha": q.alpha, "m": m,
            "primary": q.primary, "baseline": q.baseline, "comparisons": comps,
            # nothing left to decide: every comparison decided, or not decidable because a model did not learn
            # (more seeds cannot undo that)
            "decided": bool(m) and all(c["decided_at_look"] is not None or c["decision"] != UNDECIDED
                                       for c in comps)}


def fixed_decisions(values: dict[str, dict[int, float]], q: Question,
                    learned: dict[str, dict[int, bool | None]] | None = None) -> list[dict[str, Any]]:
    """A fixed design's decisions (normlab.decide.verdicts): paired t over the common seeds, adjusted by the
    question's correction over ``q.family`` at ``q.alpha``. A comparison involving a model that did not learn in
    some seed (``learned``: ``learned_flags``) is "not decided: did not learn" and enters as p = 1; so does one that
    cannot be tested (fewer than 2 common seeds), whose adjusted p is shown as None. With a practical margin
    declared, a difference whose TOST interval lies inside it is "within margin" (verdicts.margin_verdict)."""
    est = [_estimate(_pairs(values, v, q.baseline, None)) for v in q.family]
    notes = [_dnl(learned, v, q.baseline, None) for v in q.family]
    adj = [None if e["p"] is None and not n else a
           for e, n, a in zip(est, notes, family_adjusted([e["p"] for e in est], notes, q))]
    return [{"variant": v, "baseline": q.baseline, "metric": q.primary, **e, "p_holm": a,
             "decision": margin_verdict(decision(e["diff"], rejected=rejects(a, q.alpha, n), note=n),
                                        [x - y for x, y in _pairs(values, v, q.baseline, None)], q)[0]}
            for v, e, a, n in zip(q.family, est, adj, notes)]


def sequential_block(sweep_dir: Path, grid: GridReport | None = None) -> dict[str, Any] | None:
    """The ``sequential`` JSON block of a sweep run with a plan: the plan, every look, why it stopped, the seeds
    spent and the final decisions; None for a sweep without a plan or before its first look. ``grid``: the sweep's
    grid analysis when the caller has it (else it is loaded)."""
    spec = _spec(sweep_dir)
    looks = looks_of(spec)
    store = Store(Path(sweep_dir) / "results.sqlite")
    raw = store.meta().get(LOOKS_META) if looks is not None and store.path.is_file() else None
    if raw is None:
        return None
    data = json.loads(raw)
    if not data.get("looks"):
        return None
    # the looks are recomputed from the stored runs (the decision at a look depends only on its seeds), so the
    # current rules (the did-not-learn guard, the t-based boundaries) apply to a store written before them
    grid = grid if grid is not None else load(sweep_dir).grid
    if grid is not None:
        data["looks"] = [_look(spec, grid, k) for k in range(len(data["looks"]))]
    last = data["looks"][-1]
    return {"plan": {"looks": looks, "max_seeds": looks[-1], "alpha": last["alpha"], "primary": last["primary"],
                     "baseline": last["baseline"],
                     "spending": "Lan-DeMets O'Brien-Fleming-type, t-based boundaries (simulated)",
                     "multiplicity": "group-sequential Holm"},
            "looks": data["looks"], "stopped": data.get("stopped") or "in progress",
            "seeds_spent": data.get("seeds_spent"), "decisions": last["comparisons"]}


def decisions_of(sweep_dir: Path) -> tuple[Question, list[dict[str, Any]]]:
    """The final decisions on a sweep's primary family: its sequential looks' when it has a plan, else fixed."""
    q, dec, _ = _decisions_values(sweep_dir)
    return q, dec


def _decisions_values(sweep_dir: Path) -> tuple[Question, list[dict[str, Any]], dict[str, dict[int, float]]]:
    """``decisions_of`` with the per-seed values of the primary metric (one load of the stored runs)."""
    rep = load(sweep_dir)
    assert rep.grid is not None
    q = question_of(sweep_dir, rep.grid)
    values = primary_values(rep.grid, q.primary)
    block = sequential_block(sweep_dir, rep.grid)
    if block is not None:
        return q, block["decisions"], values
    return q, fixed_decisions(values, q, learned_flags(rep.grid)), values


def replication_power(effect: float | None, replica_diffs: list[float], alpha: float, m: int) -> float | None:
    """The power of the replication's paired t-test at Holm's first level ``alpha / m`` to detect the original's
    effect ``effect``, from the replication's own spread (SD of its per-seed differences) and seeds:
    normlab.stats.paired_t_power (noncentral t)."""
    if effect is None or len(replica_diffs) < 2:
        return None
    d = paired_diff(replica_diffs, [0.0] * len(replica_diffs))
    return paired_t_power(effect, d.sd, d.n, holm_first_level(alpha, m))


def per_seed_differences(sweep_dir: Path) -> dict[str, dict[str, float]]:
    """Per variant of the declared family, ``{seed: primary(variant) - primary(baseline)}`` over the seeds both
    have (the values the family's decisions are paired over)."""
    q, dec, values = _decisions_values(sweep_dir)
    return {d["variant"]: _per_seed(values, d["variant"], d["baseline"]) for d in dec}


def _per_seed(values: dict[str, dict[int, float]], v: str, base: str) -> dict[str, float]:
    """``{seed: value(v) - value(base)}`` over the seeds both have (JSON keys are strings)."""
    a, b = values.get(v, {}), values.get(base, {})
    return {str(s): a[s] - b[s] for s in sorted(set(a) & set(b))}


def replication_block(sweep_dir: Path) -> list[dict[str, Any]]:
    """Each replication recorded in ``sweep_dir``'s meta: per primary comparison the estimate and decision on the
    original source and on the replication's, and the verdict."""
    store = Store(Path(sweep_dir) / "results.sqlite")
    raw = store.meta().get(REPLICATIONS_META) if store.path.is_file() else None
    out: list[dict[str, Any]] = []
    todo = [r for r in (json.loads(raw) if raw else []) if (Path(sweep_dir) / r["dir"] / "results.sqlite").is_file()]
    if not todo:
        return out
    q, orig, ovals = _decisions_values(Path(sweep_dir))
    m = len(q.family)
    for r in todo:
        _, repl, rvals = _decisions_values(Path(sweep_dir) / r["dir"])
        by = {c["variant"]: c for c in repl}
        rows = []
        for c in orig:
            other = by.get(c["variant"], {"decision": UNDECIDED, "diff": None, "ci95": None, "n": 0})
            per = _per_seed(rvals, c["variant"], c["baseline"])
            power = replication_power(c.get("diff"), list(per.values()), q.alpha, m)
            rows.append({"variant": c["variant"], "baseline": c["baseline"], "metric": c["metric"],
                         "original": {**{k: c.get(k) for k in ("diff", "ci95", "n", "decision")},
                                      "per_seed": _per_seed(ovals, c["variant"], c["baseline"])},
                         "replication": {**{k: other.get(k) for k in ("diff", "ci95", "n", "decision")},
                                         "per_seed": per},
                         "power": power, "power_level": holm_first_level(q.alpha, m),
                         "verdict": replication(c["decision"], other["decision"], power)})
        out.append({"source": r["source"], "dir": r["dir"], "comparisons": rows})
    return out



def record_replication(sweep_dir: Path, source: str, rel_dir: str) -> None:
    store = Store(Path(sweep_dir) / "results.sqlite")
    raw = store.meta().get(REPLICATIONS_META)
    reps = [r for r in (json.loads(raw) if raw else []) if r["source"] != source]
    store.set_meta(REPLICATIONS_META, json.dumps([*reps, {"source": source, "dir": rel_dir}]))
