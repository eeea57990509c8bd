"""Comparisons with the baseline, and the decisions the report may state (docs/compare.md, "Declared questions").

The unit of replication is the seed: every comparison is over per-seed numbers (LR sensitivity, best-of-grid loss,
final loss), never over learning rates, steps or windows of one seed. The test is fixed by the design: a paired t
over the seeds both variants ran when the design shares seeds (``paired: true``, the default), else Welch; the
per-seed correlation (how much noise the pairing shares) and Welch's interval are printed beside it as a
sensitivity check; with ``n >= 5`` the exact sign-flip (paired) or permutation (unpaired) p too; every row states
the smallest p its n can reach with the exact test (``min_sign_flip_p``: 0.25 at n = 3, 0.0625 at n = 5).

Only the primary family — the declared metric, each family variant against the baseline — is decided: its p-values
are adjusted over the family (Holm's step-down by default, Benjamini–Hochberg with ``correction: bh``; an
untestable member, and one where the variant or the baseline did not learn in some seed (normlab.stats.learning,
for every primary metric), counts as p = 1), and a member is "lower" / "higher" where the adjusted p <= alpha,
"undecided" or "not decided: did not learn" otherwise. Every other row is "exploratory": an estimate with its
interval, no verdict. A sweep that declared no ``primary:``, or whose design changed after results existed, has
no primary family: everything is exploratory.

"Seeds needed" comes from the SD of the comparison's own per-seed differences where the design is paired and has at
least 3 of them, else from the SD of the per-seed metric pooled over all variants that learned (``pooled_sd``) for
a difference of independent seeds (``sd(d) = sqrt(2) sigma``), with the range from that SD's 95% interval
(``seeds_needed_range``), at 80% power and, for a member of the declared family, at the level of Holm's first step
(``alpha / m``). All p-values, intervals and adjustments come from ``normlab.stats``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from statistics import StatisticsError, correlation
from typing import Any

from normlab.stats.exact import min_permutation_p, min_sign_flip_p, permutation_p, sign_flip_p

from normlab.stats.intervals import Diff, paired_diff, welch_diff

from normlab.stats.planning import SEEDS_NEEDED_MAX, SeedsRange, holm_first_level, pooled_sd, seeds_needed_range
from normlab.decide.question import METRIC_LABELS, Question, question_of
from normlab.decide.verdicts import (
    DECIDED,
    EXPLORATORY,
    NOT_DECIDED,
    NOT_TESTABLE,
    UNDECIDED,
    WITHIN_MARGIN,
    decision,
    family_tests,
    learning_guard,
    margin_verdict,
    rejects,
    testable_p,
)

EXACT_MIN_N = 5
VERDICT_WORDS = (*DECIDED, "beyond noise")
"""Words that state a decision; the report uses them only for the primary family
(tests/experiments/test_decisions.py)."""


@dataclass
class PairedRow:
    """``variant - baseline`` for one per-seed metric. ``diff``: the design's test (paired t over shared seeds, or
    Welch); ``role``: ``primary`` (a member of the declared family) or ``exploratory``."""

    variant: str
    baseline: str
    metric: str
    diff: Diff
    role: str = "exploratory"
    p_adjusted: float | None = None
    decided: bool = False
    correlation: float | None = None
    welch: Diff | None = None
    exact_p: float | None = None
    min_exact_p: float | None = None
    seeds: SeedsRange | None = None
    note: str | None = None  # why a family member cannot be decided ("did not learn")
    decision: str = UNDECIDED  # a primary row's verdict (normlab.decide.verdicts)
    differences: list[float] | None = None  # per shared seed, variant - baseline (a paired design)
    tost: dict | None = None  # equivalence against the question's practical margin (verdicts.margin_verdict)

    @property
    def seeds_needed(self) -> int | None:
        return None if self.seeds is None or self.diff.mean == 0.0 else self.seeds.n

    @property
    def seeds_needed_more_than(self) -> int | None:
        if self.seeds is None or self.diff.mean == 0.0 or self.seeds.n is not None:
            return None
        return SEEDS_NEEDED_MAX

    @property
    def verdict(self) -> str:
        """``lower`` / ``higher`` (decided), ``undecided``, ``not testable``, ``not decided: did not learn`` or ``not
        decided: baseline did not learn`` (primary family, decided by normlab.decide.verdicts);
        ``exploratory`` for every other row."""
        return self.decision if self.role == "primary" else EXPLORATORY


def _values(group: Any, get: Callable[[Any], float]) -> dict[int, float]:
    return {s.seed: get(s) for s in group.seeds}


def compare(g: Any, b: Any, metric: str, get: Callable[[Any], float], *, paired: bool = True) -> PairedRow | None:
    """``g - b`` over per-seed values ``get(seed_grid)`` with the design's test and its sensitivity checks."""
    mine, base = _values(g, get), _values(b, get)
    if not mine or not base:
        return None
    common = sorted(set(mine) & set(base))
    a, c = [mine[s] for s in common], [base[s] for s in common]
    if paired and common:
        d = paired_diff(a, c)
    elif paired:  # no shared seed: the estimate only, untestable under a paired design
        w = welch_diff(list(mine.values()), list(base.values()))
        d = Diff(w.mean, w.half, w.n, w.sd, w.df, None, False)
    else:
        d = welch_diff(list(mine.values()), list(base.values()))
    row = PairedRow(g.name, b.name, metric, d, differences=[x - y for x, y in zip(a, c)] if paired else None)
    if len(common) >= 3:
        try:
            row.correlation = correlation(a, c)
        except StatisticsError:  # a constant sample
            row.correlation = None
    if len(mine) >= 2 and len(base) >= 2:
        row.welch = welch_diff(list(mine.values()), list(base.values()))
    if paired:
        row.min_exact_p = min_sign_flip_p(len(common))
        if len(common) >= EXACT_MIN_N:
            row.exact_p = sign_flip_p([x - y for x, y in zip(a, c)])
    else:
        row.min_exact_p = min_permutation_p(len(mine), len(base))
        if min(len(mine), len(base)) >= EXACT_MIN_N:
            row.exact_p = permutation_p(list(mine.values()), list(base.values()))
    return row


