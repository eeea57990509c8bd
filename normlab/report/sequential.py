"""The decisions of a sweep's declared primary family as the report shows them: every look of a sequential plan and
each replication side by side with the original (replicated / contradicted / underpowered / not replicated, with
the replication's power at Holm's first level from its own spread). Every verdict here is made by the decision
layer (normlab.decide.looks: fixed designs and looks, with the one guard re-checked at every look and a decision
withdrawn where it fails later; normlab.decide.verdicts: replications) on the per-seed values
normlab.experiments.looks reads from the stored runs; this module assembles them (normlab.report.sequential_section
renders them).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from normlab.errors import NormlabError
from normlab.decide.looks import fixed_decisions, look
from normlab.decide.plan import LOOKS_META
from normlab.decide.question import Question, stored_question
from normlab.decide.verdicts import replication
from normlab.decide.vocab import UNDECIDED
from normlab.experiments.looks import learned_flags, primary_values, stored_spec
from normlab.experiments.lrgrid import GridReport
from normlab.experiments.sweepspec import SweepSpec
from normlab.experiments.store import Store
from normlab.io import loads_json
from normlab.report.analysis import load
from normlab.stats.intervals import paired_diff
from normlab.stats.planning import holm_first_level, paired_t_power, pooled_sd

__all__ = ["fixed_decisions", "learned_flags", "primary_values", "sequential_block", "decisions_of",
           "replication_block", "record_replication", "replication_power", "per_seed_differences"]

REPLICATIONS_META = "replications"  # [{"source", "dir"}] in the original sweep's meta


def question_of(sweep_dir: Path, grid: GridReport) -> Question:
    """The declared question of the sweep in ``sweep_dir`` over the groups that ran (its family resolved)."""
    return stored_question(stored_spec(sweep_dir), [g.name for g in grid.groups])


def _look(spec: SweepSpec, grid: GridReport, k: int) -> dict[str, Any]:
    """Look ``k`` of the plan in ``spec`` from the report's grid analysis (normlab.decide.looks.look)."""
    assert spec.looks is not None
    q = stored_question(spec, [g.name for g in grid.groups])
    return look(q, primary_values(grid, q.primary), learned_flags(grid), list(spec.seeds), spec.looks, k)


def sequential_block(sweep_dir: Path, grid: GridReport | None = None) -> dict[str, Any] | None:
    """The ``sequential`` JSON block of a sweep run with a plan: the plan, every look, why it stopped, the seeds
    spent and the final decisions; None for a sweep without a plan or before its first look. ``grid``: the sweep's
    grid analysis when the caller has it (else it is loaded)."""
    spec = stored_spec(sweep_dir)
    looks = spec.looks
    store = Store(Path(sweep_dir) / "results.sqlite")
    raw = store.meta().get(LOOKS_META) if looks is not None and store.path.is_file() else None
    if raw is None:
        return None
    data = _meta_json(store, LOOKS_META, raw, dict)
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
    q, dec, _, _ = _decisions_values(sweep_dir)
    return q, dec


def _decisions_values(sweep_dir: Path) -> tuple[Question, list[dict[str, Any]], dict[str, dict[int, float]],
                                                float | None]:
    """``decisions_of`` with the per-seed values of the primary metric (one load of the stored runs) and, for a
    sequential design, the nominal two-sided level its first Holm step had to reach at its last look (a decision
    there needs more than ``alpha / m``: the power a replication had is computed at this level, which ignores the
    earlier looks' chances and so is a lower bound); None for a fixed design."""
    rep = load(sweep_dir)
    assert rep.grid is not None
    q = question_of(sweep_dir, rep.grid)
    values = primary_values(rep.grid, q.primary)
    block = sequential_block(sweep_dir, rep.grid)
    if block is not None:
        return q, block["decisions"], values, block["looks"][-1].get("nominal_p_first")
    return q, fixed_decisions(values, q, learned_flags(rep.grid)), values, None


def replication_power(effect: float | None, replica_diffs: list[float], alpha: float, m: int,
                      level: float | None = None) -> float | None:
    """The power of the replication's paired t-test at Holm's first level ``alpha / m`` (or ``level``: a
    sequential replication's final-look boundary, :func:`_decisions_values`) to detect the original's effect
    ``effect``, from the replication's own spread (SD of its per-seed differences) and seeds:
    normlab.stats.paired_t_power (noncentral t)."""
    if effect is None or len(replica_diffs) < 2:
        return None
    d = paired_diff(replica_diffs, [0.0] * len(replica_diffs))
    return paired_t_power(effect, d.sd, d.n, level if level is not None else holm_first_level(alpha, m))


