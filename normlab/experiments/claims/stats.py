"""Mean, Student-t confidence interval and the verdict of a claim.

The CI is ``mean ± t_{1-a/2, n-1} * sd / sqrt(n)`` over per-seed values (``sd`` with ``n - 1``). The t quantile is
computed here (no scipy): the Student-t CDF through the regularized incomplete beta function (continued fraction,
Numerical Recipes ``betacf``), inverted by bisection.

Verdicts (``direction``):

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
from typing import Sequence

HELD, NOT_HELD, INCONCLUSIVE = "held", "not held", "inconclusive"
DIRECTIONS = ("greater", "less", "within", "exact")


def _betacf(a: float, b: float, x: float) -> float:
    tiny, eps = 1e-300, 3e-16
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 1000):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        de = d * c
        h *= de
        if abs(de - 1.0) < eps:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta ``I_x(a, b)``."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    lbt = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(lbt) * _betacf(a, b, x) / a
    return 1.0 - math.exp(lbt) * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """Student-t CDF with ``df`` degrees of freedom."""
    x = df / (df + t * t)
    tail = 0.5 * betainc(df / 2.0, 0.5, x)
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """``t`` with ``t_cdf(t, df) = p`` (bisection; |error| < 1e-10)."""
    if not 0.0 < p < 1.0 or df <= 0:
        raise ValueError(f"t_quantile needs 0 < p < 1 and df > 0, got p={p}, df={df}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12:
            break
    return 0.5 * (lo + hi)


def finite(values: Sequence[float | None]) -> list[float]:
    return [float(v) for v in values if v is not None and math.isfinite(float(v))]


def mean_ci(values: Sequence[float | None], level: float = 0.95) -> tuple[float | None, tuple[float, float] | None, int]:
    """``(mean, (lo, hi), n)`` over the finite values; CI None when n < 2 (mean None when n = 0)."""
    xs = finite(values)
    n = len(xs)
    if n == 0:
        return None, None, 0
    m = sum(xs) / n
    if n < 2:
        return m, None, n
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (n - 1))
    half = t_quantile(1.0 - (1.0 - level) / 2.0, n - 1) * sd / math.sqrt(n)
    return m, (m - half, m + half), n


def verdict(values: Sequence[float | None], direction: str, *, null: float = 0.0, margin: float | None = None,
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
    m, ci, n = mean_ci(values, level)
    out = {"measured": m, "ci": list(ci) if ci else None, "n": n}
    if ci is None:
        return {**out, "verdict": INCONCLUSIVE, "reason": f"{n} finite value(s): a CI needs at least 2"}
    lo, hi = ci
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
