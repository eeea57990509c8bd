"""Figures of the learning-rate section (PNG bytes, matplotlib Figure + Agg; see normlab.report.plots)."""

from __future__ import annotations

import math
import textwrap
from typing import Any

from matplotlib.figure import Figure

from normlab.experiments.lrgrid import SIGNALS, GridReport, GridRun, signal_at_end, signal_series
from normlab.report.figures import LEGEND_OUTSIDE, ci_rows_png, png


SIGNAL_COLUMNS = 3  # panels per row of the instability strip


def loss_vs_lr_png(gr: GridReport, cmap: dict[str, Any]) -> bytes | None:
    """Final validation bits/byte against the learning rate (log x), per variant: mean over seeds of the capped loss
    (``min(L, L_init)``), a min–max band over seeds, and red crosses where a run diverged (scored at its L_init).
    The y range is set by the trained losses (the runs that ended below their L_init): the loss at initialisation,
    usually far above them, is a dotted line when it falls inside that range, else an arrow and its value at the top
    edge, where diverged runs' crosses are drawn too, so that it does not flatten the variants into one line."""
    if not gr.is_grid:
        return None
    fig = Figure(figsize=(8.5, 4.8))
    ax = fig.add_subplot()
    inits, trained, any_div, div_pts = [], [], False, []
    for g in gr.groups:
        curve = g.mean_curve()
        if not curve:
            continue
        lrs = sorted(curve)
        mu = [curve[lr][0] for lr in lrs]
        n = len(g.seeds)
        ax.plot(lrs, mu, marker="o", ms=4, lw=1.6, color=cmap.get(g.name), label=f"{g.name} (n={n})")
        if n > 1:
            ax.fill_between(lrs, [curve[lr][1] for lr in lrs], [curve[lr][2] for lr in lrs], color=cmap.get(g.name),
                            alpha=0.15, lw=0)
        for s in g.seeds:
            inits.append(s.init)
            for lr, v in s.losses.items():
                if v is None:
                    any_div = True
                    div_pts.append((lr, s.init))
                elif s.init is None or v < s.init:
                    trained.append(v)
    ax.set_xscale("log")
    init = sum(inits) / len(inits) if inits and None not in inits else None
    lo, hi = (min(trained), max(trained)) if trained else (None, None)
    if lo is not None:
        pad = 0.08 * (hi - lo or 0.5)
        top = hi + pad if init is None or init > hi + pad else max(hi, init) + pad
        ax.set_ylim(lo - pad, top)
    top = ax.get_ylim()[1]
    for lr, v in div_pts:  # drawn at its L_init, or at the top edge when that is above the range
        ax.scatter([lr], [min(v, top) if v is not None else top], marker="x", s=46, color="#c0392b", zorder=5,
                   clip_on=False)
    above = False
    for g in gr.groups:  # a mean above the range (collapsed or diverged seeds): a triangle on the top edge
        curve = g.mean_curve()
        out = [lr for lr in sorted(curve) if curve[lr][0] > top]
        if out:
            above = True
            ax.scatter(out, [top] * len(out), marker="^", s=52, color=cmap.get(g.name), edgecolors="#222",
                       linewidths=0.6, zorder=6, clip_on=False)
    if init is not None and init <= top:
        ax.axhline(init, color="#888", ls=":", lw=1)
        ax.text(ax.get_xlim()[0], init, " loss at initialisation", va="bottom", fontsize=8, color="#666")
    elif init is not None:
        ax.annotate(f"loss at initialisation {init:.2f} (above)", xy=(0.99, 1.0), xycoords="axes fraction",
                    xytext=(0.99, 0.9), textcoords="axes fraction", ha="right", va="top", fontsize=8, color="#666",
                    arrowprops={"arrowstyle": "->", "color": "#888"})
    ax.set_xlabel("peak learning rate")
    ax.set_ylabel("final validation bits/byte, min(L, L_init)")
    ax.set_title("mean over seeds; band: min–max over seeds" + ("; x: diverged (scored at L_init)" if any_div else "")
                 + ("; ▲ on the top edge: mean above the range" if above else ""), fontsize=9)
    ax.grid(alpha=0.3, which="both")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(**LEGEND_OUTSIDE)
    fig.tight_layout()
    return png(fig)