def build_rows(groups: list[Any], base: Any, question: Question | dict[str, Any], *, grid: bool,
               exploratory: str | None) -> list[PairedRow]:
    """Every comparison of each group with ``base`` (LR sensitivity and best loss on a grid, final loss at one
    learning rate), the primary family decided as in the module docstring."""
    q = question_of(question, baseline=base.name, grid=grid)
    metrics = ["lr_sensitivity", "best_loss"] if grid else ["final_loss"]
    getters = {"lr_sensitivity": lambda s: s.sensitivity, "best_loss": lambda s: s.best, "final_loss": lambda s: s.best}
    family = list(q.family) if q.family is not None else [g.name for g in groups if g is not base]
    decide = q.declared and exploratory is None and q.primary in metrics
    rows: list[PairedRow] = []
    for g in groups:
        if g is base or not g.seeds:
            continue
        for m in metrics:
            r = compare(g, base, METRIC_LABELS[m], getters[m], paired=q.paired)
            if r is None:
                continue
            if decide and m == q.primary and g.name in family:
                r.role = "primary"
                r.note = learning_guard([g.learned], [base.learned])  # normlab.stats.learning, every metric and path
            rows.append(r)
    fam = [r for r in rows if r.role == "primary"]
    if fam:
        # an untestable member, one whose variant did not learn, and one with no finished run at all stay in the
        # family with p = 1 (m is the declared family's size: conservative)
        missing = len([f for f in family if f not in {r.variant for r in fam}]) if decide else 0
        ps = [testable_p(r.diff.p, r.diff.n) for r in fam]  # fewer than MIN_SEEDS seeds: not testable
        adj, eqs = family_tests(ps, [r.note for r in fam], q, [r.differences for r in fam], missing)
        for r, p_raw, p, eq in zip(fam, ps, adj, eqs):
            r.p_adjusted = p
            r.decided = p_raw is not None and rejects(p, q.alpha, r.note)
            r.decision = decision(r.diff.mean, rejected=r.decided, note=r.note, testable=p_raw is not None)
            r.decision, r.tost = margin_verdict(r.decision, eq), eq
    m_family = (len(family) if decide else len(fam)) or 1
    _plan(rows, groups, getters, metrics, q.alpha, m_family)
    return rows


def _plan(rows: list[PairedRow], groups: list[Any], getters: dict, metrics: list[str], alpha: float = 0.05,
          m_family: int = 1) -> None:
    """Seeds needed for each undecided row: a primary row at the level of Holm's first step (``alpha / m``, the
    level it must reach to be decided at all), an exploratory row at ``alpha``. A paired row with at least 3 per-seed
    differences plans from **its own** differences' SD (with its chi-square 95% interval: the range); otherwise from
    the SD pooled over every group that learned, for a difference of independent seeds (``sqrt(2) sigma``)."""
    for m in metrics:
        label = METRIC_LABELS[m]
        learned = [g for g in groups if g.seeds and g.learned is not False]
        pooled = pooled_sd([[getters[m](s) for s in g.seeds] for g in learned])
        for r in rows:
            if r.metric != label or r.decided or r.note or not math.isfinite(r.diff.mean):
                continue
            a = holm_first_level(alpha, m_family) if r.role == "primary" else alpha
            own = pooled_sd([r.differences]) if r.differences and len(r.differences) >= 3 else None
            if own is not None:
                r.seeds = seeds_needed_range(r.diff.mean, own, paired_factor=1.0, level=1.0 - a)
            elif pooled is not None:
                r.seeds = seeds_needed_range(r.diff.mean, pooled, level=1.0 - a)


