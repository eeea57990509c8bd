"""The report's learning-rate sections (sweep, paired differences, collapse, instability signals: ``sections``),
their cells (also ``normlab compare``'s terminal tables) and summary sentences, from a GridReport."""

from __future__ import annotations

from typing import Any

from normlab.decide.decisions import METRIC_LABELS, PairedRow, family_summary, need_text
from normlab.experiments.lrgrid import DID_NOT_LEARN_MARGIN, SIGNALS, STABLE_MARGIN, GridReport, GroupGrid
from normlab.report import lrplots
from normlab.report.document import Break, Figure, Html, Note, Section, Table
from normlab.report.figures import colors
from normlab.stats.intervals import MeanCI, t_ppf
from normlab.stats.planning import pooled_sd


def _ci(ci: MeanCI | None, digits: int = 3) -> str:
    if ci is None:
        return "–"
    return f"{ci.mean:.{digits}f} ± {ci.half:.{digits}f}" if ci.half is not None else f"{ci.mean:.{digits}f} (n=1)"


def _best_lr(g: GroupGrid) -> str:
    """Best learning rate: the grid point with the lowest seed-mean loss, and where the seeds' own best grid points
    lie (``0.01 (seeds: 0.003–0.01)``, ``0.01 (all 3 seeds)``); "–" without a finished seed."""
    lr = g.best_grid_lr()
    if lr is None:
        return "–"
    per = g.seed_best_lrs()
    if len(per) < 2:
        return f"{lr:g}"
    if per[0] == per[-1]:
        return f"{lr:g} (all {len(per)} seeds)"
    return f"{lr:g} (seeds: {per[0]:g}–{per[-1]:g})"


def _range(lrs: list[float]) -> str:
    if not lrs:
        return "none"
    return f"{lrs[0]:g}" if len(lrs) == 1 else f"{lrs[0]:g} – {lrs[-1]:g}"


def _dnl(g: GroupGrid) -> str:
    """``did not learn [in k/n seeds] (best L, unigram H1)``: L is the worst best-of-grid loss of the seeds that did
    not learn at their best learning rate."""
    bad = [s for s in g.seeds if s.learned is False]
    worst = max(s.best for s in bad)
    part = "" if len(bad) == len(g.seeds) else f" in {len(bad)}/{len(g.seeds)} seeds"
    return f"did not learn{part} (best {worst:.3f}, unigram {g.floor:.3f})"


def ranking_cells(gr: GridReport) -> tuple[list[str], list[list[str]]]:
    head = ["#", "variant", "LR sensitivity (bits/byte)", "best sampled val bits/byte", "best lr", "stable range",
            "stable width (decades)", "diverged", "seeds"]
    rows = []
    for g in sorted(gr.groups, key=lambda g: (g.rank is None, g.rank or 0)):
        div = g.diverged_at()
        n_runs = len(g.runs)
        div_txt = (f"{sum(div.values())}/{n_runs}" + (f" (lr ≥ {min(div):g})" if div else "")) if n_runs else "–"
        sens = _dnl(g) if g.learned is False else _ci(g.sensitivity)
        rows.append([str(g.rank or "–"), g.name, sens, _ci(g.best), _best_lr(g),
                     _range(g.stable_range()), _ci(g.stable_decades, 2), div_txt, str(len(g.seeds))])
    return head, rows


def _pv(p: float | None, *, eq: bool = False) -> str:
    """A p-value as text (3 significant digits, "< 0.001"); ``eq``: prefixed "= " unless it is "< 0.001"."""
    if p is None:
        return "–"
    text = "< 0.001" if p < 0.001 else f"{p:.3g}"
    return f"= {text}" if eq and not text.startswith("<") else text


def paired_cells(gr: GridReport) -> tuple[list[str], list[list[str]]]:
    head = ["variant", "metric", "role", f"Δ vs {gr.baseline} (bits/byte)", "p", "adjusted p", "test", "n",
            "smallest exact p", "exact p", "per-seed corr", "Welch p", "reading"]
    rows = []
    for r in gr.paired:
        d = r.diff
        delta = f"{d.mean:+.3f} ± {d.half:.3f}" if d.half is not None else f"{d.mean:+.3f}"
        test = "paired t" if d.paired else "Welch"
        corr = "–" if r.correlation is None else f"{r.correlation:+.2f}"
        rows.append([r.variant, r.metric, r.role, delta, _pv(d.p), _pv(r.p_adjusted) if r.role == "primary" else "–",
                     test, str(d.n), _pv(r.min_exact_p), _pv(r.exact_p), corr,
                     _pv(r.welch.p if r.welch else None), _reading(r)])
    return head, rows


