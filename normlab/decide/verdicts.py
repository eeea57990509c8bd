"""The one module that makes verdicts: every "lower" / "higher", "held", "within margin", "not decided: did not
learn", "not observable at this scale" and "replicated" normlab prints is decided here, from p-values, intervals
and per-seed values computed by normlab.stats; the report, the sequential looks, the replication tables and the
claims only call these functions and render their results.

**Comparisons of a declared question** (normlab.decide.question; sweeps, presets, ``--until-decided``,
``--replicate-on``): a family member is ``lower`` / ``higher`` (by the sign of ``variant - baseline``) where it is
rejected — its adjusted p <= the question's alpha (``rejects``), or its statistic crossed a sequential boundary —
``undecided`` or ``not testable`` otherwise (``decision``); ``within margin`` where the question declares a
practical margin and TOST, adjusted with the family's tests, puts the difference inside it (``family_tests``,
``margin_verdict``). The one did-not-learn guard
(``learning_guard``, normlab.stats.learning): a comparison involving a model that did not learn in a seed it uses is
"not decided: did not learn" (or "...: baseline did not learn"), never rejected, and counts as p = 1 in the family's
adjustment (``family_adjusted``), as does an untestable member and a declared member without results: a family never
shrinks.

**Replications** (``replication``): ``replicated`` (decided the same way on both sources), ``contradicted`` (decided
the opposite way), ``no conclusion to replicate``, the replication's own "not decided: ..." where a model did not
learn there, else ``underpowered`` (power at Holm's first level below ``POWER_NEEDED`` or unknown) or ``not
replicated``.

**Claims** (``claim_verdict``: the raw verdict on the 95% CI; ``judge_family``: the final verdicts of the family of
claims): a directional claim is ``held`` where its test rejects (the same ``rejects`` and ``decision`` as a
comparison, read against the claimed direction), ``within margin`` by TOST (Schuirmann 1987: both one-sided tests
reject at the family's level), ``not observable at this scale`` by the claim's observability rule or where a model
it is about did not learn (the one did-not-learn rule, p = 1 in the family); a split-outcome
claim by its collapse rates (Clopper-Pearson intervals, ``collapse_rates``) under the one collapse rule
(``recollapse``, normlab.stats.learning.collapsed).

The CI is ``mean ± t_{1-a/2, n-1} * sd / sqrt(n)`` over per-seed values (``sd`` with ``n - 1``), from
``normlab.stats.mean_ci``. The raw verdicts (``direction``):

- ``greater`` / ``less``: the claim says the effect is above / below ``null``. CI entirely on the claimed side ->
  ``held``; entirely on the other side -> ``not held``; CI containing ``null`` (or fewer than 2 finite values)
  -> ``inconclusive``.
- ``within``: an equivalence claim ``|effect - null| < margin``. CI inside ``(null - margin, null + margin)`` ->
  ``held``; CI entirely outside it -> ``not held``; otherwise ``inconclusive``.
- ``exact``: a deterministic quantity (e.g. max |logit difference| of an exact conversion) that must be
  ``<= tolerance`` for every seed: all seeds within -> ``held``; any seed above (or non-finite) -> ``not held``.
  No CI is needed (one seed suffices); ``ci`` is ``[min, max]`` over seeds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from normlab.decide.question import Question
from normlab.decide.vocab import (  # noqa: F401  (re-exported: the words of this module's verdicts)
    CLAIM_VERDICTS,
    CONTRADICTED,
    DECIDED,
    EXPLORATORY,
    HELD,
    HIGHER,
    INCONCLUSIVE,
    LOWER,
    NO_CONCLUSION,
    NOT_DECIDED,
    NOT_DECIDED_BASE_DNL,
    NOT_HELD,
    NOT_OBSERVABLE,
    NOT_REPLICATED,
    NOT_TESTABLE,
    PRESENT_AT_INIT,
    REPLICATED,
    REPLICATION_VERDICTS,
    UNDECIDED,
    UNDERPOWERED,
    WITHDRAWN,
    WITHIN_MARGIN,
)
from normlab.stats.exact import clopper_pearson
from normlab.stats.intervals import mean_ci, paired_diff, t_cdf, t_ppf
from normlab.stats.multiplicity import adjust
from normlab.decide.guard import UNGUARDED_TESTS, claim_guard, learning_guard  # noqa: F401  (re-exported)
from normlab.stats.learning import (
    DID_NOT_LEARN_MARGIN,
    NOT_DECIDED_DNL,
    collapsed,
)

# -- comparisons of a declared question ---------------------------------------------------------------------------
MIN_SEEDS = 3
"""The fewest seeds (pairs, or the smaller group of an unpaired design) a test is made on, on every path (compare,
sequential looks, claims, TOSTs): with 2, a t-test has 1 degree of freedom and rests on a normality 2 values cannot
show, and the exact sign-flip test cannot reach p below 0.5. Fewer: not testable (p = 1 in the family)."""


def testable_p(p: float | None, n: int) -> float | None:
    """``p`` where ``n`` seeds reach :data:`MIN_SEEDS`, else None (not testable)."""
    return p if n >= MIN_SEEDS else None



def family_adjusted(ps: Sequence[float | None], notes: Sequence[str | None], question: Question, missing: int = 0
                    ) -> list[float | None]:
    """The adjusted p of each family member's test (``family_tests`` without margins)."""
    return family_tests(ps, notes, question, None, missing)[0]


