"""The report's leading learning-rate section (HTML and Markdown) and its summary sentences, from a GridReport."""

from __future__ import annotations

import html
from typing import Any

from normlab.report import lrplots
from normlab.report.lrgrid import STABLE_MARGIN, GridReport, PairedRow
from normlab.stats import MeanCI, t_ppf


def _ci(ci: MeanCI | None, digits: int = 3) -> str:
    if ci is None:
        return "–"
    return f"{ci.mean:.{digits}f} ± {ci.half:.{digits}f}" if ci.half is not None else f"{ci.mean:.{digits}f} (n=1)"


def _lr_ci(ci: MeanCI | None) -> str:
    """Best learning rate: geometric mean over seeds, ×/÷ the 95% interval factor."""
    if ci is None:
        return "–"
    base = f"{10 ** ci.mean:.3g}"
    return f"{base} ×/÷ {10 ** ci.half:.2g}" if ci.half else base


def _range(lrs: list[float]) -> str:
    if not lrs:
        return "none"
    return f"{lrs[0]:g}" if len(lrs) == 1 else f"{lrs[0]:g} – {lrs[-1]:g}"


def ranking_cells(gr: GridReport) -> tuple[list[str], list[list[str]]]:
    head = ["#", "variant", "LR sensitivity (bits/byte)", "best val bits/byte", "best lr", "stable range",
            "stable width (decades)", "diverged", "seeds"]
    rows = []
    for g in sorted(gr.groups, key=lambda g: (g.rank is None, g.rank or 0)):
        div = g.diverged_at()
        n_runs = len(g.runs)
        div_txt = (f"{sum(div.values())}/{n_runs}" + (f" (lr ≥ {min(div):g})" if div else "")) if n_runs else "–"
        rows.append([str(g.rank or "–"), g.name, _ci(g.sensitivity), _ci(g.best), _lr_ci(g.log10_best_lr),
                     _range(g.stable_range()), _ci(g.stable_decades, 2), div_txt, str(len(g.seeds))])
    return head, rows


def paired_cells(gr: GridReport) -> tuple[list[str], list[list[str]]]:
    head = ["variant", "metric", f"Δ vs {gr.baseline} (bits/byte)", "p", "test", "n", "reading"]
    rows = []
    for r in gr.paired:
        d = r.diff
        delta = f"{d.mean:+.3f} ± {d.half:.3f}" if d.half is not None else f"{d.mean:+.3f}"
        p = "–" if d.p is None else ("< 0.001" if d.p < 0.001 else f"{d.p:.3f}")
        test = "paired t" if d.paired else "Welch"
        rows.append([r.variant, r.metric, delta, p, test, str(d.n), _reading(r)])
    return head, rows


def _need(r: PairedRow) -> str | None:
    """How many seeds would resolve ``r`` at 80% power, as words; None when there is nothing to resolve."""
    if r.seeds_needed:
        return f"~{r.seeds_needed} seeds"
    if r.seeds_needed_more_than:
        return f"more than {r.seeds_needed_more_than} seeds"
    return None


def _reading(r: PairedRow) -> str:
    v = r.verdict
    if v == "within noise":
        need = _need(r)
        return f"within noise; {need + ' to resolve (80% power)' if need else 'no difference to resolve'}"
    return v