def _reading(r: PairedRow) -> str:
    v = r.verdict
    need = need_text(r)
    if v == "undecided" and r.diff.mean == 0.0:
        return f"{v}; no difference to resolve"
    if v in ("undecided", "not testable"):
        return f"{v}; {need} to resolve (80% power)" if need else v
    return v


def summary(gr: GridReport, counts: dict[str, int]) -> list[str]:
    """Sentences stating what the grid numbers show (nothing else)."""
    out: list[str] = []
    seeds = sorted({s.seed for g in gr.groups for s in g.seeds})
    n_runs = sum(counts.values())
    status = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    out.append(f"{len(gr.groups)} variants × {len(gr.lrs)} learning rates ({gr.lrs[0]:g} to {gr.lrs[-1]:g}) × "
               f"{len(seeds)} seed{'s' if len(seeds) != 1 else ''} = {n_runs} runs ({status}).")
    ranked = sorted((g for g in gr.groups if g.sensitivity is not None and g.rank is not None),
                    key=lambda g: g.rank or 0)
    if not ranked:
        out.append("No variant has a finished grid that learned, so nothing is ranked.")
        out += _floor_lines(gr) + comparison_lines(gr)
        return out
    lo, hi = ranked[0], ranked[-1]
    how = "(mean ± 95% CI over seeds of mean_lr[min(L, L_init) − L*])"
    if lo is hi:
        out.append(f"Only ranked variant on LR sensitivity: {lo.name}, {_ci(lo.sensitivity)} bits/byte {how}.")
    else:
        out.append(f"Lowest LR sensitivity: {lo.name}, {_ci(lo.sensitivity)} bits/byte; highest: {hi.name}, "
                   f"{_ci(hi.sensitivity)} {how}.")
    best = min(ranked, key=lambda g: g.best.mean)
    out.append(f"Lowest best-of-grid loss: {best.name}, {_ci(best.best)} bits/byte at lr {_best_lr(best)}.")
    out += _floor_lines(gr)
    out += comparison_lines(gr)
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


def _floor_lines(gr: GridReport) -> list[str]:
    """The unigram floor, the variants that did not learn, and learning rates where the seeds split."""
    floors = sorted({round(g.floor, 6) for g in gr.groups if g.floor is not None})
    if not floors:
        return [("No unigram floor is recorded for these runs (trained before normlab recorded unigram_bpb, and the "
                "corpus cache could not be read), so no run is checked for 'did not learn'.")]
    out = [(f"Unigram entropy of the training split: {', '.join(f'{f:.3f}' for f in floors)} bits/byte (the loss of "
           f"the best context-free model); a run ending within {DID_NOT_LEARN_MARGIN} bits/byte of it, or above, did "
           "not learn.")]
    for g in gr.groups:
        if g.learned is False:
            n_bad = sum(1 for s in g.seeds if s.learned is False)
            out.append(f"{g.name} did not learn at its best learning rate in {n_bad} of {len(g.seeds)} seeds "
                       f"(best-of-grid loss {_ci(g.best)} bits/byte): it gets no LR-sensitivity rank.")
        split = [c for c in g.collapse() if 0 < c.rate.k < c.rate.n]
        if split:
            parts = [f"lr {c.lr:g}: {c.rate.k}/{c.rate.n} collapsed ({c.rate.rate:.0%}, 95% CI "
                     f"{c.rate.low:.0%}–{c.rate.high:.0%}), loss of the others {_ci(c.loss_ok)}" for c in split]
            out.append(f"{g.name}'s seeds split (some collapsed: did not learn or diverged; some trained): "
                       + "; ".join(parts) + ".")
    return out


def comparison_lines(gr: GridReport) -> list[str]:
    """The declared question's decisions, then every other comparison as an exploratory estimate (no verdict)."""
    out = family_summary(gr.paired, gr.question, gr.exploratory)
    rest = [r for r in gr.paired if r.role != "primary"]
    for metric in dict.fromkeys(r.metric for r in rest):
        rows = [r for r in rest if r.metric == metric]
        items = []
        for r in rows:
            d = r.diff
            est = f"{d.mean:+.3f} ± {d.half:.3f}" if d.half is not None else f"{d.mean:+.3f} (n = {d.n})"
            items.append(f"{r.variant} {est}" + (f" (p {_pv(d.p, eq=True)}, unadjusted)" if d.p is not None else ""))
        how = "paired over seeds" if all(r.diff.paired for r in rows) else "Welch over seeds"
        out.append(f"{metric[0].upper() + metric[1:]} − {gr.baseline}, exploratory ({how}, 95% intervals): "
                   + "; ".join(items) + ".")
    metric_key = gr.question.get("primary")
    label = METRIC_LABELS.get(metric_key or "", "")
    getter = {"lr_sensitivity": lambda s: s.sensitivity}.get(metric_key or "", lambda s: s.best)
    learned = [g for g in gr.groups if g.seeds and g.learned is not False]
    pooled = pooled_sd([[getter(s) for s in g.seeds] for g in learned])
    if pooled is not None and any(r.seeds for r in gr.paired):
        out.append(f"Seeds needed (80% power, two-sided 5%) use the SD of the per-seed {label or 'metric'} pooled over "
                   f"{len(learned)} variant(s) that learned: {pooled.sd:.3f} bits/byte with {pooled.df} df (95% CI "
                   f"{pooled.low:.3f}–{pooled.high:.3f}), for unpaired seed noise; the range is the seeds at the "
                   "ends of that interval.")
    return out