def family_tests(ps: Sequence[float | None], notes: Sequence[str | None], question: Question,
                 differences: Sequence[Sequence[float] | None] | None = None, missing: int = 0
                 ) -> tuple[list[float | None], list[dict | None]]:
    """One family: the adjusted p of each member's test and, where the question declares a practical margin and
    ``differences`` (each member's per-seed differences) are given, each member's TOST (:func:`tost`) with its p
    adjusted **together with** the tests (``p_adj``, ``within``: adjusted p <= alpha), so an equivalence meets the
    family's correction like any other verdict. A member with a note (a model did not learn) or no p (untestable)
    enters as p = 1, and so do ``missing`` declared members with no finished run (their TOST too); the family's
    size is never smaller than declared."""
    full = [1.0 if (n or p is None) else float(p) for p, n in zip(ps, notes)] + [1.0] * missing
    eqs: list[dict | None] = []
    if question.margin is not None and differences is not None:
        eqs = [tost(d, 0.0, question.margin, question.alpha) if d else None for d in differences]
        full += [1.0 if (n or e is None) else e["p"] for e, n in zip(eqs, notes)] + [1.0] * missing
    adj = adjust(full, question.correction)
    k = len(ps) + missing
    out = [None if e is None else {**e, "p_adj": q, "within": q <= question.alpha}
           for e, q in zip(eqs, adj[k:k + len(eqs)])]
    return adj[: len(ps)], out or [None] * len(ps)


def rejects(p_adjusted: float | None, alpha: float, note: str | None = None) -> bool:
    """A member is rejected (decided) where its adjusted p <= alpha and no model of it failed to learn."""
    return note is None and p_adjusted is not None and p_adjusted <= alpha


def margin_verdict(word: str, eq: dict | None) -> str:
    """The word with the practical margin applied: ``within margin`` where the member's TOST, adjusted with the
    family (``family_tests``), rejects both one-sided nulls, whatever the difference's own test said (an effect too
    small to matter, the claims' rule); a comparison not decided because a model did not learn stays so."""
    if eq is not None and eq.get("within") and word in (LOWER, HIGHER, UNDECIDED):
        return WITHIN_MARGIN
    return word


