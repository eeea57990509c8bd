"""The report's "Scaling" section (HTML + Markdown + one PNG) for a sweep over model sizes: loss vs parameters on
log-log axes per variant with the fitted ``L(N)`` and its 95% bootstrap band, the fitted parameters, the forecast
table (differences at 10x and 100x the largest size), crossovers, and the signal-to-noise of every comparison."""

from __future__ import annotations

from typing import Any

import numpy as np
from matplotlib.figure import Figure as MplFigure

from normlab.report import scaling_fit as sf
from normlab.report.analysis import SweepReport
from normlab.report.document import Bullets, Figure, Note, Paragraph, Section, Subheading, Table
from normlab.report.figures import colors, png
from normlab.report.scaling import FACTORS, NOISE_LAST_N, ScalingAnalysis, analyse, is_size_sweep

PNG = "report_scaling.png"


def scaling_png(an: ScalingAnalysis) -> bytes | None:
    curves = [c for c in an.curves if any(p.losses for p in c.points)]
    if not curves:
        return None
    cmap = colors([c.name for c in curves])
    fig = MplFigure(figsize=(8.5, 5.2))
    ax = fig.add_subplot()
    horizon = FACTORS[-1] * an.n_max
    grid = np.geomspace(an.n_min / 1.5, horizon, 200)
    for c in curves:
        col = cmap[c.name]
        for p in c.points:
            ax.scatter([p.params] * len(p.losses), list(p.losses.values()), color=col, marker="x", s=16, alpha=0.55)
        done = [p for p in c.points if p.losses]
        ax.scatter([p.params for p in done], [p.mean for p in done], color=col, s=30, zorder=3,
                   label=f"{c.name}" + ("" if c.fit and not c.fit.issues() else " (degenerate fit: not extrapolated)"
                                        if c.fit else " (no fit)"))
        if c.fit is None:
            continue
        inside = grid <= an.n_max * 1.0001
        ax.plot(grid[inside], c.fit.law(grid[inside]), color=col, lw=1.6)
        if c.fit.issues():  # a degenerate fit forecasts nothing: no extrapolation, no band
            continue
        ax.plot(grid[~inside], c.fit.law(grid[~inside]), color=col, lw=1.4, ls="--")
        reps = [r for r in c.fit.replicates if r is not None]
        if len(reps) >= 10:
            vals = np.stack([r(grid) for r in reps])
            lo, hi = np.quantile(vals, [0.025, 0.975], axis=0)
            ax.fill_between(grid, lo, hi, color=col, alpha=0.15, lw=0)
    ax.axvline(an.n_max, color="0.6", lw=0.8, ls=":")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("non-embedding parameters N (dotted line: largest trained size; dashed: forecast)")
    ax.set_ylabel("final validation bits/byte")
    ax.set_title("Loss vs parameters: seeds (x), means (dots), fitted E + A N^-alpha with 95% bootstrap band",
                 fontsize=10)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return png(fig)


def _num(x: float | None, fmt: str = ".4f") -> str:
    return "–" if x is None else format(x, fmt)


def _iv(iv: Any, fmt: str = ".3g") -> str:
    return "–" if not iv else f"{format(iv[0], fmt)} – {format(iv[1], fmt)}"


def _snr(x: float | None) -> str:
    return "–" if x is None else (f"{x:.1f}" + (" ⚠" if x < 1 else ""))


def tables(an: ScalingAnalysis) -> dict[str, tuple[list[str], list[list[str]]]]:
    """The section's tables as header + string cells (shared by HTML and Markdown)."""
    out: dict[str, tuple[list[str], list[list[str]]]] = {}
    rows = []
    for c in an.curves:
        if c.fit is None:
            rows.append([c.name, "–", "–", "–", "–", "–", "–", c.fit_error or "", "no fit"])
            continue
        p = c.fit.law
        issues = c.fit.issues()
        rows.append([c.name, f"{p.E:.4f}" if p.E >= 1e-4 else f"{p.E:.2g}", _iv(c.fit.interval("E"), ".4f"),
                     f"{p.A:.4g}", _iv(c.fit.interval("A")), f"{p.alpha:.4f}", _iv(c.fit.interval("alpha"), ".4f"),
                     f"{c.fit.n_points} runs, {c.fit.n_sizes} sizes",
                     ("⚠ degenerate: " + "; ".join(issues)) if issues else "ok"])
    out["fits"] = (["variant", "E", "E 95%", "A", "A 95%", "alpha", "alpha 95%", "data", "fit"], rows)

    rows = []
    for c in an.curves:
        for p in c.points:
            rows.append([c.name, p.size, f"{p.params:,}", f"{p.tokens:,}", f"{p.lr:g}",
                         _num(p.mean), str(len(p.losses)), str(p.diverged + p.unfinished),
                         "—" if p.head_norm is None else f"{p.head_norm:.3g}"])
    out["points"] = (["variant", "size", "N (non-emb.)", "tokens", "lr", "mean val bpb", "seeds ok",
                      "diverged / unfinished", "head RMS->inf norm"], rows)

    rows = []
    for cmp in an.comparisons:
        obs = cmp["observed"][-1] if cmp["observed"] else None
        cells = [f"{cmp['a']} − {cmp['b']}",
                 f"{obs['diff']:+.4f} ({obs['size']})" if obs else "–",
                 _snr(obs["seed_snr"]) if obs else "–", _snr(obs["step_snr"]) if obs else "–"]
        for f in cmp.get("forecast", [{"diff": None, "ci95": None, "resolvable": True}] * len(FACTORS)):
            if f["diff"] is None:
                cells.append("–")
            elif not f["resolvable"]:
                cells.append(f"not resolvable (degenerate fit; it gives {f['diff']:+.3f})")
            else:
                cells.append(f"{f['diff']:+.3f} [{_iv(f['ci95'], '+.3f')}]")
        cells.append(cmp["crossover"]["text"] if "crossover" in cmp else "no fit for one of the two")
        rows.append(cells)
    out["forecast"] = (["a − b (bits/byte)", "measured at largest size", "seed SNR", "step SNR",
                        *[f"forecast at {f}x N_max [95%]" for f in FACTORS], "crossover"], rows)

    rows = []
    for cmp in an.comparisons:
        for o in cmp["observed"]:
            rows.append([f"{cmp['a']} − {cmp['b']}", o["size"], f"{o['params']:,}", f"{o['diff']:+.4f}",
                         _snr(o["seed_snr"]), _snr(o["step_snr"]),
                         "–" if o["welch_p"] is None else f"{o['welch_p']:.2g}",
                         "–" if o.get("p_adj") is None else f"{o['p_adj']:.2g}" + (" ✓" if o["decisive"] else "")])
    out["snr"] = (["comparison", "size", "N", "difference", "seed SNR", "step SNR", "Welch p",
                   f"{an.correction} p"], rows)
    out["confounds"] = (["confound", "what the design varies with size"],
                        [[c["kind"], c["text"]] for c in an.confounds])
    return out


