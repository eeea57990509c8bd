"""How many seeds a difference needs, and how sure that number is.

- ``seeds_needed(delta, sd)``: the smallest ``n`` with ``(t_{0.975, n-1} + t_{power, n-1}) sd / sqrt(n) <= |delta|``.
- ``pooled_sd``: ``s_p^2 = sum_i (n_i - 1) s_i^2 / sum_i (n_i - 1)`` over the variants of a sweep (more degrees of
  freedom than one variant's SD), with a confidence interval for sigma from chi-square with ``sum(n_i - 1)`` df:
  ``[s_p sqrt(df / chi2_{1-a/2, df}), s_p sqrt(df / chi2_{a/2, df})]``.
- ``seeds_needed_range``: ``seeds_needed`` at the pooled SD and at both ends of its interval, so a reader sees how
  uncertain the plan is. For a paired difference of two variants with a common sigma, ``sd(d) = sqrt(2) sigma``
  without shared seed noise (pass ``paired_factor``).
- ``paired_t_power(delta, sd, n, alpha)``: the power of a two-sided paired t-test of level ``alpha`` with ``n``
  pairs against a true mean difference ``delta`` with per-pair SD ``sd``: ``P(|T| > t_{1-alpha/2, n-1})`` with
  ``T`` noncentral t, ``df = n - 1``, noncentrality ``delta / (sd / sqrt(n))`` (scipy.stats.nct).

In a declared family of ``m`` comparisons adjusted by Holm, the first step tests at ``alpha / m``: seeds needed and
power are computed at that level (``holm_first_level``), the level a comparison must reach to be decided at all.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from statistics import stdev

import numpy as np
from scipy.integrate import quad as _quad
from scipy.stats import chi2 as _chi2
from scipy.stats import nct as _nct
from scipy.stats import norm as _norm
from scipy.stats import t as _t

SEEDS_NEEDED_MAX = 1000
"""``seeds_needed`` searches up to this many seeds; beyond it the report says "more than" this."""


def seeds_needed(delta: float, sd: float | None, *, level: float = 0.95, power: float = 0.8,
                 max_n: int = SEEDS_NEEDED_MAX) -> int | None:
    """Smallest ``n >= 2`` whose paired t-test resolves a true difference ``delta`` with probability ``power`` when
    the per-seed differences have standard deviation ``sd``: ``(t_{(1+level)/2, n-1} + t_{power, n-1}) · sd /
    sqrt(n) <= |delta|`` (the usual normal-theory sample-size rule with t quantiles). 2 when ``sd == 0``; None
    when ``delta == 0`` or more than ``max_n`` would be needed."""
    if sd is None or not math.isfinite(sd):
        return None
    if sd == 0.0:
        return 2 if delta else None
    if delta == 0.0:
        return None
    ns, factor = _factors(level, power, max_n)  # (t_{(1+level)/2, n-1} + t_{power, n-1}) / sqrt(n), n = 2..max_n
    hit = np.nonzero(factor * sd <= abs(delta))[0]
    return int(ns[hit[0]]) if hit.size else None


def holm_first_level(alpha: float, m: int) -> float:
    """The level of Holm's first step in a family of ``m`` comparisons: ``alpha / m`` (``alpha`` for ``m <= 1``)."""
    return alpha / max(1, int(m))