def paired_summary(gr: GridReport) -> list[str]:
    """For a sweep at one learning rate: the comparisons with the baseline, as sentences."""
    return comparison_lines(gr) if gr.paired else []


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
        "report_signal_hcgain.png": (lrplots.signals_vs_step_png(gr, "hc_gain_fwd"),
                                     "Composite residual gain of the stream variants (HC, mHC) against step"),
    }


NOTE = (f"LR sensitivity (Wortsman et al. 2023, arXiv:2309.14322): the mean over the learning-rate grid of "
        f"min(L, L_init) − L*, with L the final validation bits/byte, L_init the loss at initialisation (a diverged "
        f"run scores L_init) and L* the best of the grid; per seed, then mean ± 95% Student-t interval over seeds. "
        f"Stable range: learning rates where no seed diverged and the seed-mean loss is within {STABLE_MARGIN} "
        f"bits/byte of the best; its width in decades is per seed. Best lr: the grid point with the lowest seed-mean "
        f"loss, with the range of the seeds' own best grid points.")
PAIRED_NOTE = ("Δ = variant − baseline over per-seed numbers (the seed is the unit of replication). test: paired t "
               "over the seeds both ran (the design shares seeds), or Welch where the sweep declared paired: false. "
               "role: primary rows form the declared family; their p is adjusted over it (adjusted p, Holm or "
               "Benjamini–Hochberg) and only they get a verdict (the sign of Δ where adjusted p ≤ alpha, else "
               "undecided). Exploratory rows are estimates with 95% intervals and unadjusted p, no verdict. "
               "smallest exact p: the least p the exact sign-flip (or permutation) test can reach at this n; exact p "
               "is shown from n = 5. per-seed corr: correlation of the two variants' per-seed values (near 0: the "
               "pairing shares no noise). Welch p: the unpaired test, a sensitivity check. Seeds needed: from the SD "
               "pooled over all variants that learned, with the range from its 95% interval.")


SIGNAL_FIGURES = ("report_lr_signals.png", "report_signal_attn.png", "report_signal_lse.png", "report_signal_tev.png",
                  "report_signal_hcgain.png")


def collapse_cells(gr: GridReport) -> tuple[list[str], list[list[str]]]:
    """Learning rates where some seed collapsed (did not learn or diverged): the rate with its exact interval and
    the loss of the seeds that did not collapse."""
    head = ["variant", "lr", "collapsed", "rate (95% Clopper–Pearson)", "loss given no collapse"]
    rows = []
    for g in gr.groups:
        for c in g.collapse():
            if c.rate.k:
                rows.append([g.name, f"{c.lr:g}", f"{c.rate.k}/{c.rate.n}",
                             f"{c.rate.rate:.0%} ({c.rate.low:.0%}–{c.rate.high:.0%})", _ci(c.loss_ok)])
    return head, rows


COLLAPSE_NOTE = (f"Collapsed: diverged, or the final loss is within {DID_NOT_LEARN_MARGIN} bits/byte of the training "
                 "split's unigram entropy per byte or above it (the model learned only byte/token frequencies). The "
                 "loss is the mean ± 95% interval over the seeds that did not collapse, not an interval over a "
                 "bimodal outcome.")


LEFT = ("variant", "metric", "role", "reading", "stable range")
SIGNALS_NOTE = ("<div class='note'>Recorded every diag.every steps (normlab.diagnostics.instability): attention logit "
                "growth and output logit divergence (Wortsman et al. 2023), Softmax Collapse (Prieto et al. 2025), "
                "Token Embedding Variability (Chung et al. 2024), the output layer's RMS->inf norm (Filatov et al. "
                "2025) and, for residual-stream variants, the composite residual gain (mHC, Xie et al. 2025; "
                "docs/streams.md).</div>")  # HTML only