def decision(estimate: float | None, *, rejected: bool, note: str | None = None, testable: bool = True) -> str:
    """A comparison's word: ``lower`` / ``higher`` by the sign of ``estimate`` (variant - baseline, or its test
    statistic) when rejected (a decision made at a look stands), else the did-not-learn note, else ``undecided``
    (``not testable`` when there was no test)."""
    if rejected and estimate is not None:
        return LOWER if estimate < 0 else HIGHER
    if note:
        return note
    return UNDECIDED if testable else NOT_TESTABLE


# -- replications -------------------------------------------------------------------------------------------------
POWER_NEEDED = 0.8
"""A replication with less power than this at Holm's first level reads "underpowered"."""


def replication(original: str, replica: str, power: float | None = None) -> str:
    """``replicated`` (decided the same way on both), ``contradicted`` (decided the opposite way), ``no conclusion
    to replicate`` (not decided on the original), the replication's own "not decided: ..." when a model did not
    learn there; else (decided on the original only) ``underpowered`` when the replication's power at Holm's first
    level is below ``POWER_NEEDED`` or unknown, ``not replicated`` when it had that power and still did not decide."""
    if original not in DECIDED:
        return NO_CONCLUSION
    if replica == original:
        return REPLICATED
    if replica in DECIDED:
        return CONTRADICTED
    if replica.startswith("not decided:"):
        return replica
    return NOT_REPLICATED if power is not None and power >= POWER_NEEDED else UNDERPOWERED


# -- claims ---------------------------------------------------------------------------------------------------------
DIRECTIONS = ("greater", "less", "within", "exact")
CLAIMED = {"greater": HIGHER, "less": LOWER}
"""The comparison word a directional claim expects of ``value - null``."""


#VERDICT
def claim_verdict(values: Sequence[float | None], direction: str, *, null: float = 0.0, margin: float | None = None,
            tolerance: float | None = None, level: float = 0.95) -> dict:
    """``{measured, ci, n, verdict, reason}`` for per-seed ``values`` (see the module docstring)."""
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
    if direction == "exact":
        if tolerance is None:
            raise ValueError("direction 'exact' needs a tolerance")
        vals = [None if v is None else float(v) for v in values]
        if not vals:
            return {"measured": None, "ci": None, "n": 0, "verdict": INCONCLUSIVE, "reason": "no values"}
        xs = finite(vals)
        worst = max(xs) if len(xs) == len(vals) else float("inf")
        ok = worst <= tolerance
        return {"measured": worst, "ci": [min(xs), max(xs)] if xs else None, "n": len(vals),
                "verdict": HELD if ok else NOT_HELD,
                "reason": f"max over {len(vals)} seed(s) {'<=' if ok else '>'} tolerance {tolerance:g}"}
    xs = finite(values)
    c = mean_ci(xs, level) if xs else None
    n = len(xs)
    out = {"measured": c.mean if c else None, "ci": [c.low, c.high] if c and c.half is not None else None, "n": n}
    if out["ci"] is None:
        return {**out, "verdict": INCONCLUSIVE, "reason": f"{n} finite value(s): a CI needs at least 2"}
    lo, hi = out["ci"]
    if direction == "within":
        if margin is None:
            raise ValueError("direction 'within' needs a margin")
        if null - margin < lo and hi < null + margin:
            v, why = HELD, f"CI inside ±{margin:g}"
        elif hi <= null - margin or lo >= null + margin:
            v, why = NOT_HELD, f"CI entirely outside ±{margin:g}"
        else:
            v, why = INCONCLUSIVE, f"CI overlaps the ±{margin:g} boundary"
        return {**out, "verdict": v, "reason": why}
    claimed_side = lo > null if direction == "greater" else hi < null
    other_side = hi < null if direction == "greater" else lo > null
    if claimed_side:
        v, why = HELD, f"CI excludes {null:g} in the expected direction"
    elif other_side:
        v, why = NOT_HELD, f"CI excludes {null:g} in the opposite direction"
    else:
        v, why = INCONCLUSIVE, f"CI contains {null:g}"
    return {**out, "verdict": v, "reason": why}


ALPHA = 0.05
VERDICTS = CLAIM_VERDICTS