def summary(gr: GridReport, counts: dict[str, int]) -> list[str]:
    """Sentences stating what the grid numbers show (nothing else)."""
    out: list[str] = []
    seeds = sorted({s.seed for g in gr.groups for s in g.seeds})
    n_runs = sum(counts.values())
    status = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    out.append(f"{len(gr.groups)} variants × {len(gr.lrs)} learning rates ({gr.lrs[0]:g} to {gr.lrs[-1]:g}) × "
               f"{len(seeds)} seed{'s' if len(seeds) != 1 else ''} = {n_runs} runs ({status}).")
    ranked = sorted((g for g in gr.groups if g.sensitivity is not None), key=lambda g: g.rank or 0)
    if not ranked:
        out.append("No variant has a finished grid yet, so nothing is ranked.")
        return out
    lo, hi = ranked[0], ranked[-1]
    out.append(f"Lowest LR sensitivity: {lo.name}, {_ci(lo.sensitivity)} bits/byte; highest: {hi.name}, "
               f"{_ci(hi.sensitivity)} (mean ± 95% CI over seeds of mean_lr[min(L, L_init) − L*]).")
    best = min(ranked, key=lambda g: g.best.mean)
    out.append(f"Lowest best-of-grid loss: {best.name}, {_ci(best.best)} bits/byte at lr {_lr_ci(best.log10_best_lr)}.")
    for metric in ("LR sensitivity", "best loss", "loss at each (seed, lr)"):
        cap = metric[0].upper() + metric[1:]
        rows = [r for r in gr.paired if r.metric == metric]
        if not rows:
            continue
        lower = [f"{r.variant} ({r.diff.mean:+.3f} ± {r.diff.half:.3f})" for r in rows if r.verdict == "lower"]
        higher = [f"{r.variant} ({r.diff.mean:+.3f} ± {r.diff.half:.3f})" for r in rows if r.verdict == "higher"]
        noise = [f"{r.variant} ({r.diff.mean:+.3f} ± {r.diff.half:.3f}"
                 + (f", {_need(r)} to resolve" if _need(r) else "") + ")"
                 for r in rows if r.verdict == "within noise"]
        cells = metric.startswith("loss at each")
        unit = "(seed, lr) cells" if cells else "seeds"
        how = f"paired over {unit}" if all(r.diff.paired for r in rows) else f"paired over {unit} where possible, else Welch"
        if cells:  # the learning rates of one seed share its initialisation and batches: not independent samples
            how += "; descriptive, as the cells of one seed are not independent"
        beyond = "" if cells else " beyond noise"
        if lower:
            out.append(f"{cap} lower than {gr.baseline}{beyond} ({how}): " + "; ".join(lower) + ".")
        if higher:
            out.append(f"{cap} higher than {gr.baseline}{beyond} ({how}): " + "; ".join(higher) + ".")
        if noise:
            out.append(f"{cap} within noise of {gr.baseline} ({how}; seeds needed at 80% power from the "
                       "observed spread): " + "; ".join(noise) + ".")
    for g in gr.groups:
        div = g.diverged_at()
        if div:
            at = ", ".join(f"{lr:g} ({n}/{sum(1 for r in g.runs if r.lr == lr)})" for lr, n in div.items())
            out.append(f"{g.name} diverged at lr {at}; those runs score their loss at initialisation.")
    ns = sorted({len(g.seeds) for g in ranked if len(g.seeds) >= 2})
    if ns:
        qs = ", ".join(f"t = {t_ppf(0.975, n - 1):.2f} for n = {n}" for n in ns)
        out.append(f"Intervals over seeds use the Student-t quantile ({qs}).")
    return out


def paired_summary(gr: GridReport) -> list[str]:
    """For a sweep at one learning rate: the paired comparisons with the baseline, as sentences."""
    out = []
    for r in gr.paired:
        d = r.diff
        if d.half is None:
            continue
        test = "paired over seeds" if d.paired else "Welch, unpaired"
        tail = (f"; {_need(r)} would resolve it at 80% power" if r.verdict == "within noise" and _need(r) else "")
        out.append(f"{r.variant} − {r.baseline}: {d.mean:+.4f} ± {d.half:.4f} bits/byte ({test}, n = {d.n}): "
                   f"{r.verdict}{tail}.")
    return out


def figures(gr: GridReport, cmap: dict[str, Any]) -> dict[str, tuple[bytes | None, str]]:
    return {
        "report_lr_loss.png": (lrplots.loss_vs_lr_png(gr, cmap), "Final validation bits/byte against learning rate"),
        "report_lr_sensitivity.png": (lrplots.sensitivity_png(gr, cmap), "LR sensitivity per variant"),
        "report_lr_signals.png": (lrplots.signals_vs_lr_png(gr, cmap), "Instability signals against learning rate"),
        "report_signal_attn.png": (lrplots.signals_vs_step_png(gr, "attn_logit_max"),
                                   "Attention logit growth against step"),
        "report_signal_lse.png": (lrplots.signals_vs_step_png(gr, "output_lse"), "Output logsumexp against step"),
        "report_signal_tev.png": (lrplots.loss_and_signal_vs_step_png(gr, "tev_mean"),
                                  "Token Embedding Variability beside the training loss against step"),
    }


NOTE = (f"LR sensitivity (Wortsman et al. 2023, arXiv:2309.14322): the mean over the learning-rate grid of "
        f"min(L, L_init) − L*, with L the final validation bits/byte, L_init the loss at initialisation (a diverged "
        f"run scores L_init) and L* the best of the grid; per seed, then mean ± 95% Student-t interval over seeds. "
        f"Stable range: learning rates where no seed diverged and the seed-mean loss is within {STABLE_MARGIN} "
        f"bits/byte of the best; its width in decades is per seed. Best lr: geometric mean over seeds ×/÷ the "
        f"interval factor.")
PAIRED_NOTE = ("Δ = variant − baseline; a seed gives every variant the same batches and validation windows, so "
               "differences are paired by seed (and by (seed, lr) cell); Welch's interval only where two variants "
               "share fewer than 2 seeds. 'within noise' means the 95% interval contains 0; the seed count is what "
               "the observed spread of the differences needs to resolve the observed difference with 80% power.")