def family_summary(rows: list[PairedRow], question: Question | dict[str, Any], exploratory: str | None) -> list[str]:
    """Sentences about the declared question: what was decided, under which correction, or why nothing was."""
    q = question_of(question, baseline=None, grid=False)
    base = q.baseline
    if exploratory:
        return [f"Every comparison below is exploratory (estimates with 95% intervals, no verdicts): {exploratory}."]
    if not q.declared:
        return [(f"This sweep declared no question (no primary: key), so every comparison with {base} is exploratory: "
                "an estimate with its 95% interval and an unadjusted p, no verdict. Declare primary:, family:, "
                "alpha: and correction: before running to have the report decide (docs/compare.md).")]
    fam = [r for r in rows if r.role == "primary"]
    corr = "Holm" if q.correction == "holm" else "Benjamini–Hochberg"
    metric = METRIC_LABELS.get(q.primary, q.primary)
    family = list(q.family or ()) or [r.variant for r in fam]
    out = [(f"Declared question: {metric} of {len(family)} variant(s) vs {base}, {corr}-adjusted over the family at "
            f"alpha = {q.alpha:g}; all other comparisons are exploratory.")]
    absent = [f for f in family if f not in {r.variant for r in fam}]
    if absent:
        out.append(f"No finished seeds to compare (counted in the family as p = 1): {', '.join(absent)}.")
    for word in DECIDED:
        got = [f"{r.variant} ({r.diff.mean:+.3f} ± {r.diff.half:.3f}, adjusted p {_p(r.p_adjusted, eq=True)})"
               for r in fam if r.verdict == word]
        if got:
            out.append(f"{metric[0].upper() + metric[1:]} {word} than {base} beyond noise: " + "; ".join(got) + ".")
    und = [f"{r.variant} ({_est(r)}, adjusted p {_p(r.p_adjusted, eq=True)}{_need_txt(r)})" for r in fam
           if r.verdict in (UNDECIDED, NOT_TESTABLE)]
    if und:
        out.append("Undecided at this n: " + "; ".join(und) + ".")
    eq = [f"{r.variant} ({_est(r)}; {r.tost['level']:.0%} interval [{r.tost['ci'][0]:+.3f}, {r.tost['ci'][1]:+.3f}])"
          for r in fam if r.verdict == WITHIN_MARGIN and r.tost]
    if eq:
        out.append(f"Within the practical margin ±{q.margin:g} of {base} (TOST at alpha = {q.alpha:g}): "
                   + "; ".join(eq) + ".")
    dnl = [r.variant for r in fam if r.verdict in NOT_DECIDED]
    if dnl:
        out.append(f"Not decided because the variant or {base} did not learn at its best learning rate in some seed "
                   f"(counted in the family as p = 1): {', '.join(dnl)}.")
    return out


def _est(r: PairedRow) -> str:
    d = r.diff
    return f"{d.mean:+.3f} ± {d.half:.3f}" if d.half is not None else f"{d.mean:+.3f}"


def _p(p: float | None, *, eq: bool = False) -> str:
    text = "–" if p is None else ("< 0.001" if p < 0.001 else f"{p:.3g}")
    return f"= {text}" if eq and text[0] not in "<–" else text


def need_text(r: PairedRow) -> str | None:
    """"~N seeds (range L–H)" at 80% power from the pooled SD, or None."""
    s = r.seeds
    if s is None or r.diff.mean == 0.0:
        return None

    def one(n: int | None) -> str:
        return str(n) if n is not None else f">{SEEDS_NEEDED_MAX}"

    if s.low is None:
        return f"more than {SEEDS_NEEDED_MAX} seeds"
    mid = f"~{s.n}" if s.n is not None else f"more than {SEEDS_NEEDED_MAX}"
    return f"{mid} seeds (range {one(s.low)}–{one(s.high)})"


def _need_txt(r: PairedRow) -> str:
    t = need_text(r)
    return f", {t} to resolve" if t else ""
