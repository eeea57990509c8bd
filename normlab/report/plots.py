"""Report figures as PNG bytes (matplotlib ``Figure`` + Agg canvas: no global backend switch, no display)."""

from __future__ import annotations

from statistics import mean
from typing import Any

from matplotlib.figure import Figure

from normlab.names import read_bpb
from normlab.report.analysis import DiagSection, SweepReport, VariantResult
from normlab.report.figures import ci_rows_png, colors, png


def _band(runs_pts: list[list[tuple[int, float]]]) -> tuple[list[int], list[float], list[float], list[float]]:
    """Mean, min and max across runs at the steps every run recorded."""
    if not runs_pts:
        return [], [], [], []
    common = sorted(set.intersection(*({s for s, _ in pts} for pts in runs_pts)))
    maps = [dict(pts) for pts in runs_pts]
    vals = [[m[s] for m in maps] for s in common]
    return common, [mean(v) for v in vals], [min(v) for v in vals], [max(v) for v in vals]


FEW_POINTS = 30  # curves with at most this many points get a marker at each


def ranking_png(rep: SweepReport, cmap: dict[str, Any]) -> bytes | None:
    ranked = [v for v in rep.variants if v.ci is not None]
    if not ranked:
        return None
    return ci_rows_png([(v.name, v.ci.mean, v.ci.half, v.finals, cmap[v.name]) for v in ranked],
                       "final validation bits/byte (dot: mean, bar: 95% CI, x: seeds)")


def curves_png(rep: SweepReport, cmap: dict[str, Any]) -> bytes | None:
    have = any("val_bpb" in r.curves for r in rep.runs)
    if not have:
        return None
    fig = Figure(figsize=(11, 4.2))
    ax_v, ax_t = fig.subplots(1, 2)
    for v in rep.variants:
        done = [r for r in v.runs if r.row["status"] in ("completed", "interrupted")]
        for ax, key in ((ax_v, "val_bpb"), (ax_t, "loss")):
            pts = [r.curves[key] for r in done if r.curves.get(key)]
            steps, mu, lo, hi = _band(pts)
            if not steps:
                continue
            few = len(steps) <= FEW_POINTS  # a marker at each point: one evaluation is a dot, not an empty panel
            ax.plot(steps, mu, color=cmap[v.name], label=f"{v.name} (n={len(pts)})", lw=1.6,
                    marker="o" if few else None, ms=5 if len(steps) == 1 else 3.5)
            if len(pts) > 1:
                ax.fill_between(steps, lo, hi, color=cmap[v.name], alpha=0.18, lw=0)
    ax_v.set_title("validation bits/byte (mean; band: min–max over seeds)", fontsize=10)
    ax_t.set_title("training loss, nats/token (mean; band: min–max)", fontsize=10)
    for ax in (ax_v, ax_t):
        ax.set_xlabel("step")
        ax.set_xlim(left=0)  # a single evaluation sits at its step, not centred in an axis of its own
        ax.grid(alpha=0.3)
    _zoom(ax_v, rep, "val_bpb")
    _zoom(ax_t, rep, "loss")
    ax_v.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    return png(fig)


def _zoom(ax: Any, rep: SweepReport, key: str) -> None:
    """Clip the y range to the second half of training so early-step values do not flatten the differences."""
    tails = []
    for r in rep.runs:
        pts = r.curves.get(key) or []
        if len(pts) >= 2 and r.row["status"] != "diverged":
            last = pts[-1][0]
            tails += [v for s, v in pts if s >= last / 2]
    if tails:
        lo, hi = min(tails), max(tails)
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
        pts = run.curves[k]
        ax.plot([s for s, _ in pts], [v for _, v in pts], marker="." if len(pts) < 60 else None, lw=1.3)
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


def variant_colors(rep: SweepReport) -> dict[str, Any]:
    """Each variant's colour, the same in every figure of a report."""
    return colors(variant_order(rep))


__all__ = ["colors", "curves_png", "diag_png", "extrapolation_png", "ranking_png", "variant_colors", "variant_order",
           "VariantResult"]
