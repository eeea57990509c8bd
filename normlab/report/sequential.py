"""The decisions of a declared primary family: at each look of a sequential plan (Lan–DeMets O'Brien–Fleming-type
boundaries with a group-sequential Holm over the family: normlab.stats.sequential), and side by side on a second
data source (replicated / not replicated / contradicted).

Per-seed values of the primary metric come from the learning-rate analysis (normlab.experiments.lrgrid, the same
numbers as the report's tables): ``lr_sensitivity`` is a seed's LR sensitivity over the grid, ``best_loss`` its
best final loss over the grid, ``final_loss`` its final loss (on a grid: at its best learning rate, i.e. the best
loss). Each variant is compared with the baseline by the paired differences over the seeds both finished.

A look's record (``look_record``, stored in the sweep's meta by normlab.experiments.sequential) holds the seeds,
the information fraction, the boundary at the first and the last Holm level, and per comparison the estimate, the
normal-scale statistic ``z`` and the decision. A fixed design (no plan) decides by Holm's adjustment of the paired
t-tests' p-values over the family at ``alpha`` (``fixed_decisions``).
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from normlab.experiments.plan import LOOKS_META, Question, declared_question, fractions, looks_of
from normlab.experiments.store import Store
from normlab.report.analysis import load
from normlab.experiments.lrgrid import GridReport, SeedGrid
from normlab.stats import holm, paired_diff
from normlab.stats.sequential import HolmLevels, nominal_p, paired_z, sequential_holm

REPLICATIONS_META = "replications"  # [{"source", "dir"}] in the original sweep's meta
METRIC_OF: dict[str, Callable[[SeedGrid], float]] = {
    "lr_sensitivity": lambda s: s.sensitivity,
    "best_loss": lambda s: s.best,
    "final_loss": lambda s: s.best,
}
VERDICTS = ("replicated", "not replicated", "contradicted", "no conclusion to replicate")


def primary_values(grid: GridReport, primary: str) -> dict[str, dict[int, float]]:
    """``{variant: {seed: value of the primary metric}}`` from the report's grid analysis."""
    get = METRIC_OF[primary]
    return {g.name: {s.seed: float(get(s)) for s in g.seeds} for g in grid.groups}


