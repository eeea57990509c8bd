"""Group-sequential tests: Lan–DeMets alpha spending with the O'Brien–Fleming-type function, the small-sample
transform of a t statistic, and a Holm step-down over several comparisons at every look.

Alpha spending (Lan & DeMets 1983, "Discrete sequential boundaries for clinical trials", Biometrika 70(3)):
at information fraction ``t`` (here seeds so far / the plan's maximum seeds) the type-I error spent so far on
each side of a two-sided test of level ``alpha`` is, for the O'Brien–Fleming-type function with the one-sided level
``a = alpha / 2``,

    a(t) = 2 - 2 * Phi(z_{1 - a/2} / sqrt(t)),        a(1) = a,        two-sided: alpha(t) = 2 a(t).

This is the convention of the published tables and of gsDesign (``sfLDOF``) and ldbounds (two-sided symmetric
bounds spend ``alpha / 2`` per side): for five equally spaced looks at ``alpha = 0.05`` it gives 4.877, 3.357,
2.680, 2.290, 2.031. (Spending ``2 - 2 Phi(z_{1 - alpha/2} / sqrt(t))`` over both sides together instead would give
a first boundary of 1.96 / sqrt(0.2) = 4.383: the same total alpha, spent slightly earlier.)

At looks ``t_1 < ... < t_K`` the boundary ``c_k`` solves

    P(|Z_1| < c_1, ..., |Z_{k-1}| < c_{k-1}, |Z_k| >= c_k) = alpha(t_k) - alpha(t_{k-1})

under the null, where ``Z_k`` is the standardised statistic at look ``k`` with the canonical joint distribution
``corr(Z_i, Z_j) = sqrt(t_i / t_j)`` (independent increments of ``S_k = Z_k sqrt(t_k)``; Jennison & Turnbull 2000,
"Group Sequential Methods with Applications to Clinical Trials", chapter 3 and the numerical integration of
section 19.2, which ``crossing_probabilities`` implements on a Simpson grid). The boundaries depend only on the
fractions up to the current look, so an unplanned look (a time budget that ends the plan early) is valid.

Small samples: with ``n`` seeds the paired statistic is Student-t with ``n - 1`` degrees of freedom, not normal.
``t_to_z`` maps it to the normal scale with the same tail probability, ``z = Phi^{-1}(F_t(t; n - 1))``, and the
boundary is applied to ``z`` (Jennison & Turnbull section 11.4's "significance level" approach). Marginally ``z``
is exactly N(0, 1) under the null; the joint law is the canonical one only approximately, which
``tests/report/test_sequential.py`` checks by simulating the whole procedure.

The transform alone is not enough at very small ``n``: with looks at 2/4/6/8 seeds and three comparisons the
whole procedure's simulated family-wise error is 0.054 (benchmarks/sequential_error.py), because the joint law of
the transformed statistics across looks is not the canonical one when ``n - 1`` is 1 or 3. ``t_boundaries`` is the
t-based look that removes it: the boundaries on the ``z`` scale are calibrated by simulating the paired t statistic
itself under the null (``T_SIMULATIONS`` seeded sweeps of standard normal per-seed differences at the plan's seed
counts; the boundary at look ``k`` is placed between order statistics of ``|z_k|`` among the sweeps that crossed no
earlier boundary, so that at most ``alpha(t_k) - alpha(t_{k-1})``, less two Monte-Carlo standard errors, of the
simulated sweeps cross there). The
statistic is scale-free, so the same boundaries hold for any SD; they are deterministic (a fixed generator seed) and
converge to ``spending_boundaries`` as ``n`` grows. ``HolmLevels.build_t`` builds every Holm level from one set of
draws; the looks of a real sweep (normlab.report.sequential) use it.

Several comparisons: ``sequential_holm`` is the group-sequential Holm procedure (Ye, Li, Jiang & Wang 2013,
"A group sequential Holm procedure with multiple primary endpoints", Stat Med 32(7); Maurer & Bretz 2013, "Multiple
testing in group sequential trials using graphical approaches", Stat Biopharm Res 5(4)): with ``r`` of ``m``
hypotheses rejected, each remaining one is tested against the boundary spent at level ``alpha / (m - r)``; after a
rejection the levels are raised and the current look is tested again. It controls the family-wise error over all
looks and comparisons at ``alpha`` (strongly; checked by simulation under the global and a partial null).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import brentq
from scipy.stats import norm
from scipy.stats import t as _t

GRID = 801  # Simpson points per look (odd); boundaries agree with a 3201-point grid to < 1e-6
MAX_BOUNDARY = 40.0  # a look that spends (almost) nothing gets this boundary: never crossed


def obf_spending(t: float | np.ndarray, alpha: float) -> float | np.ndarray:
    """Two-sided alpha spent by information fraction ``t`` in [0, 1]: ``2 (2 - 2 Phi(z_{1-alpha/4} / sqrt(t)))``,
    the O'Brien–Fleming-type function of Lan & DeMets 1983 spent on each side at ``alpha / 2`` (module docstring);
    ``t = 0`` spends 0 and ``t = 1`` spends ``alpha``."""
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    ts = np.asarray(t, dtype=float)
    if np.any(ts < 0) or np.any(ts > 1):
        raise ValueError(f"information fractions must be in [0, 1], got {t}")
    z = norm.isf(alpha / 4.0)
    with np.errstate(divide="ignore"):
        out = np.where(ts > 0, 4.0 * norm.sf(z / np.sqrt(np.where(ts > 0, ts, 1.0))), 0.0)
    return float(out) if np.ndim(out) == 0 else out


def _check_fractions(fractions: Sequence[float]) -> np.ndarray:
    t = np.asarray(list(fractions), dtype=float)
    if t.ndim != 1 or len(t) == 0 or np.any(t <= 0) or np.any(t > 1) or np.any(np.diff(t) <= 0):
        raise ValueError(f"information fractions must increase strictly within (0, 1], got {list(fractions)}")
    return t


def _simpson(n: int) -> np.ndarray:
    w = np.ones(n)
    w[1:-1:2], w[2:-1:2] = 4.0, 2.0
    return w / 3.0


class _Recursion:
    """The density of ``Z_k`` on the continuation region, carried look to look (Jennison & Turnbull 19.2).

    ``drift``: ``E[S_k] = drift * t_k`` (``S_k = Z_k sqrt(t_k)``); 0 under the null. For a mean difference ``delta``
    with per-seed SD ``sigma`` and ``N`` seeds at ``t = 1``, ``drift = delta / sigma * sqrt(N)``."""

    def __init__(self, drift: float = 0.0):
        self.drift = drift
        self.z: np.ndarray | None = None  # grid of Z_{k-1} values inside (-c, c)
        self.dens: np.ndarray | None = None  # sub-density there (Simpson weights folded in)
        self.t_prev = 0.0

    def cross(self, t: float, c: float) -> float:
        """P(no crossing before this look and |Z_k| >= c at fraction ``t``)."""
        sd = math.sqrt(t - self.t_prev)
        mu_inc = self.drift * (t - self.t_prev)
        hi = c * math.sqrt(t)
        if self.z is None:
            return float(norm.sf((hi - mu_inc) / sd) + norm.cdf((-hi - mu_inc) / sd))
        s_prev = self.z * math.sqrt(self.t_prev)
        up = norm.sf((hi - s_prev - mu_inc) / sd)
        lo = norm.cdf((-hi - s_prev - mu_inc) / sd)
        return float(np.dot(self.dens, up + lo))

    def advance(self, t: float, c: float) -> None:
        """Move the density to look ``t`` restricted to ``|Z| < c``."""
        zs = np.linspace(-c, c, GRID)
        w = _simpson(GRID) * (zs[1] - zs[0])
        s = zs * math.sqrt(t)
        sd = math.sqrt(t - self.t_prev)
        mu_inc = self.drift * (t - self.t_prev)
        if self.z is None:  # density of S_1 = Z_1 sqrt(t), in terms of z: phi((s - mu)/sd) / sd * sqrt(t)
            f = norm.pdf((s - mu_inc) / sd) / sd * math.sqrt(t)
        else:
            s_prev = self.z * math.sqrt(self.t_prev)
            k = norm.pdf((s[:, None] - s_prev[None, :] - mu_inc) / sd) / sd * math.sqrt(t)
            f = k @ self.dens
        self.z, self.dens, self.t_prev = zs, f * w, t


def spending_boundaries(fractions: Sequence[float], alpha: float) -> list[float]:
    """Two-sided boundaries ``c_1..c_K`` on the Z scale for looks at ``fractions`` (strictly increasing in
    (0, 1]) spending ``obf_spending`` at level ``alpha``. A look whose increment spends less than ~1e-15 gets
    ``MAX_BOUNDARY``. With ``fractions[-1] < 1`` the alpha left unspent is simply not used (conservative)."""
    t = _check_fractions(fractions)
    spent = obf_spending(t, alpha)
    rec = _Recursion()
    out: list[float] = []
    prev = 0.0
    for tk, sk in zip(t, spent):
        target = float(sk) - prev
        prev = float(sk)
        if target < 1e-15:
            c = MAX_BOUNDARY
        else:
            def excess(c: float, tk: float = float(tk), target: float = target) -> float:
                return rec.cross(tk, c) - target

            c = MAX_BOUNDARY if excess(MAX_BOUNDARY) > 0 else brentq(excess, 1e-6, MAX_BOUNDARY, xtol=1e-10)
        out.append(float(c))
        rec.advance(float(tk), c)
    return out


def crossing_probabilities(boundaries: Sequence[float], fractions: Sequence[float], drift: float = 0.0
                           ) -> list[float]:
    """P(first crossing at look k), k = 1..K, of ``|Z_k| >= boundaries[k]`` (numerical integration; ``drift``
    as in ``_Recursion``: 0 under the null, ``delta / sigma * sqrt(N)`` for a paired mean ``delta``). Their sum is
    the procedure's rejection probability: alpha (spent so far) under the null, the power under ``drift``."""
    t = _check_fractions(fractions)
    if len(boundaries) != len(t):
        raise ValueError("one boundary per look")
    rec = _Recursion(drift)
    out = []
    for tk, c in zip(t, boundaries):
        out.append(rec.cross(float(tk), float(c)))
        rec.advance(float(tk), float(c))
    return out