SIGNAL_FIGURES = ("report_lr_signals.png", "report_signal_attn.png", "report_signal_lse.png", "report_signal_tev.png")


def html_section(gr: GridReport, img) -> list[str]:
    e = html.escape
    out: list[str] = []
    if gr.is_grid:
        out.append("<h2>Learning-rate sweep</h2>" + img("report_lr_loss.png"))
        head, rows = ranking_cells(gr)
        out.append(_html_table(head, rows, best_first=True))
        out.append(f"<div class='note'>{e(NOTE)}</div>" + img("report_lr_sensitivity.png"))
    if gr.paired:
        head, rows = paired_cells(gr)
        out.append(f"<h2>Paired differences vs {e(str(gr.baseline))}</h2>" + _html_table(head, rows))
        out.append(f"<div class='note'>{e(PAIRED_NOTE)}</div>")
    sig = [img(n) for n in SIGNAL_FIGURES]
    if any(sig):
        out.append("<h2>Instability signals</h2><div class='note'>Recorded every diag.every steps "
                   "(normlab.diagnostics.instability): attention logit growth and output logit divergence "
                   "(Wortsman et al. 2023), Softmax Collapse (Prieto et al. 2025), Token Embedding Variability "
                   "(Chung et al. 2024) and the output layer's RMS->inf norm (Filatov et al. 2025).</div>" + "".join(sig))
    return out


def md_section(gr: GridReport, mdimg) -> list[str]:
    out: list[str] = []
    if gr.is_grid:
        out += ["## Learning-rate sweep", ""] + mdimg("report_lr_loss.png")
        out += [_md_table(*ranking_cells(gr)), "", NOTE, ""] + mdimg("report_lr_sensitivity.png")
    if gr.paired:
        out += [f"## Paired differences vs {gr.baseline}", "", _md_table(*paired_cells(gr)), "", PAIRED_NOTE, ""]
    sig = [x for n in SIGNAL_FIGURES for x in mdimg(n)]
    if sig:
        out += ["## Instability signals", ""] + sig
    return out


LEFT = ("variant", "metric", "reading", "stable range")


def _html_table(head: list[str], rows: list[list[str]], best_first: bool = False) -> str:
    e = html.escape
    cls = ["l" if c in LEFT else "" for c in head]
    h = ["<table><tr>" + "".join(f"<th class='{k}'>{e(c)}</th>" for k, c in zip(cls, head)) + "</tr>"]
    for j, r in enumerate(rows):
        row_cls = "best" if best_first and j == 0 and r[0] == "1" else ""
        h.append(f"<tr class='{row_cls}'>" + "".join(f"<td class='{k}'>{e(c)}</td>" for k, c in zip(cls, r)) + "</tr>")
    return "".join(h) + "</table>"


def _md_table(head: list[str], rows: list[list[str]]) -> str:
    align = [":---" if c in LEFT else "---:" for c in head]
    lines = ["| " + " | ".join(head) + " |", "| " + " | ".join(align) + " |"]
    lines += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows]
    return "\n".join(lines)


def rows_json(gr: GridReport) -> dict[str, Any]:
    """The section as plain values (``--json`` output, tests)."""
    def ci(c: MeanCI | None) -> dict | None:
        return None if c is None else {"mean": c.mean, "ci95": c.half, "n": c.n}

    return {
        "baseline": gr.baseline, "learning_rates": gr.lrs, "is_grid": gr.is_grid,
        "variants": [{"variant": g.name, "rank": g.rank, "lr_sensitivity": ci(g.sensitivity), "best_val_bpb": ci(g.best),
                      "best_lr": None if g.log10_best_lr is None else 10 ** g.log10_best_lr.mean,
                      "stable_range": g.stable_range(), "stable_decades": ci(g.stable_decades),
                      "diverged": {f"{k:g}": v for k, v in g.diverged_at().items()},
                      "seeds": [{"seed": s.seed, "lr_sensitivity": s.sensitivity, "best_val_bpb": s.best,
                                 "best_lr": s.best_lr, "init_val_bpb": s.init,
                                 "losses": {f"{k:g}": v for k, v in s.losses.items()}} for s in g.seeds]}
                     for g in gr.groups],
        "paired": [{"variant": r.variant, "baseline": r.baseline, "metric": r.metric, "diff": r.diff.mean,
                    "ci95": r.diff.half, "p": r.diff.p, "n": r.diff.n, "paired": r.diff.paired,
                    "reading": r.verdict, "seeds_needed": r.seeds_needed,
                    "seeds_needed_more_than": r.seeds_needed_more_than} for r in gr.paired],
    }
