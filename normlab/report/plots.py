"""Report figures as PNG bytes (matplotlib ``Figure`` + Agg canvas: no global backend switch, no display)."""

from __future__ import annotations

from statistics import mean
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from normlab.names import read_bpb
from normlab.report.analysis import DiagSection, SweepReport, VariantResult, by_step, point_columns
from normlab.report.figures import LEGEND_OUTSIDE, ci_rows_png, colors, png


def _band(runs_pts: list[Any]) -> tuple[Any, Any, Any, Any]:
    """Mean, min and max across runs at the steps every run recorded (arrays: a curve of a million logged steps
    costs a few arrays, not a Python object per point)."""
    if not runs_pts:
        return [], [], [], []
    cols = [by_step(pts) for pts in runs_pts]
    common = cols[0][0]
    for s, _ in cols[1:]:
        common = np.intersect1d(common, s, assume_unique=True)
    vals = np.stack([v[np.searchsorted(s, common)] for s, v in cols])
    return common, vals.mean(axis=0), vals.min(axis=0), vals.max(axis=0)


def _thin(steps: Any, *series: Any) -> Any:
    """The points of a curve to draw: all of them up to ``4 * PLOT_BUCKETS``; else, per bucket of consecutive
    points (``PLOT_BUCKETS`` buckets), its first and last point and where each of ``series`` has its least and
    greatest value (min-max decimation: at a figure's resolution the drawn line covers the same pixels, and drawing
    a million-point line costs the renderer hundreds of MiB). An index array, increasing, or ``slice(None)``."""
    n = len(steps)
    if n <= 4 * PLOT_BUCKETS:
        return slice(None)
    size = -(-n // PLOT_BUCKETS)
    rows = -(-n // size)
    starts = np.arange(rows) * size
    keep = [starts, np.minimum(starts + size, n) - 1]
    for y in series:
        y = np.asarray(y, dtype=np.float64)
        for fill, arg in ((np.inf, np.argmin), (-np.inf, np.argmax)):
            padded = np.full(rows * size, fill)
            padded[:n] = np.where(np.isnan(y), fill, y)
            keep.append(np.minimum(starts + arg(padded.reshape(rows, size), axis=1), n - 1))
    return np.unique(np.concatenate(keep))


PLOT_BUCKETS = 2000
FEW_POINTS = 30  # curves with at most this many points get a marker at each
MIN_CURVE_EVALS = 3
"""A validation curve needs this many evaluations per run; with fewer (a run evaluated only at its end) the panel is
a labelled dot plot of each variant's last value instead."""


def ranking_png(rep: SweepReport, cmap: dict[str, Any]) -> bytes | None:
    ranked = [v for v in rep.variants if v.ci is not None]
    if not ranked:
        return None
    return ci_rows_png([(v.name, v.ci.mean, v.ci.half, v.finals, cmap[v.name]) for v in ranked],
                       "final validation bits/byte (dot: mean, bar: 95% CI, x: seeds)")


def curves_png(rep: SweepReport, cmap: dict[str, Any]) -> bytes | None:
    """Validation bits/byte and training loss against the step per variant (mean; band: min–max over seeds), one
    colour per variant (``variant_colors``: a learning-rate grid's cells share their variant's colour, named once in
    the legend, which sits outside the axes). Runs with fewer than ``MIN_CURVE_EVALS`` evaluations get a labelled
    dot plot of their last validation value instead of a curve; no training-loss records, no training-loss panel."""
    have = any("val_bpb" in r.curves for r in rep.runs)
    if not have:
        return None
    evals = max(len(r.curves.get("val_bpb") or []) for r in rep.runs)
    dots = evals < MIN_CURVE_EVALS
    with_loss = any(r.curves.get("loss") for r in rep.runs)
    rows = [v for v in rep.variants if any(r.curves.get("val_bpb") for r in v.runs)]
    height = max(4.2, 0.32 * len(rows) + 1.6) if dots else 4.2
    fig = Figure(figsize=(12 if with_loss else 8, height))
    axes = fig.subplots(1, 2 if with_loss else 1, squeeze=False)[0]
    ax_v, ax_t = axes[0], (axes[1] if with_loss else None)
    named: set[str] = set()
    for v in rep.variants:
        done = [r for r in v.runs if r.row["status"] in ("completed", "interrupted")]
        group = variant_group(v.runs[0].row) if v.runs else v.name
        cells = sum(1 for u in rep.variants if u.runs and variant_group(u.runs[0].row) == group)
        label = "_nolegend_" if group in named else (group if cells == 1 else f"{group} ({cells} learning rates)")
        named.add(group)
        for ax, key in ((None if dots else ax_v, "val_bpb"), (ax_t, "loss")):
            if ax is None:
                continue
            pts = [r.curves[key] for r in done if r.curves.get(key)]
            steps, mu, lo, hi = _band(pts)
            if not len(steps):
                continue
            few = len(steps) <= FEW_POINTS
            at = _thin(steps, mu, lo, hi)
            ax.plot(steps[at], mu[at], color=cmap[v.name], label=label, lw=1.6, marker="o" if few else None,
                    ms=5 if len(steps) == 1 else 3.5)
            if len(pts) > 1:
                ax.fill_between(steps[at], lo[at], hi[at], color=cmap[v.name], alpha=0.18, lw=0)
    if dots:
        _last_value_dots(ax_v, rows, cmap, evals)
    else:
        ax_v.set_title("validation bits/byte (mean; band: min–max over seeds)", fontsize=10)
        ax_v.set_xlabel("step")
        ax_v.set_xlim(left=0)
        ax_v.grid(alpha=0.3)
        _zoom(ax_v, rep, "val_bpb")
    if ax_t is not None:
        ax_t.set_title("training loss, nats/token (mean; band: min–max)", fontsize=10)
        ax_t.set_xlabel("step")
        ax_t.set_xlim(left=0)
        ax_t.grid(alpha=0.3)
        _zoom(ax_t, rep, "loss")
    legend_ax = ax_t if ax_t is not None else (None if dots else ax_v)
    if legend_ax is not None and legend_ax.get_legend_handles_labels()[0]:
        legend_ax.legend(**LEGEND_OUTSIDE)
    fig.tight_layout()
    return png(fig)


def _last_value_dots(ax: Any, variants: list[VariantResult], cmap: dict[str, Any], evals: int) -> None:
    """One labelled row per variant: each seed's last validation bits/byte as an x, their mean as a dot."""
    for i, v in enumerate(variants):
        y = len(variants) - 1 - i
        last = [r.curves["val_bpb"][-1][1] for r in v.runs if r.curves.get("val_bpb")]
        ax.scatter(last, [y] * len(last), marker="x", color=cmap[v.name], alpha=0.7, s=22)
        ax.scatter([mean(last)], [y], marker="o", color=cmap[v.name], s=42, zorder=3)
    ax.set_yticks(range(len(variants)), [v.name for v in reversed(variants)], fontsize=8)
    ax.set_ylim(-0.7, len(variants) - 0.3)
    ax.set_xlabel("validation bits/byte at the last evaluation")
    ax.set_title(f"validation bits/byte: {evals} evaluation{'s' if evals != 1 else ''} per run, no curve "
                 "(dot: mean, x: seeds)", fontsize=10)
    ax.grid(axis="x", alpha=0.3)


def _zoom(ax: Any, rep: SweepReport, key: str) -> None:
    """Clip the y range to the second half of training so early-step values do not flatten the differences."""
    tails = []
    for r in rep.runs:
        pts = r.curves.get(key) or []
        if len(pts) >= 2 and r.row["status"] != "diverged":
            s, v = point_columns(pts)
            tails.append(v[(s >= s[-1] / 2) & np.isfinite(v)])
    tails = [t for t in tails if len(t)]
    if tails:
        lo, hi = min(float(t.min()) for t in tails), max(float(t.max()) for t in tails)
        pad = 0.15 * (hi - lo or 0.1)
        top = max(ax.get_ylim()[0], hi + 4 * pad)
        ax.set_ylim(lo - pad, min(ax.get_ylim()[1], top))


def diag_png(section: DiagSection, cmap: dict[str, Any]) -> bytes:
    fig = Figure(figsize=(5.6, 3.5))
    ax = fig.add_subplot()
    for name, vals in section.series.items():
        ax.plot(range(section.x0, section.x0 + len(vals)), vals, marker="o", ms=3, color=cmap.get(name), label=name,
                lw=1.4)
    ax.set_xlabel(section.xlabel, fontsize=9)
    ax.set_title(f"source: {section.source}; mean over seeds", fontsize=8, color="#555")
    vals = [v for vs in section.series.values() for v in vs]
    if vals and min(vals) > 0 and max(vals) / min(vals) > 30:
        ax.set_yscale("log")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return png(fig)


def extrapolation_png(rep: SweepReport, cmap: dict[str, Any]) -> bytes | None:
    series: dict[str, dict[float, list[float]]] = {}
    for v in rep.variants:
        for r in v.runs:
            for row in r.extrapolation or []:
                series.setdefault(v.name, {}).setdefault(float(row["factor"]), []).append(float(read_bpb(row)))
    if not series:
        return None
    fig = Figure(figsize=(6.2, 3.8))
    ax = fig.add_subplot()
    for name, by_f in series.items():
        fs = sorted(by_f)
        ax.plot(fs, [mean(by_f[f]) for f in fs], marker="o", color=cmap.get(name), label=name)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("evaluation context / training context")
    ax.set_ylabel("bits/byte (mean over seeds)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return png(fig)


def run_curves_png(run: Any) -> bytes | None:
    """One run's full curves: training loss, validation bits/byte, learning rate and gradient norm at every logged
    step (no zoom, no averaging)."""
    keys = [("loss", "training loss (nats/token)"), ("val_bpb", "validation bits/byte"), ("lr", "learning rate"),
            ("grad_norm", "gradient norm (before clipping)")]
    have = [(k, t) for k, t in keys if run.curves.get(k)]
    if not have:
        return None
    fig = Figure(figsize=(11, 3.4 * ((len(have) + 1) // 2)))
    axes = fig.subplots((len(have) + 1) // 2, 2, squeeze=False).ravel()
    for ax, (k, t) in zip(axes, have):
        steps, values = point_columns(run.curves[k])
        at = _thin(steps, values)
        ax.plot(steps[at], values[at], marker="." if len(steps) < 60 else None, lw=1.3)
        ax.set_title(t, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    for ax in axes[len(have):]:
        ax.set_visible(False)
    fig.tight_layout()
    return png(fig)


def variant_order(rep: SweepReport) -> list[str]:
    """Colour order: the sweep's own variant order (stable across reports), not the ranking."""
    seen: list[str] = []
    for r in rep.runs:
        if r.row["variant"] not in seen:
            seen.append(r.row["variant"])
    return seen


def variant_group(row: dict[str, Any]) -> str:
    """The variant a run belongs to for colouring: its learning-rate grid group (``Peri-LN`` for the cell
    ``Peri-LN · lr=0.01``), else its variant name."""
    return (row.get("axes") or {}).get("grid_group") or row["variant"]


def variant_colors(rep: SweepReport) -> dict[str, Any]:
    """One colour per variant, the same in every panel of a report: keyed by the variant (grid group) names in the
    sweep's order, and by each learning-rate cell's name, which gets its variant's colour."""
    groups: list[str] = []
    cells: dict[str, str] = {}
    for r in rep.runs:
        g = variant_group(r.row)
        cells.setdefault(r.row["variant"], g)
        if g not in groups:
            groups.append(g)
    base = colors(groups)
    return {**{cell: base[g] for cell, g in cells.items()}, **base}



__all__ = ["LEGEND_OUTSIDE", "colors", "curves_png", "diag_png", "extrapolation_png", "ranking_png", "variant_colors",
           "variant_group", "variant_order", "VariantResult"]