def t_to_z(t: float | np.ndarray, df: float | np.ndarray) -> float | np.ndarray:
    """``Phi^{-1}(F_t(t; df))``: the normal score with the same tail probability as Student-t ``t`` (computed
    from the upper tail, ``sign(t) * Phi^{-1}(1 - F_t(-|t|))``, so large ``|t|`` keep their precision)."""
    ts = np.asarray(t, dtype=float)
    z = np.sign(ts) * norm.isf(_t.sf(np.abs(ts), df))
    return float(z) if np.ndim(z) == 0 else z


def paired_z(diffs: np.ndarray) -> np.ndarray:
    """Normal-scale statistics of paired differences: ``diffs`` of shape ``(..., n, m)`` (``n`` seeds, ``m``
    comparisons) -> ``(..., m)``, ``t_to_z(mean / (sd / sqrt(n)), n - 1)`` (sample SD). A zero SD with a nonzero
    mean is +-inf, with a zero mean 0; ``n < 2`` is NaN (not testable)."""
    d = np.asarray(diffs, dtype=float)
    n = d.shape[-2]
    if n < 2:
        return np.full(d.shape[:-2] + d.shape[-1:], np.nan)
    mean = d.mean(axis=-2)
    sd = d.std(axis=-2, ddof=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = mean / (sd / math.sqrt(n))
        t = np.where(sd > 0, t, np.where(mean == 0, 0.0, np.sign(mean) * np.inf))
    return np.asarray(t_to_z(t, n - 1))


def nominal_p(boundary: float) -> float:
    """The two-sided p-value a single test must reach at a look to cross ``boundary``: ``2 (1 - Phi(c))``."""
    return float(2.0 * norm.sf(boundary))


T_SIMULATIONS = 200_000  # null sweeps simulated to calibrate the t-based boundaries (Monte-Carlo SE ~0.0005 at 0.05)
T_SIM_SEED = 12345


def _null_z_paths(looks: tuple[int, ...], n_sim: int, seed: int) -> np.ndarray:
    """``(n_sim, K)``: the transformed paired statistic ``t_to_z(t, n - 1)`` at each look's seed count ``looks[k]``
    for ``n_sim`` sweeps of standard normal per-seed differences (drawn look by look, so a look's values do not
    depend on the later looks)."""
    rng = np.random.default_rng(seed)
    total = np.zeros(n_sim)
    sumsq = np.zeros(n_sim)
    out = np.empty((n_sim, len(looks)))
    prev = 0
    for k, n in enumerate(looks):
        x = rng.standard_normal((n_sim, n - prev))
        total += x.sum(axis=1)
        sumsq += (x * x).sum(axis=1)
        prev = n
        mean = total / n
        sd = np.sqrt(np.maximum(sumsq - n * mean * mean, 0.0) / (n - 1))
        out[:, k] = t_to_z(mean / (sd / math.sqrt(n)), n - 1)
    return out


def _calibrate(z: np.ndarray, spent: np.ndarray, level: float) -> list[float]:
    """Boundaries from simulated null paths ``z`` (``(S, K)``): at look ``k`` at most ``(spent[k] - spent[k-1]) S``
    of the paths that have not crossed yet cross (the boundary halfway between two order statistics of ``|z_k|``);
    a look allowed no crossing gets ``MAX_BOUNDARY``. The spending is first scaled down by two Monte-Carlo standard
    errors of the plan's total ``level`` (``1 - 2 sqrt((1 - a) / (a S))``, ``a = level``; the same factor whichever
    looks are given, so a look's boundary never depends on later looks), so that the error of the calibrated
    procedure stays at or below ``level`` despite the simulation's own noise."""
    s_n = z.shape[0]
    spent = np.asarray(spent) * max(0.0, 1.0 - 2.0 * math.sqrt((1.0 - level) / (level * s_n)))
    alive = np.ones(s_n, dtype=bool)
    out: list[float] = []
    prev = 0.0
    for k in range(z.shape[1]):
        allowed = int(math.floor((float(spent[k]) - prev) * s_n + 1e-9))
        prev = float(spent[k])
        a = np.where(alive, np.abs(z[:, k]), -np.inf)
        if allowed <= 0:
            c = MAX_BOUNDARY
        else:
            top = -np.partition(-a, allowed)[: allowed + 1]  # the allowed + 1 largest, unordered
            top.sort()
            hi, lo = top[1], top[0]  # the allowed-th largest and the next one below it
            c = MAX_BOUNDARY if not np.isfinite(hi) else float(min(MAX_BOUNDARY, (hi + max(lo, 0.0)) / 2.0
                                                                   if np.isfinite(lo) else hi))
        out.append(float(c))
        alive &= np.abs(z[:, k]) < c
    return out


def t_boundaries(looks: Sequence[int], n_max: int, alpha: float, *, n_sim: int = T_SIMULATIONS,
                 seed: int = T_SIM_SEED) -> list[float]:
    """t-based boundaries on the ``z = t_to_z(t, n - 1)`` scale for looks at ``looks`` seeds (each >= 2, strictly
    increasing, at most ``n_max``, the plan's cap) spending ``obf_spending(n / n_max, alpha)``, calibrated by
    simulating the paired t statistic under the null (module docstring)."""
    lk = tuple(int(n) for n in looks)
    if not lk or lk[0] < 2 or any(b <= a for a, b in zip(lk, lk[1:])) or lk[-1] > n_max:
        raise ValueError(f"looks must be strictly increasing seed counts >= 2 and <= {n_max}, got {list(looks)}")
    return _calibrate(_null_z_paths(lk, n_sim, seed), np.atleast_1d(obf_spending(np.array(lk) / n_max, alpha)), alpha)


@dataclass(frozen=True)
class HolmLevels:
    """Boundaries at each Holm level ``alpha / j`` (``j = m, m-1, ..., 1``) for the looks so far."""

    alpha: float
    m: int
    fractions: tuple[float, ...]
    bounds: dict[int, list[float]]  # j -> boundaries at level alpha / j

    @classmethod
    def build(cls, fractions: Sequence[float], alpha: float, m: int) -> HolmLevels:
        if m < 1:
            raise ValueError("at least one comparison")
        fr = tuple(float(x) for x in _check_fractions(fractions))
        return cls(alpha, m, fr, {j: spending_boundaries(fr, alpha / j) for j in range(1, m + 1)})

    @classmethod
    def build_t(cls, looks: Sequence[int], n_max: int, alpha: float, m: int, *, n_sim: int = T_SIMULATIONS,
                seed: int = T_SIM_SEED) -> HolmLevels:
        """The t-based boundaries (``t_boundaries``) at every Holm level ``alpha / j``, from one set of draws."""
        if m < 1:
            raise ValueError("at least one comparison")
        lk = tuple(int(n) for n in looks)
        t_boundaries(lk, n_max, alpha, n_sim=2, seed=seed)  # validates the looks
        z = _null_z_paths(lk, n_sim, seed)
        fr = np.array(lk) / n_max
        return cls(alpha, m, tuple(float(x) for x in fr),
                   {j: _calibrate(z, np.atleast_1d(obf_spending(fr, alpha / j)), alpha / j) for j in range(1, m + 1)})


def sequential_holm(z: np.ndarray, levels: HolmLevels) -> np.ndarray:
    """The group-sequential Holm procedure (module docstring) on ``z`` of shape ``(S, K, m)``: ``S`` independent
    sweeps (1 for a real one), the normal-scale statistics at looks ``1..K`` (``K <= len(levels.fractions)``) of
    ``m`` comparisons (NaN: not tested at that look). Returns ``(S, m)`` ints: the look (0-based) at which each
    comparison was rejected, -1 if never. A rejection is final (the comparison is decided from then on)."""
    z = np.asarray(z, dtype=float)
    if z.ndim != 3 or z.shape[2] != levels.m or z.shape[1] > len(levels.fractions):
        raise ValueError(f"z must have shape (S, K <= {len(levels.fractions)}, {levels.m}), got {z.shape}")
    s_n, k_n, m = z.shape
    rejected_at = np.full((s_n, m), -1, dtype=int)
    absz = np.abs(np.nan_to_num(z, nan=0.0))
    for k in range(k_n):
        while True:  # raise the level after each rejection and test this look again
            open_ = rejected_at < 0
            remaining = open_.sum(axis=1)  # (S,)
            c = np.array([levels.bounds[j][k] if j > 0 else np.inf for j in range(m + 1)])[remaining]
            new = open_ & (absz[:, k, :] >= c[:, None])
            if not new.any():
                break
            rejected_at[new] = k
    return rejected_at
