"""Decisions of a declared primary family from per-seed values: fixed designs and the looks of a sequential plan.

Inputs are per-seed values of the primary metric ``{variant: {seed: value}}`` and learned flags ``{variant: {seed:
True / False / None}}`` (normlab.decide.guard: learned at the variant's best learning rate; None: no unigram level),
both computed by normlab.experiments from the stored runs. A fixed design decides by the question's correction over
the family (``fixed_decisions``); a sequential plan (Lan-DeMets O'Brien-Fleming-type, t-based boundaries with a
group-sequential Holm over the family: normlab.stats.sequential) decides at each look (``look``).

The one guard at every look: a comparison involving a model that did not learn in a seed seen so far is "not
decided: did not learn" from that look on and never rejected (p = 1 in the family). A decision made at an earlier look
is **re-checked at every later look**: where the guard fails at a later look (the variant stopped learning in a seed
added since), the decision is withdrawn, with the reason (``withdrawn``), and the look's word is the guard's.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np

from normlab.decide.guard import learning_guard
from normlab.decide.plan import fractions
from normlab.decide.question import Question
from normlab.decide.verdicts import MIN_SEEDS, decision, family_tests, margin_verdict, rejects, testable_p
from normlab.decide.vocab import DECIDED, UNDECIDED, WITHDRAWN
from normlab.stats.intervals import paired_diff
from normlab.stats.sequential import HolmLevels, nominal_p, paired_z, sequential_holm

Values = dict[str, dict[int, float]]
Learned = dict[str, dict[int, bool | None]]


def guard_over(learned: Learned | None, v: str, base: str, seeds: set[int] | None) -> str | None:
    """The one guard (normlab.decide.guard.learning_guard) over ``seeds`` (all when None)."""
    if learned is None:
        return None

    def flags(name: str) -> list[bool | None]:
        return [f for s, f in learned.get(name, {}).items() if seeds is None or s in seeds]

    return learning_guard(flags(v), flags(base))


def pairs(values: Values, v: str, base: str, seeds: set[int] | None) -> list[tuple[float, float]]:
    """``(variant, baseline)`` per seed both have (within ``seeds``), in seed order."""
    a, b = values.get(v, {}), values.get(base, {})
    common = sorted(s for s in set(a) & set(b) if seeds is None or s in seeds)
    return [(a[s], b[s]) for s in common]


def estimate(ps: list[tuple[float, float]]) -> dict[str, Any]:
    """The paired difference's mean, 95% half-width and two-sided p (None without pairs)."""
    if not ps:
        return {"n": 0, "diff": None, "ci95": None, "p": None}
    d = paired_diff([a for a, _ in ps], [b for _, b in ps])
    return {"n": d.n, "diff": d.mean, "ci95": d.half, "p": d.p}


def fixed_decisions(values: Values, q: Question, learned: Learned | None = None) -> list[dict[str, Any]]:
    """A fixed design's decisions: paired t over the common seeds, adjusted by the question's correction over
    ``q.family`` at ``q.alpha``; the guard's note (p = 1 in the family) where a model did not learn; an untestable
    member (fewer than ``MIN_SEEDS`` common seeds) enters as p = 1 and shows adjusted p None; with a practical
    margin, "within margin" by TOST adjusted with the family (normlab.decide.verdicts.margin_verdict)."""
    est = [estimate(pairs(values, v, q.baseline, None)) for v in q.family]
    notes = [guard_over(learned, v, q.baseline, None) for v in q.family]
    diffs = [[x - y for x, y in pairs(values, v, q.baseline, None)] for v in q.family]
    ps = [testable_p(e["p"], e["n"]) for e in est]  # fewer than MIN_SEEDS seeds: not testable
    adj, eqs = family_tests(ps, notes, q, diffs)
    shown = [None if p is None and not n else a for p, n, a in zip(ps, notes, adj)]
    return [{"variant": v, "baseline": q.baseline, "metric": q.primary, **e, "p_holm": a,
             "decision": margin_verdict(decision(e["diff"], rejected=rejects(a, q.alpha, n), note=n), eq),
             **({"tost": eq} if eq is not None else {})}
            for v, e, a, n, eq in zip(q.family, est, shown, notes, eqs)]


@lru_cache(maxsize=32)
def _levels(looks: tuple[int, ...], n_max: int, alpha: float, m: int) -> HolmLevels:
    return HolmLevels.build_t(looks, n_max, alpha, m)


def look(q: Question, values: Values, learned: Learned | None, seeds: list[int], looks: list[int], k: int
         ) -> dict[str, Any]:
    """Look ``k`` (0-based) of a sequential plan over ``seeds`` (looks[j]: the number of seeds at look j): the
    boundary at the first and last Holm level, per comparison the estimate, the normal-scale statistic ``z``, the
    look it was decided at and the decision (module docstring: the guard at every look, decisions withdrawn where
    it fails later)."""
    m = len(q.family)
    z = np.full((k + 1, m), np.nan)
    notes: list[str | None] = [None] * m
    first_fail: list[int | None] = [None] * m
    for j in range(k + 1):
        keep = set(seeds[: looks[j]])
        for i, v in enumerate(q.family):
            note = guard_over(learned, v, q.baseline, keep)
            if note and notes[i] is None:
                notes[i], first_fail[i] = note, j
            ps = pairs(values, v, q.baseline, keep)
            if len(ps) >= MIN_SEEDS and notes[i] is None:
                z[j, i] = paired_z(np.array([[a - b] for a, b in ps]))[0]
    levels = _levels(tuple(looks[: k + 1]), looks[-1], q.alpha, max(m, 1))
    rejected = sequential_holm(z[None], levels)[0] if m else np.zeros(0, dtype=int)
    keep = set(seeds[: looks[k]])
    comps = []
    for i, v in enumerate(q.family):
        at = int(rejected[i])
        zz = z[at, i] if at >= 0 else z[k, i]
        word = decision(float(zz), rejected=at >= 0, note=notes[i])
        row: dict[str, Any] = {"variant": v, "baseline": q.baseline, "metric": q.primary,
                               **estimate(pairs(values, v, q.baseline, keep)),
                               "z": None if not np.isfinite(zz) else float(zz),
                               "decided_at_look": at + 1 if at >= 0 else None, "decision": word}
        if word in DECIDED and notes[i] is not None:  # decided before the guard failed: re-checked, withdrawn
            row.update(decision=notes[i], decided_at_look=None,
                       withdrawn=f"{WITHDRAWN}: {word} at look {at + 1}, but at look {first_fail[i] + 1} {notes[i]}")
        comps.append(row)
    mm = max(m, 1)
    return {"look": k + 1, "seeds": looks[k], "fraction": fractions(looks)[k],
            "boundary_first": levels.bounds[mm][k], "boundary_last": levels.bounds[1][k],
            "nominal_p_first": nominal_p(levels.bounds[mm][k]), "alpha": q.alpha, "m": m,
            "primary": q.primary, "baseline": q.baseline, "comparisons": comps,
            # nothing left to decide: every comparison decided, or not decidable because a model did not learn
            # (more seeds cannot undo that)
            "decided": bool(m) and all(c["decided_at_look"] is not None or c["decision"] != UNDECIDED
                                       for c in comps)}