def _p_against(xs: list[float], null: float) -> float | None:
    """Two-sided one-sample t-test p of ``mean(xs) = null`` (normlab.stats.paired_diff against a constant); None
    with fewer than :data:`MIN_SEEDS` values."""
    if len(xs) < MIN_SEEDS:
        return None
    return paired_diff(xs, [null] * len(xs)).p


def raw_p(values: Sequence[float | None], test: str, *, null: float = 0.0, margin: float | None = None
          ) -> float | None:
    """The p-value a claim enters the family with (None: no significance test). ``t``/``collapse``: two-sided
    one-sample t against ``null``. ``equivalence``: with the mean inside ``null ± margin``, the larger of the
    tests against the two ends (two one-sided tests, each two-sided: conservative); outside, the test against the
    nearer end."""
    xs = finite(values)
    if test in ("t", "collapse"):
        return _p_against(xs, null)
    if test == "equivalence" and margin is not None and len(xs) >= MIN_SEEDS:
        lo, hi = _p_against(xs, null - margin), _p_against(xs, null + margin)
        m = sum(xs) / len(xs)
        if lo is None or hi is None:
            return None
        if null - margin < m < null + margin:
            return max(lo, hi)
        return lo if m <= null - margin else hi
    return None


def tost(values: Sequence[float | None], null: float, margin: float, alpha: float = 0.05) -> dict | None:
    """Equivalence by two one-sided t-tests (TOST; Schuirmann 1987) of ``|mean - null| < margin``: ``H01: mu <= null
    - margin`` and ``H02: mu >= null + margin``, each rejected at level ``alpha``; equivalently the ``1 - 2 alpha``
    t-interval lies inside ``(null - margin, null + margin)``. Returns ``{within, p, ci, level}`` (``p``: the larger
    one-sided p), None with fewer than :data:`MIN_SEEDS` finite values."""
    xs = finite(values)
    if len(xs) < MIN_SEEDS:
        return None
    c = mean_ci(xs)
    se = c.sd / math.sqrt(len(xs))
    df = len(xs) - 1
    half = t_ppf(1.0 - alpha, df) * se
    if se == 0.0:
        p = 0.0 if abs(c.mean - null) < margin else 1.0
    else:
        p = max(1.0 - t_cdf((c.mean - (null - margin)) / se, df), t_cdf((c.mean - (null + margin)) / se, df))
    lo, hi = c.mean - half, c.mean + half
    return {"within": null - margin < lo and hi < null + margin, "p": p, "ci": [lo, hi], "level": 1.0 - 2 * alpha}