def sensitivity_png(gr: GridReport, cmap: dict[str, Any]) -> bytes | None:
    """LR sensitivity per variant with its 95% interval over seeds (sorted by the ranking)."""
    ranked = sorted((g for g in gr.groups if g.sensitivity is not None), key=lambda g: g.rank or 0)
    if not gr.is_grid or not ranked:
        return None
    return ci_rows_png([(g.name, g.sensitivity.mean, g.sensitivity.half, [s.sensitivity for s in g.seeds],
                         cmap.get(g.name)) for g in ranked],
                       "LR sensitivity, bits/byte (dot: mean, bar: 95% CI, x: seeds)")


def flat_signals(gr: GridReport) -> dict[str, float]:
    """``{signal: value}`` of the signals every run recorded with one and the same value at its last diagnostic
    step (Softmax Collapse at 0 when no softmax collapsed): a flat panel shows nothing, so the report says it in a
    sentence instead."""
    runs = [r for g in gr.groups for r in g.runs]
    out = {}
    for k in SIGNALS:
        vals = [v for v in (signal_at_end(r, k) for r in runs) if v is not None]
        if vals and max(vals) == min(vals):
            out[k] = vals[0]
    return out


def signals_vs_lr_png(gr: GridReport, cmap: dict[str, Any]) -> bytes | None:
    """Instability signals at the end of training against the learning rate, per variant (mean over seeds): one
    panel per signal, at most ``SIGNAL_COLUMNS`` to a row, each about 4.3 x 3.3 inches so that, shown at the page's
    width, its text is as large as the page's (a row of five was too small to read)."""
    from matplotlib.ticker import LogLocator

    runs = [r for g in gr.groups for r in g.runs]
    flat = flat_signals(gr)  # a sentence in the report, not a flat panel
    have = [k for k in SIGNALS if k not in flat and any(signal_at_end(r, k) is not None for r in runs)]
    if not gr.is_grid or not have:
        return None
    cols = min(SIGNAL_COLUMNS, len(have))
    rows = math.ceil(len(have) / cols)
    fig = Figure(figsize=(4.3 * cols, 3.3 * rows + 0.3))
    grid = fig.subplots(rows, cols, squeeze=False)
    axes = [grid[i // cols][i % cols] for i in range(len(have))]
    for ax in [a for row in grid for a in row][len(have):]:
        ax.set_visible(False)
    for ax, key in zip(axes, have):
        for g in gr.groups:
            pts = {}
            for r in g.runs:
                v = signal_at_end(r, key)
                if v is not None:
                    pts.setdefault(r.lr, []).append(v)
            if pts:
                lrs = sorted(pts)
                ax.plot(lrs, [sum(pts[lr]) / len(pts[lr]) for lr in lrs], marker="o", ms=3, color=cmap.get(g.name),
                        label=g.name, lw=1.4)
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(LogLocator(base=10, numticks=4))  # decades only: no overlapping labels
        ax.locator_params(axis="y", nbins=5)
        ax.set_xlabel("peak learning rate", fontsize=9)
        ax.set_title(textwrap.fill(SIGNALS[key], 42), fontsize=9.5)
        ax.tick_params(labelsize=8.5)
        ax.grid(alpha=0.3, which="both")
    axes[cols - 1].legend(*axes[0].get_legend_handles_labels(), **LEGEND_OUTSIDE)  # right of the first row
    fig.suptitle("instability signals at the last diagnostic step, mean over seeds", fontsize=10.5)
    fig.tight_layout()
    return png(fig)


def _signal_groups(gr: GridReport, key: str) -> tuple[list, dict[float, Any]]:
    """The variants that recorded signal ``key``, and a viridis colour per learning rate of theirs."""
    groups = [g for g in gr.groups if any(signal_series(r.curves).get(key) for r in g.runs)]
    if not groups:
        return [], {}
    import matplotlib

    lrs = sorted({r.lr for g in groups for r in g.runs})
    cm = matplotlib.colormaps["viridis"]
    return groups, {lr: cm(i / max(1, len(lrs) - 1)) for i, lr in enumerate(lrs)}


def _first_seed_per_lr(g: Any) -> list[tuple[float, GridRun]]:
    """``(lr, run)`` of the lowest seed at each learning rate of variant ``g``, by learning rate."""
    first: dict[float, GridRun] = {}
    for r in sorted(g.runs, key=lambda r: r.seed):
        first.setdefault(r.lr, r)
    return sorted(first.items())


def signals_vs_step_png(gr: GridReport, key: str) -> bytes | None:
    """One panel per variant: the signal against the training step, one line per learning rate (seed 0 of each
    learning rate, or its first seed), diverged runs dashed."""
    groups, color = _signal_groups(gr, key)
    if not groups:
        return None
    cols = min(4, len(groups))
    rows = math.ceil(len(groups) / cols)
    fig = Figure(figsize=(3.6 * cols, 2.8 * rows + 0.4))
    axes = fig.subplots(rows, cols, squeeze=False)
    for i, g in enumerate(groups):
        ax = axes[i // cols][i % cols]
        for lr, r in _first_seed_per_lr(g):
            pts = signal_series(r.curves).get(key)
            if pts:
                ax.plot([s for s, _ in pts], [v for _, v in pts], color=color[lr], lw=1.3,
                        ls="--" if r.diverged else "-", label=f"lr {lr:g}")
        ax.set_title(g.name, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    for j in range(len(groups), rows * cols):
        axes[j // cols][j % cols].set_visible(False)
    axes[0][cols - 1].legend(*axes[0][0].get_legend_handles_labels(), **{**LEGEND_OUTSIDE, "fontsize": 7})
    fig.suptitle(SIGNALS[key] + " against step (first seed; dashed: diverged)", fontsize=10)
    fig.tight_layout()
    return png(fig)


def loss_and_signal_vs_step_png(gr: GridReport, key: str) -> bytes | None:
    """Training loss (top row) and a signal (bottom row, e.g. ``tev_mean``) against the step, one column per variant,
    one line per learning rate (first seed), diverged runs dashed: the signal beside the loss it should anticipate
    (Chung et al. 2024: TEV rises with the instability that precedes loss spikes)."""
    groups, color = _signal_groups(gr, key)
    if not groups:
        return None
    cols = min(4, len(groups))
    fig = Figure(figsize=(3.6 * cols, 5.4))
    axes = fig.subplots(2, cols, squeeze=False, sharex="col")
    for i, g in enumerate(groups[:cols]):
        for lr, r in _first_seed_per_lr(g):
            ls = "--" if r.diverged else "-"
            loss = r.curves.get("loss") or []
            axes[0][i].plot([s for s, _ in loss], [v for _, v in loss], color=color[lr], lw=1.1, ls=ls,
                            label=f"lr {lr:g}")
            pts = signal_series(r.curves).get(key) or []
            axes[1][i].plot([s for s, _ in pts], [v for _, v in pts], color=color[lr], lw=1.3, ls=ls)
        axes[0][i].set_title(g.name, fontsize=9)
        axes[0][i].set_ylabel("training loss (nats)", fontsize=8)
        axes[1][i].set_ylabel(key, fontsize=8)
        axes[1][i].set_xlabel("step", fontsize=8)
        for ax in (axes[0][i], axes[1][i]):
            ax.tick_params(labelsize=7)
            ax.grid(alpha=0.3)
    most = max(range(min(cols, len(groups))), key=lambda i: len({r.lr for r in groups[i].runs}))
    last = min(cols, len(groups)) - 1  # the panel with the most learning rates names them, right of the top row
    axes[0][last].legend(*axes[0][most].get_legend_handles_labels(), **{**LEGEND_OUTSIDE, "fontsize": 7})
    fig.suptitle(SIGNALS[key] + " beside the training loss (first seed; dashed: diverged)", fontsize=10)
    fig.tight_layout()
    return png(fig)
