"""Student-t intervals and tests (``scipy.stats``): the t CDF / quantiles, ``mean_ci``, Welch's test, paired and
Welch differences. ``tests/test_stats.py`` checks them against ``scipy.stats.ttest_rel`` / ``ttest_ind``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import mean, stdev

from scipy.stats import t as _t


def t_cdf(t: float, df: float) -> float:
    """Student-t cumulative distribution ``P(T <= t)`` with ``df > 0`` degrees of freedom (``scipy.stats.t``)."""
    return float(_t.cdf(t, df))


def t_ppf(p: float, df: float) -> float:
    """Quantile of the Student-t distribution: the ``t`` with ``t_cdf(t, df) = p`` (``scipy.stats.t.ppf``)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be in (0, 1), got {p}")
    return float(_t.ppf(p, df))


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


def two_sided_t_p(t: float, df: float) -> float:
    """``P(|T| >= |t|)`` for Student-t with ``df`` degrees of freedom (``2 * t.sf(|t|)``, no cancellation)."""
    if math.isinf(t):
        return 0.0
    return min(1.0, max(0.0, float(2.0 * _t.sf(abs(t), df))))


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
    return Welch(t, df, two_sided_t_p(t, df))


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
    return Diff(mean(d), t_ppf(0.5 + level / 2.0, n - 1) * se, n, sd, n - 1, two_sided_t_p(mean(d) / se, n - 1), True)


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