NOTES = {
    "fits": "L(N) = E + A·N^−alpha fitted to the mean over completed seeds at each size by a Huber loss on log loss "
    "with L-BFGS "
    "(Hoffmann et al. 2022; delta = max(1e-3, 1.345 standard errors of a size's mean)); intervals: 95% "
    "percentile bootstrap over seeds.",
    "forecast": "Difference a − b (negative: a has the lower loss) measured at the largest trained size, and "
                "forecast by the two fits at 10x and 100x it, with paired-bootstrap 95% intervals. A crossover is "
                "where the fitted curves intersect between the smallest size and 100x the largest; it counts as "
                "resolved when at least 95% (or at most 5%) of bootstrap fits agree and, within the trained range, "
                "when measured differences of opposite sign that are decisive (Welch p adjusted over the sweep's "
                "family "
                "of per-size tests, Holm by default, < 0.05) bracket it; 'measured crossover' means the measured "
                "sign flips between two decisive sizes; a sign change decisive only before the correction is not "
                "resolvable. The design's confounds are named next to every crossover. Forecasts and "
                "crossovers from a degenerate fit (a parameter at its bound, or a zero-width bootstrap interval) "
                "are not resolvable.",
    "snr": f"Seed SNR: |difference| / pooled seed-to-seed sd. Step SNR (Heineman et al. 2025): relative difference "
           f"/ mean relative sd of each run's last {NOISE_LAST_N} validation evaluations. ⚠ marks SNR < 1: the "
           "difference is smaller than the noise, so that small-scale conclusion is not trustworthy. Welch p: "
           "Welch's t-test over seeds; the next column adjusts it over every pair and size of the sweep (its "
           "correction); ✓: decisive (adjusted p < 0.05).",
    "confounds": "What changes with size besides N (normlab.report.scaling_design): depth with width, one learning "
                 "rate at every size, tokens per parameter below 20 or varying across sizes. A crossover or "
                 "forecast across such sizes may be an effect of the confound, not of size.",
}


TITLES = {"fits": "Fitted scaling laws", "forecast": "Forecasts and crossovers", "snr": "Signal-to-noise per size",
          "confounds": "Design confounds", "points": "Points"}


def nd_lines(an: ScalingAnalysis) -> list[str]:
    """One sentence per joint ``L(N, D)`` fit (or why it failed)."""
    out = []
    for nd in an.nd_fits:
        if "error" in nd:
            out.append(f"L(N, D) for {nd['variant']}: {nd['error']}.")
            continue
        p = nd["params"]
        out.append(f"L(N, D) for {nd['variant']}: {p['E']:.4f} + {p['A']:.4g} N^-{p['alpha']:.4f} + "
                   f"{p['B']:.4g} D^-{p['beta']:.4f} (alpha 95% {_iv(nd['ci95']['alpha'], '.4f')}, beta 95% "
                   f"{_iv(nd['ci95']['beta'], '.4f')}; {nd['n_points']} runs)"
                   + (f" ⚠ degenerate fit: {'; '.join(nd['issues'])}." if nd.get("issues") else "."))
    return out


def sections(rep: SweepReport) -> list[Section]:
    """The scaling section of a size sweep; none when the sweep does not span >= 3 sizes."""
    if not is_size_sweep(rep):
        return []
    an = analyse(rep)
    blocks: list[Any] = [Bullets(an.summary), Figure(PNG, "loss vs parameters", scaling_png(an))]
    tabs = tables(an)
    for key in ("fits", "forecast", "confounds", "snr", "points"):
        head, rows = tabs[key]
        if not rows:
            continue
        left = {i for i, c in enumerate(head) if i == 0 or c == "crossover"}
        blocks += [Subheading(TITLES[key]), Table(head, rows, left=left, md_left={0}, class_every_cell=True)]
        blocks += [Note(NOTES[key])] if key in NOTES else []
    blocks += [Paragraph(line) for line in nd_lines(an)]
    return [Section("Scaling", blocks)]


__all__ = ["sections", "scaling_png", "tables", "sf"]