def _table(head: list[str], rows: list[list[str]], best_first: bool = False) -> Table:
    """Text columns (``LEFT``) left-aligned; ``best_first``: the first row highlighted when it ranks 1."""
    classes = ["best" if best_first and j == 0 and r[0] == "1" else "" for j, r in enumerate(rows)]
    return Table(head, rows, left={i for i, c in enumerate(head) if c in LEFT}, row_class=classes,
                 class_every_cell=True)


def sections(gr: GridReport | None, variant_colors: dict[str, Any]) -> list[Section]:
    """The learning-rate sections of a sweep's grid analysis: the sweep (a grid only), paired differences with the
    baseline, collapse per learning rate, instability signals; each only when it has data. ``variant_colors``: the
    report's colour per variant (a grid colours its groups itself)."""
    if gr is None:
        return []
    cmap = {**colors([g.name for g in gr.groups]), **variant_colors}  # the report's colours win: one per variant
    figs = {n: Figure(n, cap, png) for n, (png, cap) in figures(gr, cmap).items()}
    out: list[Section] = []
    if gr.is_grid:
        out.append(Section("Learning-rate sweep", [
            figs["report_lr_loss.png"], Break(), _table(*ranking_cells(gr), best_first=True), Break(), Note(NOTE),
            figs["report_lr_sensitivity.png"]]))
    if gr.paired:
        out.append(Section(f"Paired differences vs {gr.baseline}",
                           [_table(*paired_cells(gr)), Break(), Note(PAIRED_NOTE)]))
    head, rows = collapse_cells(gr)
    if rows:
        out.append(Section("Collapse per learning rate", [_table(head, rows), Break(), Note(COLLAPSE_NOTE)]))
    signals = [figs[n] for n in SIGNAL_FIGURES]
    flat = lrplots.flat_signals(gr) if gr.is_grid else {}
    same = ([Note("Not plotted, the same in every run at its last diagnostic step: "
                  + "; ".join(f"{SIGNALS[k]}: {v:g}" for k, v in flat.items()) + ".")] if flat else [])
    if any(f.png for f in signals) or same:
        out.append(Section("Instability signals", [Html(SIGNALS_NOTE), *same, *signals]))
    return out


def rows_json(gr: GridReport) -> dict[str, Any]:
    """The section as plain values (``--json`` output, tests)."""
    def ci(c: MeanCI | None) -> dict | None:
        return None if c is None else {"mean": c.mean, "ci95": c.half, "n": c.n}

    def diff(d: Any) -> dict | None:
        return None if d is None else {"diff": d.mean, "ci95": d.half, "p": d.p, "n": d.n}

    return {
        "baseline": gr.baseline, "learning_rates": gr.lrs, "is_grid": gr.is_grid,
        "question": gr.question, "exploratory_reason": gr.exploratory,
        "variants": [{"variant": g.name, "rank": g.rank, "lr_sensitivity": ci(g.sensitivity),
                      "best_val_bpb": ci(g.best),
                      "best_lr": g.best_grid_lr(), "best_lr_per_seed": g.seed_best_lrs(),
                      "stable_range": g.stable_range(), "stable_decades": ci(g.stable_decades),
                      "diverged": {f"{k:g}": v for k, v in g.diverged_at().items()},
                      "unigram_bpb": g.floor, "learned": g.learned,
                      "collapse": [{"lr": c.lr, "collapsed": c.rate.k, "n": c.rate.n, "rate": c.rate.rate,
                                    "rate_ci95": [c.rate.low, c.rate.high], "loss_given_no_collapse": ci(c.loss_ok)}
                                   for c in g.collapse()],
                      "seeds": [{"seed": s.seed, "lr_sensitivity": s.sensitivity, "best_val_bpb": s.best,
                                 "best_lr": s.best_lr, "init_val_bpb": s.init, "learned": s.learned,
                                 "losses": {f"{k:g}": v for k, v in s.losses.items()}} for s in g.seeds]}
                     for g in gr.groups],
        "paired": [{"variant": r.variant, "baseline": r.baseline, "metric": r.metric, "role": r.role,
                    "diff": r.diff.mean, "ci95": r.diff.half, "p": r.diff.p, "p_adjusted": r.p_adjusted,
                    "decided": r.decided, "n": r.diff.n, "paired": r.diff.paired, "reading": r.verdict,
                    "correlation": r.correlation, "welch": diff(r.welch), "exact_p": r.exact_p,
                    "min_exact_p": r.min_exact_p, "seeds_needed": r.seeds_needed,
                    "seeds_needed_more_than": r.seeds_needed_more_than,
                    "seeds_needed_range": None if r.seeds is None else [r.seeds.low, r.seeds.high]}
                   for r in gr.paired],
    }