def replication_power_range(effect: float | None, replica_diffs: list[float], alpha: float, m: int,
                            level: float | None = None) -> list[float | None] | None:
    """``[low, high]``: :func:`replication_power` over the 95% chi-square interval of the replication's SD (the
    power at its upper and lower end): how much the power figure rests on a few degrees of freedom."""
    if effect is None or len(replica_diffs) < 2:
        return None
    sd = pooled_sd([replica_diffs])
    if sd is None:
        return None
    n, level = len(replica_diffs), level if level is not None else holm_first_level(alpha, m)
    return [paired_t_power(effect, sd.high, n, level), paired_t_power(effect, sd.low, n, level)]


def per_seed_differences(sweep_dir: Path) -> dict[str, dict[str, float]]:
    """Per variant of the declared family, ``{seed: primary(variant) - primary(baseline)}`` over the seeds both
    have (the values the family's decisions are paired over)."""
    q, dec, values, _ = _decisions_values(sweep_dir)
    return {d["variant"]: _per_seed(values, d["variant"], d["baseline"]) for d in dec}


def _per_seed(values: dict[str, dict[int, float]], v: str, base: str) -> dict[str, float]:
    """``{seed: value(v) - value(base)}`` over the seeds both have (JSON keys are strings)."""
    a, b = values.get(v, {}), values.get(base, {})
    return {str(s): a[s] - b[s] for s in sorted(set(a) & set(b))}


def _meta_json(store: Store, key: str, raw: str, kind: type) -> Any:
    """A JSON value of the store's meta through the bounded reader (depth, digits), of type ``kind``; anything else
    is one line naming the store and the key (a damaged store, not a traceback)."""
    label = f"results store {store.path}: meta '{key}'"
    data = loads_json(raw, label)
    if not isinstance(data, kind):
        raise NormlabError(f"{label} is not a JSON {'object' if kind is dict else 'list'}; the store is damaged")
    return data


def _replications(store: Store, raw: str | None) -> list[dict[str, Any]]:
    """The replications recorded in the store's meta: ``[{source, dir}]`` (text each)."""
    reps = _meta_json(store, REPLICATIONS_META, raw, list) if raw else []
    if not all(isinstance(r, dict) and isinstance(r.get("source"), str) and isinstance(r.get("dir"), str)
               for r in reps):
        raise NormlabError(f"results store {store.path}: meta '{REPLICATIONS_META}' holds an entry without a "
                           "source and dir; the store is damaged")
    return reps


def replication_block(sweep_dir: Path) -> list[dict[str, Any]]:
    """Each replication recorded in ``sweep_dir``'s meta: per primary comparison the estimate and decision on the
    original source and on the replication's, and the verdict."""
    store = Store(Path(sweep_dir) / "results.sqlite")
    raw = store.meta().get(REPLICATIONS_META) if store.path.is_file() else None
    out: list[dict[str, Any]] = []
    todo = [r for r in _replications(store, raw) if (Path(sweep_dir) / r["dir"] / "results.sqlite").is_file()]
    if not todo:
        return out
    q, orig, ovals, _ = _decisions_values(Path(sweep_dir))
    m = len(q.family)
    for r in todo:
        _, repl, rvals, rlevel = _decisions_values(Path(sweep_dir) / r["dir"])
        level = rlevel if rlevel is not None else holm_first_level(q.alpha, m)
        by = {c["variant"]: c for c in repl}
        rows = []
        for c in orig:
            other = by.get(c["variant"], {"decision": UNDECIDED, "diff": None, "ci95": None, "n": 0})
            per = _per_seed(rvals, c["variant"], c["baseline"])
            power = replication_power(c.get("diff"), list(per.values()), q.alpha, m, level)
            power_range = replication_power_range(c.get("diff"), list(per.values()), q.alpha, m, level)
            rows.append({"variant": c["variant"], "baseline": c["baseline"], "metric": c["metric"],
                         "original": {**{k: c.get(k) for k in ("diff", "ci95", "n", "decision")},
                                      "per_seed": _per_seed(ovals, c["variant"], c["baseline"])},
                         "replication": {**{k: other.get(k) for k in ("diff", "ci95", "n", "decision")},
                                         "per_seed": per},
                         "power": power, "power_range": power_range, "power_level": level,
                         "power_design": "fixed" if rlevel is None else "sequential: its last look's boundary",
                         "verdict": replication(c["decision"], other["decision"], power)})
        out.append({"source": r["source"], "dir": r["dir"], "comparisons": rows})
    return out



def record_replication(sweep_dir: Path, source: str, rel_dir: str) -> None:
    store = Store(Path(sweep_dir) / "results.sqlite")
    raw = store.meta().get(REPLICATIONS_META)
    reps = [r for r in _replications(store, raw) if r["source"] != source]
    store.set_meta(REPLICATIONS_META, json.dumps([*reps, {"source": source, "dir": rel_dir}]))