def _spec(sweep_dir: Path) -> dict[str, Any]:
    """The stored sweep spec (``SWEEP_DIR/sweep.yaml``), {} when absent or unreadable."""
    import yaml

    try:
        spec = yaml.safe_load((Path(sweep_dir) / "sweep.yaml").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return {}
    return spec if isinstance(spec, dict) else {}


def question_of(sweep_dir: Path, grid: GridReport) -> Question:
    return declared_question(_spec(sweep_dir), [g.name for g in grid.groups])


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
    looks = looks_of(spec)
    if looks is None:
        raise ValueError(f"{sweep_dir} has no sequential plan")
    rep = load(sweep_dir)
    assert rep.grid is not None
    q = declared_question(spec, [g.name for g in rep.grid.groups])
    values = primary_values(rep.grid, q.primary)
    seeds = list(spec["seeds"])
    m = len(q.variants)
    z = np.full((k + 1, m), np.nan)
    for j in range(k + 1):
        keep = set(seeds[: looks[j]])
        for i, v in enumerate(q.variants):
            pairs = _pairs(values, v, q.baseline, keep)
            if len(pairs) >= 2:
                z[j, i] = paired_z(np.array([[a - b] for a, b in pairs]))[0]
    levels = HolmLevels.build(fractions(looks)[: k + 1], q.alpha, m)
    rejected = sequential_holm(z[None], levels)[0]
    keep = set(seeds[: looks[k]])
    comps = []
    for i, v in enumerate(q.variants):
        at = int(rejected[i])
        zz = z[at, i] if at >= 0 else z[k, i]
        comps.append({"variant": v, "baseline": q.baseline, "metric": q.primary,
                      **_estimate(_pairs(values, v, q.baseline, keep)),
                      "z": None if not np.isfinite(zz) else float(zz),
                      "decided_at_look": at + 1 if at >= 0 else None,
                      "decision": ("lower" if zz < 0 else "higher") if at >= 0 else "undecided"})
    return {"look": k + 1, "seeds": looks[k], "fraction": fractions(looks)[k],
            "boundary_first": levels.bounds[m][k], "boundary_last": levels.bounds[1][k],
            "nominal_p_first": nominal_p(levels.bounds[m][k]), "alpha": q.alpha, "m": m,
            "primary": q.primary, "baseline": q.baseline, "comparisons": comps,
            "decided": bool(m) and bool((rejected >= 0).all())}


def fixed_decisions(values: dict[str, dict[int, float]], q: Question) -> list[dict[str, Any]]:
    """A fixed design's decisions: paired t over the common seeds, Holm over the family at ``q.alpha``."""
    est = [_estimate(_pairs(values, v, q.baseline, None)) for v in q.variants]
    adj = holm([e["p"] for e in est])
    return [{"variant": v, "baseline": q.baseline, "metric": q.primary, **e, "p_holm": a,
             "decision": ("lower" if e["diff"] < 0 else "higher") if a is not None and a <= q.alpha else "undecided"}
            for v, e, a in zip(q.variants, est, adj)]


def sequential_block(sweep_dir: Path) -> dict[str, Any] | None:
    """The ``sequential`` JSON block of a sweep run with a plan: the plan, every look, why it stopped, the seeds
    spent and the final decisions; None for a sweep without a plan or before its first look."""
    spec = _spec(sweep_dir)
    looks = looks_of(spec)
    store = Store(Path(sweep_dir) / "results.sqlite")
    raw = store.meta().get(LOOKS_META) if looks is not None and store.path.is_file() else None
    if raw is None:
        return None
    data = json.loads(raw)
    if not data.get("looks"):
        return None
    last = data["looks"][-1]
    return {"plan": {"looks": looks, "max_seeds": looks[-1], "alpha": last["alpha"], "primary": last["primary"],
                     "baseline": last["baseline"], "spending": "Lan-DeMets O'Brien-Fleming-type",
                     "multiplicity": "group-sequential Holm"},
            "looks": data["looks"], "stopped": data.get("stopped") or "in progress",
            "seeds_spent": data.get("seeds_spent"), "decisions": last["comparisons"]}


def decisions_of(sweep_dir: Path) -> tuple[Question, list[dict[str, Any]]]:
    """The final decisions on a sweep's primary family: its sequential looks' when it has a plan, else fixed."""
    rep = load(sweep_dir)
    assert rep.grid is not None
    q = question_of(sweep_dir, rep.grid)
    block = sequential_block(sweep_dir)
    if block is not None:
        return q, block["decisions"]
    return q, fixed_decisions(primary_values(rep.grid, q.primary), q)


def verdict(original: str, replica: str) -> str:
    """``replicated`` (decided the same way on both), ``contradicted`` (decided the opposite way), ``not
    replicated`` (decided on the original only), ``no conclusion to replicate`` (undecided on the original)."""
    if original == "undecided":
        return VERDICTS[3]
    if replica == original:
        return VERDICTS[0]
    return VERDICTS[2] if replica in ("lower", "higher") else VERDICTS[1]


def replication_block(sweep_dir: Path) -> list[dict[str, Any]]:
    """Each replication recorded in ``sweep_dir``'s meta: per primary comparison the estimate and decision on the
    original source and on the replication's, and the verdict."""
    store = Store(Path(sweep_dir) / "results.sqlite")
    raw = store.meta().get(REPLICATIONS_META) if store.path.is_file() else None
    out: list[dict[str, Any]] = []
    todo = [r for r in (json.loads(raw) if raw else []) if (Path(sweep_dir) / r["dir"] / "results.sqlite").is_file()]
    if not todo:
        return out
    _, orig = decisions_of(sweep_dir)
    for r in todo:
        _, repl = decisions_of(Path(sweep_dir) / r["dir"])
        by = {c["variant"]: c for c in repl}
        rows = []
        for c in orig:
            other = by.get(c["variant"], {"decision": "undecided", "diff": None, "ci95": None, "n": 0})
            rows.append({"variant": c["variant"], "baseline": c["baseline"], "metric": c["metric"],
                         "original": {k: c.get(k) for k in ("diff", "ci95", "n", "decision")},
                         "replication": {k: other.get(k) for k in ("diff", "ci95", "n", "decision")},
                         "verdict": verdict(c["decision"], other["decision"])})
        out.append({"source": r["source"], "dir": r["dir"], "comparisons": rows})
    return out


def record_replication(sweep_dir: Path, source: str, rel_dir: str) -> None:
    store = Store(Path(sweep_dir) / "results.sqlite")
    raw = store.meta().get(REPLICATIONS_META)
    reps = [r for r in (json.loads(raw) if raw else []) if r["source"] != source]
    store.set_meta(REPLICATIONS_META, json.dumps([*reps, {"source": source, "dir": rel_dir}]))


# -- rendering ---------------------------------------------------------------------------------------------------
def _est_text(e: dict[str, Any]) -> str:
    if e.get("diff") is None:
        return "–"
    return f"{e['diff']:+.3f}" + (f" ± {e['ci95']:.3f}" if e.get("ci95") is not None else "") + f" (n={e['n']})"


def sequential_cells(block: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    head = ["look", "seeds", "fraction", "boundary |z| (first Holm step)", "nominal p", "boundary (last step)",
            *[f"z {c['variant']}" for c in block["decisions"]]]
    rows = []
    for lk in block["looks"]:
        zs = [("–" if c["z"] is None else f"{c['z']:+.2f}") + (" ✓" if c["decided_at_look"] == lk["look"] else "")
              for c in lk["comparisons"]]
        rows.append([str(lk["look"]), str(lk["seeds"]), f"{lk['fraction']:.2f}", f"{lk['boundary_first']:.3f}",
                     f"{lk['nominal_p_first']:.2g}", f"{lk['boundary_last']:.3f}", *zs])
    return head, rows


def _sequential_text(block: dict[str, Any]) -> str:
    p = block["plan"]
    why = {"decided": "every primary comparison was decided", "max_seeds": "the seed cap was reached",
           "budget": "the time budget could not fit another round", "interrupted": "it was interrupted",
           "failed": "a run failed"}.get(block["stopped"], block["stopped"])
    return (f"Seeds until decided on {p['primary']} vs {p['baseline']}: looks at {p['looks']} seeds, "
            f"{p['spending']} alpha spending at family-wise alpha = {p['alpha']:g} over {len(block['decisions'])} "
            f"comparison(s) ({p['multiplicity']}; the boundary applies to the paired t statistic's normal-quantile "
            f"transform). Stopped after {len(block['looks'])} look(s), {block['seeds_spent']} seeds spent: {why}. "
            + "; ".join(f"{c['variant']}: {c['decision']}"
                        + (f" at look {c['decided_at_look']}" if c.get("decided_at_look") else "")
                        for c in block["decisions"]) + ".")


def replication_cells(rep: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    head = ["comparison", "metric", "original", "decision", f"on {rep['source']}", "decision", "verdict"]
    rows = [[f"{c['variant']} − {c['baseline']}", c["metric"], _est_text(c["original"]), c["original"]["decision"],
             _est_text(c["replication"]), c["replication"]["decision"], c["verdict"]] for c in rep["comparisons"]]
    return head, rows


def md_sections(sweep_dir: Path, esc: Callable[[object], str]) -> list[str]:
    """Markdown sections (sequential looks, replications) of ``sweep_dir``; ``esc``: the report's escaper."""
    out: list[str] = []

    def table(head: list[str], rows: list[list[str]]) -> list[str]:
        return (["| " + " | ".join(esc(h) for h in head) + " |", "|" + " ---: |" * len(head)]
                + ["| " + " | ".join(esc(c) for c in r) + " |" for r in rows] + [""])

    block = sequential_block(sweep_dir)
    if block:
        out += ["## Seeds until decided", "", esc(_sequential_text(block)), ""] + table(*sequential_cells(block))
    for rep in replication_block(sweep_dir):
        out += [f"## Replication on {esc(rep['source'])}", "",
                esc("The same declared design on a second data source; each primary conclusion side by side."), ""]
        out += table(*replication_cells(rep))
    return out


def html_sections(sweep_dir: Path) -> list[str]:
    e = html.escape

    def table(head: list[str], rows: list[list[str]]) -> str:
        return ("<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in head) + "</tr>"
                + "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in r) + "</tr>" for r in rows) + "</table>")

    out: list[str] = []
    block = sequential_block(sweep_dir)
    if block:
        out.append(f"<h2>Seeds until decided</h2><div class='note'>{e(_sequential_text(block))}</div>"
                   + table(*sequential_cells(block)))
    for rep in replication_block(sweep_dir):
        out.append(f"<h2>Replication on {e(rep['source'])}</h2>" + table(*replication_cells(rep)))
    return out
