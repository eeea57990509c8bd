"""Exact small-sample tests and intervals that need no normality.

Both tests compute with ``scipy.stats.permutation_test``.

- Exact sign-flip test (paired): ``T = mean(d)``; over all ``2^n`` sign patterns of ``d``, the two-sided
  ``p = #{|T*| >= |T|} / 2^n``. Its smallest attainable p is ``2 / 2^n`` (n = 3: 0.25, n = 5: 0.0625).
- Permutation test (unpaired): over all splits of the pooled values into groups of the original sizes (or a
  seeded Monte-Carlo sample of them when there are too many), ``p = #{|Δ*| >= |Δ|} / #splits``.
- Clopper–Pearson exact interval for a rate ``k / n``: ``[Beta(a/2; k, n-k+1), Beta(1-a/2; k+1, n-k)]``
  (scipy's ``binomtest(k, n).proportion_ci(method="exact")``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats as _ps
from scipy.stats import beta as _beta

EXACT_MAX_N = 20  # 2^20 sign patterns / splits at most; above this a seeded Monte-Carlo sample is used
MC_SAMPLES = 100_000


def min_sign_flip_p(n: int) -> float:
    """The smallest two-sided p the exact sign-flip test can reach with ``n`` pairs: ``2 / 2^n`` (1 for n = 0)."""
    return 1.0 if n <= 0 else min(1.0, 2.0 / 2.0**n)


def min_permutation_p(n_a: int, n_b: int) -> float:
    """The smallest two-sided p the exact permutation test can reach with groups of ``n_a`` and ``n_b`` distinct
    values: ``2 / C(n_a + n_b, n_a)`` when the sizes are equal (a split and its mirror), else ``1 / C(...)``."""
    if n_a <= 0 or n_b <= 0:
        return 1.0
    return min(1.0, (2.0 if n_a == n_b else 1.0) / math.comb(n_a + n_b, n_a))


def _abs_mean_diff(x, y, axis=-1):
    return np.abs(np.mean(x, axis=axis) - np.mean(y, axis=axis))


def _abs_mean(x, axis=-1):
    return np.abs(np.mean(x, axis=axis))


def sign_flip_p(d: Sequence[float], *, seed: int = 0) -> float | None:
    """Two-sided exact sign-flip p-value of ``mean(d) = 0`` (None for an empty ``d``): scipy's
    ``permutation_test`` on one sample, which flips signs; exact for ``n <= 20``, a seeded sample above."""
    vals = np.asarray([float(x) for x in d])
    if vals.size == 0:
        return None
    if not np.any(vals):
        return 1.0
    res = _ps.permutation_test((vals,), _abs_mean, permutation_type="samples", vectorized=True,
                               n_resamples=np.inf if vals.size <= EXACT_MAX_N else MC_SAMPLES,
                               alternative="greater", rng=np.random.default_rng(seed))
    return float(res.pvalue)


def permutation_p(a: Sequence[float], b: Sequence[float], *, seed: int = 0) -> float | None:
    """Two-sided permutation p-value of ``mean(a) - mean(b) = 0`` over group labels (None if a group is empty):
    scipy's ``permutation_test``, exact when the splits number at most ``2^20``."""
    x, y = np.asarray([float(v) for v in a]), np.asarray([float(v) for v in b])
    if x.size == 0 or y.size == 0:
        return None
    exact = math.comb(x.size + y.size, x.size) <= 2**EXACT_MAX_N
    res = _ps.permutation_test((x, y), _abs_mean_diff, permutation_type="independent", vectorized=True,
                               n_resamples=np.inf if exact else MC_SAMPLES, alternative="greater",
                               rng=np.random.default_rng(seed))
    return float(res.pvalue)


@dataclass(frozen=True)
class ClopperPearson:
    """A rate ``k / n`` with its exact two-sided ``level`` interval."""

    k: int
    n: int
    rate: float
    low: float
    high: float
    level: float


def clopper_pearson(k: int, n: int, level: float = 0.95) -> ClopperPearson:
    """Exact Clopper–Pearson interval for ``k`` successes in ``n`` trials (``0 <= k <= n``, ``n >= 1``)."""
    if n < 1 or not 0 <= k <= n:
        raise ValueError(f"clopper_pearson needs 0 <= k <= n and n >= 1, got k={k}, n={n}")
    a = 1.0 - level
    low = 0.0 if k == 0 else float(_beta.ppf(a / 2, k, n - k + 1))
    high = 1.0 if k == n else float(_beta.ppf(1 - a / 2, k + 1, n - k))
    return ClopperPearson(k, n, k / n, low, high, level)