def paired_t_power(delta: float, sd: float | None, n: int, alpha: float) -> float | None:
    """Power of the two-sided paired t-test at level ``alpha`` with ``n`` pairs when the true mean difference is
    ``delta`` and the per-pair SD ``sd``: ``nct.sf(c, n-1, nc) + nct.cdf(-c, n-1, nc)``, ``c = t_{1-alpha/2,
    n-1}``, ``nc = delta sqrt(n) / sd``. None when ``n < 2`` or ``sd`` is unknown; 1 for ``sd == 0`` and
    ``delta != 0``."""
    if n < 2 or sd is None or not math.isfinite(sd) or not math.isfinite(delta):
        return None
    if sd == 0.0:
        return 1.0 if delta else alpha
    df = n - 1
    c = float(_t.ppf(1.0 - alpha / 2.0, df))
    nc = delta * math.sqrt(n) / sd
    upper, lower = float(_nct.sf(c, df, nc)), float(_nct.cdf(-c, df, nc))
    if not math.isfinite(upper):
        upper = _nct_tail(c, df, nc, upper=True)
    if not math.isfinite(lower):  # scipy's noncentral t returns nan far in a tail (nc ~ 9 at df 3)
        lower = _nct_tail(-c, df, nc, upper=False)
    return upper + lower


def _nct_tail(x: float, df: int, nc: float, *, upper: bool) -> float:
    """``P(T > x)`` (``upper``) or ``P(T < x)`` for ``T = (Z + nc) / sqrt(V / df)``, ``V ~ chi2(df)``: the integral
    over ``V`` of the normal tail ``P(Z > x sqrt(V / df) - nc)`` (or ``<``), by quadrature; the fallback where scipy's
    ``nct`` gives nan."""
    def f(v: float) -> float:
        z = x * math.sqrt(v / df) - nc
        return float((_norm.sf(z) if upper else _norm.cdf(z)) * _chi2.pdf(v, df))
    return float(_quad(f, 0.0, math.inf)[0])


@lru_cache(maxsize=16)
def _factors(level: float, power: float, max_n: int) -> tuple[np.ndarray, np.ndarray]:
    """``n = 2..max_n`` and ``(t_{(1+level)/2, n-1} + t_{power, n-1}) / sqrt(n)`` (scipy, vectorised once)."""
    ns = np.arange(2, max_n + 1)
    return ns, (_t.ppf(0.5 + level / 2.0, ns - 1) + _t.ppf(power, ns - 1)) / np.sqrt(ns)


@dataclass(frozen=True)
class PooledSD:
    """An SD pooled over groups: ``sd`` with ``df = sum(n_i - 1)`` and its two-sided ``level`` interval."""

    sd: float
    df: int
    low: float
    high: float
    level: float


def pooled_sd(groups: Sequence[Sequence[float]], level: float = 0.95) -> PooledSD | None:
    """Pool the within-group variances of ``groups`` (groups with fewer than 2 values are skipped); None if no df."""
    num = 0.0
    df = 0
    for g in groups:
        vals = [float(v) for v in g]
        if len(vals) >= 2:
            num += (len(vals) - 1) * stdev(vals) ** 2
            df += len(vals) - 1
    if df == 0:
        return None
    sd = math.sqrt(num / df)
    a = 1.0 - level
    low = sd * math.sqrt(df / float(_chi2.ppf(1 - a / 2, df)))
    high = sd * math.sqrt(df / float(_chi2.ppf(a / 2, df)))
    return PooledSD(sd, df, low, high, level)


@dataclass(frozen=True)
class SeedsRange:
    """Seeds needed at the pooled SD (``n``) and at the ends of its interval (``low`` at the small SD, ``high`` at
    the large one); None where more than ``SEEDS_NEEDED_MAX`` would be needed."""

    n: int | None
    low: int | None
    high: int | None
    sd: PooledSD


def seeds_needed_range(delta: float, pooled: PooledSD, *, paired_factor: float = math.sqrt(2.0),
                       level: float = 0.95, power: float = 0.8) -> SeedsRange:
    """Seeds to resolve ``delta`` when the difference's SD is ``paired_factor * sigma`` (sigma = ``pooled``)."""
    f = paired_factor
    return SeedsRange(
        seeds_needed(delta, f * pooled.sd, level=level, power=power),
        seeds_needed(delta, f * pooled.low, level=level, power=power),
        seeds_needed(delta, f * pooled.high, level=level, power=power),
        pooled,
    )