def judge_family(entries: list[dict], correction: str = "holm") -> list[dict]:
    """Final verdicts of a family of claims. Each entry: ``values``, ``details``, ``direction``, ``null``,
    ``margin``, ``tolerance``, ``test``, ``practical_margin``, ``observable``, ``args``, optionally ``at_init`` (a
    state claim: the details key of the same quantity at initialisation), ``must_learn`` / ``learn_unit`` /
    ``unigram_bpb`` (where stored losses are). Returns per entry ``{verdict, reason, p, p_adj, raw_verdict, ...}``:

    - the raw verdict is :func:`claim_verdict` on the 95% CI, unadjusted (kept beside);
    - **one family**: every claim with a significance test (``t``, ``equivalence``, ``collapse``) and every TOST
      of a practical margin are adjusted together (normlab.stats.adjust, Holm by default); a claim is decided only
      where its test rejects (adjusted p <= ``ALPHA``); ``within margin`` only where its TOST's *adjusted* p <=
      ``ALPHA`` (an equivalence escapes the family's correction nowhere);
    - **the one guard** (normlab.decide.guard, not opt-in): a claim about a model that did not learn (or diverged)
      in some seed is "not decided: did not learn" and counts as p = 1 in the family; split outcomes and exact
      checks are judged without it;
    - **training, not initialisation**: a state claim (``at_init``) is tested on the per-seed change from step 0
      (``value - value at init``), its end and init values reported beside; where the change is not decided but
      the end value's 95% CI is on the claimed side, the verdict is ``present at initialisation`` (never counted
      as a training effect); without recorded init values it is inconclusive;
    - ``not observable at this scale``: the claim's ``observable`` details key does not have a 95% CI above 0;
    - ``collapse``: held when the first variant's Clopper-Pearson collapse interval lies above the second's;
      otherwise the t-test on the seeds where neither collapsed decides as for ``t``, except that it cannot make
      the claim "not held" where the first variant collapsed more often.
    """
    entries = [recollapsed(e) for e in entries]
    tested = [_tested_values(e) for e in entries]
    ps = [raw_p(t, e["test"], null=e.get("null", 0.0), margin=e.get("margin")) for e, (t, _) in zip(entries, tested)]
    guards = [claim_guard(e.get("details") or [], test=e["test"], declared=e.get("must_learn") or (),
                          declared_scale=1.0 / math.log(2) if e.get("learn_unit") == "nats/byte" else 1.0,
                          unigram=e.get("unigram_bpb")) for e in entries]
    tosts = [tost(t, e.get("null", 0.0), e["practical_margin"], ALPHA)
             if e.get("practical_margin") is not None and e["test"] != "exact" else None
             for e, (t, _) in zip(entries, tested)]
    # the family: every significance test (p = 1 where untestable or the guard fails) and every TOST of a margin
    fam = [i for i, e in enumerate(entries) if e["test"] in SIGNIFICANCE_TESTS]
    eqs = [i for i, eq in enumerate(tosts) if eq is not None]
    raw = [1.0 if guards[i][1] else ps[i] for i in fam] + \
          [1.0 if guards[i][1] else tosts[i]["p"] for i in eqs]
    adjusted = adjust(raw, correction) if raw else []
    qs: list[float | None] = [None] * len(entries)
    for i, q in zip(fam, adjusted[: len(fam)]):
        qs[i] = q
    for i, q in zip(eqs, adjusted[len(fam):]):
        tosts[i] = {**tosts[i], "p_adj": q, "within": q <= ALPHA}
    out = []
    for e, p, q, eq, (vals, why_not), (guard, guard_note) in zip(entries, ps, qs, tosts, tested, guards):
        res = _judge_one(e, vals, why_not, p, q, eq, correction)
        if guard is not None:
            res["did_not_learn"] = guard
        if guard_note:
            res.update(verdict=NOT_DECIDED_DNL, reason=guard_note + ("" if p is None else f"; unadjusted p = {p:.2g}"))
        elif guard is None and e["test"] not in UNGUARDED_TESTS:
            res["reason"] = f"{res['reason']}; did-not-learn check not made (no final loss or unigram level recorded)"
        out.append(res)
    return out


def _tested_values(e: dict) -> tuple[list[float | None], str | None]:
    """The per-seed values a claim is tested on: its values, or for a state claim (``at_init``) the change from
    initialisation (None where a seed has no init value); the second item says why a state claim cannot be
    judged (no init value recorded)."""
    key = e.get("at_init")
    if not key:
        return list(e["values"]), None
    details = e.get("details") or []
    inits = [d.get(key) if isinstance(d, dict) else None for d in details]
    if len(inits) != len(e["values"]) or not any(isinstance(x, (int, float)) for x in inits):
        return [None] * len(e["values"]), (f"a state claim is judged on its change from initialisation, and no "
                                           f"'{key}' (its value at step 0) is recorded")
    return [None if v is None or not isinstance(i, (int, float)) else float(v) - float(i)
            for v, i in zip(e["values"], inits)], None


