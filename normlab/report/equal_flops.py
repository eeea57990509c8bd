"""Comparisons at equal steps and at equal training FLOPs (the report's "At equal FLOPs" section and ``normlab
advise --from``). Torch-free.

A run's training FLOPs at step ``s`` are ``s x tokens per step x flops_per_token`` (its summary.json: the analytic
count of normlab.model.flops). For two runs sharing a (seed, learning rate) cell, the common budget is the smaller
of their final FLOPs; each run's validation bits/byte is read there, linearly interpolated between its evaluations.
At equal steps: their last common evaluated step. Over the cells, a paired 95% t interval of ``variant - baseline``
for each (normlab.stats); both exploratory (a sweep's declared decision is its report's ranking and paired
sections). ``changed``: the readings (lower / higher / undecided) differ.
"""

from __future__ import annotations

from typing import Any, Callable

from normlab.decide.verdicts import decision
from normlab.report.document import Note, Section, Table
from normlab.stats.intervals import paired_diff

FlopsOf = Callable[[Any], "float | None"]  # a run -> training FLOPs per token when its summary lacks them


def _interp(points: list[tuple[float, float]], x: float) -> float | None:
    """Linear interpolation of ``[(x, y)]`` (sorted by x) at ``x``; None outside the points."""
    if not points or x < points[0][0] or x > points[-1][0]:
        return None
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x0 <= x <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return points[-1][1]


def run_flops_curve(info: Any, flops_of: FlopsOf | None = None) -> tuple[list[tuple[int, float]], float] | None:
    """``(val_bpb points by step, training FLOPs per step)`` of a run (``info.curves``, ``info.summary``); None
    without a validation curve, a step count or FLOPs per token (summary, else ``flops_of(info)``)."""
    pts = sorted(info.curves.get("val_bpb") or [])
    sm = info.summary or {}
    if not pts or not sm.get("step") or not sm.get("tokens_seen"):
        return None
    fpt = sm.get("flops_per_token")
    if fpt is None and flops_of is not None:
        fpt = flops_of(info)
    if not fpt:
        return None
    return pts, fpt * sm["tokens_seen"] / sm["step"]


def equal_compute(a: Any, b: Any, flops_of: FlopsOf | None = None) -> dict[str, float] | None:
    """``a - b`` val bits/byte at their last common evaluated step and at their common training FLOPs (module
    docstring); None when not computable."""
    ca, cb = run_flops_curve(a, flops_of), run_flops_curve(b, flops_of)
    if ca is None or cb is None:
        return None
    (pa, fa), (pb, fb) = ca, cb
    common = sorted(set(s for s, _ in pa) & set(s for s, _ in pb))
    if not common:
        return None
    step = common[-1]
    f_star = min(pa[-1][0] * fa, pb[-1][0] * fb)
    ya = _interp([(s * fa, v) for s, v in pa], f_star)
    yb = _interp([(s * fb, v) for s, v in pb], f_star)
    if ya is None or yb is None:
        return None
    return {"steps_diff": dict(pa)[step] - dict(pb)[step], "step": step, "flops_diff": ya - yb, "flops": f_star}


def _reading(d: Any) -> str:
    """The interval's reading by the one verdict rule (normlab.decide.verdicts.decision): lower / higher where
    the 95% interval excludes 0, else undecided (not testable without an interval)."""
    return decision(d.mean, rejected=d.half is not None and abs(d.mean) > d.half, testable=d.half is not None)


def compare_runs(runs: list[Any], baseline: str | None = None, flops_of: FlopsOf | None = None) -> dict[str, Any]:
    """Each variant (a grid's group) of ``runs`` against ``baseline`` (default: the first), paired over (seed,
    learning rate) cells, at equal steps and at equal FLOPs."""
    cells: dict[str, dict[tuple, Any]] = {}
    for info in runs:
        if info.row.get("status") != "completed":
            continue
        axes = info.row.get("axes") or {}
        group = axes.get("grid_group") or info.row["variant"]
        cells.setdefault(group, {})[(info.row.get("seed"), axes.get("train.lr"))] = info
    names = list(cells)
    base = baseline if baseline in cells else (names[0] if names else None)
    out = []
    for name in names:
        if name == base:
            continue
        pairs = [equal_compute(cells[name][k], cells[base][k], flops_of) for k in cells[name] if k in cells[base]]
        pairs = [p for p in pairs if p is not None]
        if not pairs:
            out.append({"variant": name, "baseline": base, "n": 0, "note": "no paired runs with curves and FLOPs"})
            continue
        ds, df = (paired_diff([p[k] for p in pairs], [0.0] * len(pairs)) for k in ("steps_diff", "flops_diff"))
        row = {"variant": name, "baseline": base, "n": len(pairs),
               "equal_steps": {"diff": ds.mean, "half": ds.half, "p": ds.p, "reading": _reading(ds)},
               "equal_flops": {"diff": df.mean, "half": df.half, "p": df.p, "reading": _reading(df),
                               "flops": min(p["flops"] for p in pairs)}}
        row["changed"] = row["equal_steps"]["reading"] != row["equal_flops"]["reading"]
        out.append(row)
    return {"baseline": base, "metric": "val_bpb (exploratory, 95% paired t interval)", "comparisons": out}


def _g(x: float | None) -> str:
    return "–" if x is None else f"{x:.3g}"


NOTE = ("Validation bits/byte, variant − baseline over (seed, learning rate) cells: at the last common evaluated "
        "step, and at the pair's common training FLOPs (the smaller final budget; each curve interpolated there; "
        "FLOPs per token from each run's summary.json, normlab.model.flops). ± is the 95% paired t half-width; "
        "exploratory (no multiplicity correction). docs/advise.md.")


def sections(rep: Any) -> list[Section]:
    """The report's "At equal FLOPs" section, or none when no pair is comparable."""
    baseline = rep.grid.baseline if getattr(rep, "grid", None) is not None else None
    res = compare_runs(rep.runs, baseline)
    rows = [c for c in res["comparisons"] if c["n"]]
    if not rows:
        return []
    head = ["variant", "n", f"Δ at equal steps vs {res['baseline']}", "reading", "Δ at equal FLOPs", "FLOPs",
            "reading", "verdict changes"]
    cells = [[c["variant"], str(c["n"]), f"{c['equal_steps']['diff']:+.4f} ± {_g(c['equal_steps']['half'])}",
              c["equal_steps"]["reading"], f"{c['equal_flops']['diff']:+.4f} ± {_g(c['equal_flops']['half'])}",
              f"{c['equal_flops']['flops']:.3g}", c["equal_flops"]["reading"], "yes" if c["changed"] else "no"]
             for c in rows]
    return [Section("At equal FLOPs", [Table(head, cells), Note(NOTE)])]
