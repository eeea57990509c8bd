"""Small-sample statistics (the one copy: the report, the claims suite and the scaling forecasts use it), without scipy: Student-t CDF / quantiles, confidence intervals, Welch's t-test.

The t CDF uses the regularized incomplete beta function (continued fraction, Numerical Recipes 6.4):
``P(T <= t) = 1 - I_x(df/2, 1/2) / 2`` for ``t > 0`` with ``x = df / (df + t^2)``. Quantiles invert it by bisection,
which is exact to ~1e-10 for any real ``df > 0`` (Welch's df is not an integer); two-sided p-values are
``I_x(df/2, 1/2)`` directly. Written before scipy became a dependency (the scaling fits use its optimisers), and
kept so that the report and the claims suite need no scipy import; ``tests/test_report.py`` checks these against
tabulated values, numerical integration and ``scipy.stats.ttest_ind(equal_var=False)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import mean, stdev


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction for the incomplete beta function (modified Lentz)."""
    tiny, eps = 1e-300, 1e-15
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c if abs(1.0 + aa / c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c if abs(1.0 + aa / c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < eps:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta ``I_x(a, b)`` for ``a, b > 0``, ``0 <= x <= 1``."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """Student-t cumulative distribution ``P(T <= t)`` with ``df > 0`` degrees of freedom."""
    if math.isinf(t):
        return 1.0 if t > 0 else 0.0
    tail = 0.5 * betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


def t_ppf(p: float, df: float) -> float:
    """Quantile of the Student-t distribution: the ``t`` with ``t_cdf(t, df) = p`` (bisection)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be in (0, 1), got {p}")
    if p == 0.5:
        return 0.0
    if p < 0.5:
        return -t_ppf(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


@dataclass(frozen=True)
class MeanCI:
    """Mean of ``n`` values with the half-width of its two-sided ``level`` t-interval (None when ``n < 2``)."""

    mean: float
    half: float | None
    n: int
    sd: float | None

    @property
    def low(self) -> float | None:
        return None if self.half is None else self.mean - self.half

    @property
    def high(self) -> float | None:
        return None if self.half is None else self.mean + self.half


def mean_ci(values: list[float], level: float = 0.95) -> MeanCI:
    """``mean ± t_{(1+level)/2, n-1} * sd / sqrt(n)`` (sample sd, ``n - 1`` denominator)."""
    vals = [float(v) for v in values]
    if not vals:
        raise ValueError("mean_ci needs at least one value")
    if len(vals) < 2:
        return MeanCI(vals[0], None, 1, None)
    sd = stdev(vals)
    half = t_ppf(0.5 + level / 2.0, len(vals) - 1) * sd / math.sqrt(len(vals))
    return MeanCI(mean(vals), half, len(vals), sd)


def _two_sided_p(t: float, df: float) -> float:
    """``P(|T| >= |t|) = I_x(df/2, 1/2)`` with ``x = df / (df + t^2)``, computed directly (not as
    ``2 (1 - t_cdf(|t|))``, which loses the relative precision of small p-values to cancellation)."""
    if math.isinf(t):
        return 0.0
    return min(1.0, max(0.0, betainc(df / 2.0, 0.5, df / (df + t * t))))


@dataclass(frozen=True)
class Welch:
    """Welch's unequal-variance t-test of ``mean(a) - mean(b)``: statistic, Welch–Satterthwaite df, two-sided p."""

    t: float
    df: float
    p: float


def welch(a: list[float], b: list[float]) -> Welch | None:
    """Two-sided Welch t-test; None when either sample has fewer than 2 values or both have zero variance."""
    if len(a) < 2 or len(b) < 2:
        return None
    va, vb = stdev(a) ** 2 / len(a), stdev(b) ** 2 / len(b)
    if va + vb == 0.0:
        return None
    t = (mean(a) - mean(b)) / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    return Welch(t, df, _two_sided_p(t, df))


# -- paired differences, Welch intervals, power -----------------------------------------------------------------
@dataclass(frozen=True)
class Diff:
    """A difference of means ``a - b`` with its two-sided ``level`` interval: ``paired`` (t over the per-pair
    differences, ``df = n - 1``) or Welch (``paired=False``, Welch–Satterthwaite ``df``). ``sd``: of the
    differences (paired) or ``sqrt(n * (var_a/n_a + var_b/n_b))`` with ``n = min(n_a, n_b)`` (Welch), the spread
    the power estimate uses. ``half``/``p`` are None when the interval is undefined (n < 2 or no spread)."""

    mean: float
    half: float | None
    n: int
    sd: float | None
    df: float | None
    p: float | None
    paired: bool

    @property
    def resolved(self) -> bool:
        """The interval excludes 0."""
        return self.half is not None and abs(self.mean) > self.half


def paired_diff(a: list[float], b: list[float], level: float = 0.95) -> Diff:
    """Paired t interval of ``mean(a_i - b_i)``: ``d̄ ± t_{(1+level)/2, n-1} · sd(d) / sqrt(n)`` (``a[i]`` and
    ``b[i]`` share a seed, or a (seed, learning rate) cell)."""
    if len(a) != len(b) or not a:
        raise ValueError("paired_diff needs two equally long, non-empty samples")
    d = [float(x) - float(y) for x, y in zip(a, b)]
    n = len(d)
    if n < 2:
        return Diff(d[0], None, 1, None, None, None, True)
    sd = stdev(d)
    if sd == 0.0:
        return Diff(mean(d), 0.0, n, 0.0, n - 1, 0.0 if mean(d) else 1.0, True)
    se = sd / math.sqrt(n)
    return Diff(mean(d), t_ppf(0.5 + level / 2.0, n - 1) * se, n, sd, n - 1, _two_sided_p(mean(d) / se, n - 1), True)


def welch_diff(a: list[float], b: list[float], level: float = 0.95) -> Diff:
    """Welch interval of ``mean(a) - mean(b)`` for unpaired samples: ``± t_{(1+level)/2, df} · sqrt(va/na + vb/nb)``."""
    if not a or not b:
        raise ValueError("welch_diff needs two non-empty samples")
    m = mean(a) - mean(b)
    if len(a) < 2 or len(b) < 2:
        return Diff(m, None, min(len(a), len(b)), None, None, None, False)
    w = welch(a, b)
    se2 = stdev(a) ** 2 / len(a) + stdev(b) ** 2 / len(b)
    n = min(len(a), len(b))
    if w is None:
        return Diff(m, 0.0, n, 0.0, None, 0.0 if m else 1.0, False)
    return Diff(m, t_ppf(0.5 + level / 2.0, w.df) * math.sqrt(se2), n, math.sqrt(n * se2), w.df, w.p, False)


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
    for n in range(2, max_n + 1):
        if (t_ppf(0.5 + level / 2.0, n - 1) + t_ppf(power, n - 1)) * sd / math.sqrt(n) <= abs(delta):
            return n
    return None
