"""Figure helpers shared by the report's plots (normlab.report.plots, lrplots, scaling_section): colours, PNG
bytes from a matplotlib ``Figure`` (Agg canvas: no global backend switch, no display), the CI-rows chart. They
know nothing of a report's analysis, so every plotting module can import them."""

from __future__ import annotations

import io
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

DPI = 110


LEGEND_OUTSIDE = {"loc": "upper left", "bbox_to_anchor": (1.01, 1.0), "borderaxespad": 0.0, "fontsize": 8}
"""A legend to the right of its axes, never over the data (the saved PNG is cropped to include it)."""


def colors(names: list[str]) -> dict[str, Any]:
    import matplotlib

    cmap = matplotlib.colormaps["tab10" if len(names) <= 10 else "tab20"]
    return {n: cmap(i % cmap.N) for i, n in enumerate(names)}


def png(fig: Figure) -> bytes:
    """``fig`` as PNG bytes at ``DPI``, with absolute tick labels."""
    FigureCanvasAgg(fig)
    for ax in fig.axes:  # absolute tick labels: offsets such as "1e-6+4.039" hide the values
        try:
            ax.ticklabel_format(axis="y", useOffset=False)
        except AttributeError:  # log axes have no offset formatter
            pass
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight")
    return buf.getvalue()


def ci_rows_png(rows: list[tuple[str, float, float | None, list[float], Any]], xlabel: str) -> bytes:
    """One row per entry ``(name, mean, CI half-width, per-seed values, colour)``, top to bottom in the given
    order: the mean as a dot with its 95% interval as a bar and each seed as an x."""
    fig = Figure(figsize=(7.5, 0.45 * len(rows) + 1.3))
    ax = fig.add_subplot()
    for i, (_, m, half, seeds, colour) in enumerate(rows):
        y = len(rows) - 1 - i
        h = half or 0.0
        ax.errorbar([m], [y], xerr=[[h], [h]], fmt="o", color=colour, capsize=4, lw=1.6)
        ax.scatter(seeds, [y] * len(seeds), marker="x", color=colour, alpha=0.6, s=18)
    ax.set_yticks(range(len(rows)), [r[0] for r in reversed(rows)])
    ax.set_xlabel(xlabel)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return png(fig)