def _judge_one(e: dict, vals: list[float | None], why_not: str | None, p: float | None, q: float | None,
               eq: dict | None, correction: str) -> dict:
    """One claim's verdict from its tested values, raw and adjusted p and adjusted TOST (``judge_family``)."""
    raw = claim_verdict(vals if why_not is None else e["values"], e["direction"], null=e.get("null", 0.0),
                        margin=e.get("margin"), tolerance=e.get("tolerance"))
    res: dict = {"p": p, "p_adj": q, "correction": correction, "raw_verdict": raw["verdict"],
                 "raw_reason": raw["reason"]}
    xs = finite(vals)
    mean = sum(xs) / len(xs) if xs else None
    null, pm = e.get("null", 0.0), e.get("practical_margin")
    no_record = False
    if e["test"] == "exact":
        v, why = raw["verdict"], raw["reason"]
    elif e["test"] == "equivalence":
        m = e["margin"]
        if q is None:
            v, why = INCONCLUSIVE, f"{len(xs)} finite value(s): a test needs at least {MIN_SEEDS}"
        elif not rejects(q, ALPHA):
            v, why = INCONCLUSIVE, f"{correction}-adjusted p = {q:.2g} >= {ALPHA:g}: not decided against ±{m:g}"
        elif null - m < mean < null + m:
            v, why = HELD, f"inside ±{m:g} ({correction}-adjusted p = {q:.2g})"
        else:
            v, why = NOT_HELD, f"outside ±{m:g} ({correction}-adjusted p = {q:.2g})"
    else:
        v, why = _directional(mean, q, e["direction"], null, correction, len(xs))
        if e["test"] == "collapse":
            v, why, no_record = _collapse(e, res, v, why, len(xs))
    if eq is not None:
        res["tost"] = eq
    if why_not is not None:
        v, why = INCONCLUSIVE, why_not
    elif v in (HELD, NOT_HELD, INCONCLUSIVE) and eq is not None and eq["within"] and not no_record \
            and not (e["test"] == "collapse" and v == HELD and why.startswith("collapse rate")):
        v, why = WITHIN_MARGIN, (f"TOST: the {eq['level']:.0%} interval [{eq['ci'][0]:.2g}, {eq['ci'][1]:.2g}] "
                                 f"lies inside {null:g} ± the practical margin {pm:g}, {correction}-adjusted p = "
                                 f"{eq['p_adj']:.2g} (unadjusted {eq['p']:.2g}); without the margin: {v} ({why})")
    elif v in (HELD, NOT_HELD, INCONCLUSIVE) and eq is not None and mean is not None and abs(mean - null) < pm:
        why = (f"{why}; |mean - {null:g}| = {abs(mean - null):.2g} is below the practical margin {pm:g} but TOST's "
               f"{correction}-adjusted p = {eq['p_adj']:.2g} (unadjusted {eq['p']:.2g}, interval [{eq['ci'][0]:.2g}, "
               f"{eq['ci'][1]:.2g}]): not shown within margin")
    if e.get("at_init") and why_not is None:
        v, why = _init_rule(e, res, v, why)
    if e.get("observable"):
        obs = [d.get(e["observable"]) if isinstance(d, dict) else None for d in e.get("details") or []]
        ox = finite(obs)
        c = mean_ci(ox) if len(ox) >= 2 else None
        res["observable_ci"] = [c.low, c.high] if c else None
        if c is None or not c.low > 0:
            v, why = NOT_OBSERVABLE, (f"{e['observable']} (the phenomenon) has 95% CI "
                                      f"{'n/a' if c is None else f'[{c.low:.3g}, {c.high:.3g}]'}, not above 0; "
                                      f"the value alone: {why}")
    if "collapse" not in res:
        rates = collapse_rates(e.get("details") or [])
        if rates:
            res["collapse"] = rates
    if e.get("recollapsed"):  # the stored values under the one collapse rule: the judged claim carries them
        res.update(details=e["details"], values=e["values"], measured=raw["measured"], ci=raw["ci"], n=raw["n"])
    res.update(verdict=v, reason=why)
    return res


def _init_rule(e: dict, res: dict, v: str, why: str) -> tuple[str, str]:
    """A state claim's verdict on its change from initialisation, with its end and init values beside
    (``res['at_init']``); an effect the model has at step 0 and training does not change is ``present at
    initialisation``."""
    key, null = e["at_init"], e.get("null", 0.0)
    inits = finite([d.get(key) if isinstance(d, dict) else None for d in e.get("details") or []])
    end = finite(e["values"])
    ci_end, ci_init = (mean_ci(end) if len(end) >= 2 else None), (mean_ci(inits) if len(inits) >= 2 else None)
    res["at_init"] = {"key": key, "end": None if ci_end is None else [ci_end.mean, ci_end.low, ci_end.high],
                      "init": None if ci_init is None else [ci_init.mean, ci_init.low, ci_init.high]}
    why = f"tested on the change from initialisation: {why}"
    if v != INCONCLUSIVE or ci_end is None or ci_end.half is None or e["direction"] not in CLAIMED:
        return v, why
    side = ci_end.low > null if e["direction"] == "greater" else ci_end.high < null
    if not side:
        return v, why
    where = "" if ci_init is None else f", {ci_init.mean:.3g} at init [{ci_init.low:.3g}, {ci_init.high:.3g}]"
    return PRESENT_AT_INIT, (f"the end value {ci_end.mean:.3g} [{ci_end.low:.3g}, {ci_end.high:.3g}] is on the "
                             f"claimed side{where}, but training did not move it there ({why})")


def _collapse(e: dict, res: dict, v: str, why: str, n: int) -> tuple[str, str, bool]:
    """A split-outcome claim's verdict from its collapse rates (``judge_family``); the third item: no record."""
    a, b = e["args"][0], e["args"][1]
    rates = collapse_rates(e.get("details") or [], (a, b))
    res["collapse"] = rates
    if a not in rates or b not in rates:  # no collapse record: the split outcome cannot be judged
        res["raw_verdict"] = INCONCLUSIVE
        return INCONCLUSIVE, (f"no collapse record of {a if a not in rates else b} in the details: the split "
                              f"outcome cannot be judged (the seeds that trained: {why})"), True
    ra, rb = rates[a], rates[b]
    if ra["ci"][0] > rb["ci"][1]:
        return HELD, (f"collapse rate {ra['k']}/{ra['n']} above {rb['k']}/{rb['n']} "
                      "(Clopper-Pearson intervals apart)"), False
    why = (f"collapse {ra['k']}/{ra['n']} vs {rb['k']}/{rb['n']} (Clopper-Pearson intervals overlap); given no "
           f"collapse ({n} seed(s)): {why}")
    # the survivors alone cannot refute a claim whose other half (collapses more often) the data lean towards
    if ra["k"] * rb["n"] > rb["k"] * ra["n"]:
        if v == NOT_HELD:
            v, why = INCONCLUSIVE, (f"{why}; but {a} collapsed more often, which the intervals neither show nor "
                                    "exclude: not refuted by the seeds that trained")
        if res["raw_verdict"] == NOT_HELD:
            res["raw_verdict"] = INCONCLUSIVE
    return v, why, False


SIGNIFICANCE_TESTS = ("t", "equivalence", "collapse")


def _directional(mean: float | None, q: float | None, direction: str, null: float, correction: str, n: int
                 ) -> tuple[str, str]:
    if q is None or mean is None:
        return INCONCLUSIVE, f"{n} finite value(s): a test needs at least {MIN_SEEDS}"
    if not rejects(q, ALPHA):
        return INCONCLUSIVE, f"{correction}-adjusted p = {q:.2g} >= {ALPHA:g}"
    claimed = mean != null and decision(mean - null, rejected=True) == CLAIMED[direction]
    return (HELD if claimed else NOT_HELD,
            f"{correction}-adjusted p = {q:.2g}, mean on the {'expected' if claimed else 'opposite'} side of {null:g}")


# -- the claims' per-seed values under the one collapse rule (normlab.stats.learning) ------------------------------
def finite(values: Sequence[float | None]) -> list[float]:
    return [float(v) for v in values if v is not None and math.isfinite(float(v))]


def recollapse(details: Sequence[dict]) -> list[dict]:
    """The details with every ``collapsed_<cond>`` flag recomputed by the one collapse rule
    (normlab.stats.learning.collapsed: diverged, i.e. no finite ``bpb_<cond>``, or at or above the unigram level
    minus DID_NOT_LEARN_MARGIN) from its ``bpb_<cond>`` and the ``unigram_bpb`` recorded beside it; a flag
    without them is kept. A diverged run of a split-outcome measure scores log2(vocab) bits/byte, above any
    unigram level, so it stays collapsed."""
    out = []
    for d in details:
        if not isinstance(d, dict) or not isinstance(d.get("unigram_bpb"), (int, float)):
            out.append(d)
            continue
        new = dict(d)
        for k in d:
            if k.startswith("collapsed_") and f"bpb_{k[len('collapsed_'):]}" in d:
                flag = collapsed(d[f"bpb_{k[len('collapsed_'):]}"], d["unigram_bpb"])
                if flag is not None:
                    new[k] = int(flag)
        if "collapse_above_bpb" in d:
            new["collapse_above_bpb"] = d["unigram_bpb"] - DID_NOT_LEARN_MARGIN
        out.append(new)
    return out


def split_values(details: Sequence[dict], a: str, b: str) -> list[float | None]:
    """A split-outcome claim's per-seed values: ``bpb_a - bpb_b`` where neither run collapsed, else None."""
    vals: list[float | None] = []
    for d in details:
        ok = isinstance(d, dict) and d.get(f"collapsed_{a}") == 0 and d.get(f"collapsed_{b}") == 0
        vals.append(float(d[f"bpb_{a}"]) - float(d[f"bpb_{b}"]) if ok else None)
    return vals


def collapse_rates(details: Sequence[dict], variants: Sequence[str] | None = None, level: float = 0.95
                   ) -> dict[str, dict]:
    """Per condition (``variants``, or every ``collapsed_<condition>`` key of the details): collapsed seeds ``k``
    of ``n`` with the exact Clopper-Pearson interval (normlab.stats.clopper_pearson), and the mean final loss of
    the seeds that did not collapse (``bpb_<condition>``; None when every seed collapsed or none is recorded)."""
    dicts = [d for d in details if isinstance(d, dict)]
    conds = list(variants) if variants is not None else list(dict.fromkeys(
        k.removeprefix("collapsed_") for d in dicts for k in d if k.startswith("collapsed_")))
    out = {}
    for v in conds:
        ks = [(int(d[f"collapsed_{v}"]), d.get(f"bpb_{v}")) for d in dicts if d.get(f"collapsed_{v}") is not None]
        if ks:
            cp = clopper_pearson(sum(k for k, _ in ks), len(ks), level)
            kept = [float(x) for k, x in ks if not k and isinstance(x, (int, float))]
            out[v] = {"k": cp.k, "n": cp.n, "rate": cp.rate, "ci": [cp.low, cp.high],
                      "loss_no_collapse": sum(kept) / len(kept) if kept else None, "n_no_collapse": len(kept)}
    return out


def recollapsed(e: dict) -> dict:
    """The entry with its collapse flags (and, for a split-outcome claim, its values) under the one collapse rule;
    ``recollapsed`` is set when that changed anything, so the judged claim carries the new details and values."""
    details = e.get("details") or []
    new = recollapse(details)
    values = e["values"]
    args = e.get("args") or []
    if e["test"] == "collapse" and len(args) >= 2 and new and all(
            isinstance(d, dict) and {f"bpb_{args[0]}", f"bpb_{args[1]}", "unigram_bpb"} <= set(d) for d in new):
        values = split_values(new, args[0], args[1])
        if len(values) != len(e["values"]):
            values = e["values"]
    if new == list(details) and values == e["values"]:
        return e
    return {**e, "details": new, "values": values, "recollapsed": True}
