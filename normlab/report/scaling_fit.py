"""Scaling-law fits, bootstrap intervals, crossovers and signal-to-noise ratios (pure numbers; docs/scaling.md).

Fits follow Hoffmann et al. 2022 ("Training Compute-Optimal Large Language Models", Appendix D.2): the loss law
``L(N) = E + A N^-alpha`` (or ``L(N, D) = E + A N^-alpha + B D^-beta``) is written with ``E = exp(e)``,
``A = exp(a)``, ``B = exp(b)`` as ``log L = LSE(a - alpha log N, e)`` and fitted by minimising the Huber loss
of the log-loss residuals with L-BFGS (scipy) from several starts, keeping the best. Being robust and in log
space, an outlying size does not pull the fit and every size counts alike. Hoffmann et al.'s ``delta = 1e-3`` is
raised to Huber's ``1.345`` standard errors of a size's mean when the seeds are noisier than that (``huber_delta``).

The fit is to the mean over seeds at each size. Intervals are percentile bootstraps over seeds (Efron & Tibshirani
1993): each replicate redraws, at every size, as many seeds as were run, with replacement, and refits the means
(warm-started from the full fit). The same seed draws are
used for every variant, so differences between variants are paired by seed (a seed gives every variant the same
data order). With 2 seeds a size has only 3 distinct draws, so the intervals are coarse; more seeds sharpen them.

Signal-to-noise (Heineman et al. 2025, "Signal and Noise: A Framework for Reducing Uncertainty in Language Model
Evaluation"): ``signal = max_{j,k} |m_j - m_k| / mean(m)`` over the compared models' scores, ``noise = sd / mean``
of the scores over a run's final ``n`` checkpoints (population sd), ``SNR = signal / noise``. For a comparison of
two variants the signal is ``|m_a - m_b| / mean(m_a, m_b)`` (means over seeds) and the noise is the mean of the
runs' relative sds over their last ``n`` validation evaluations. The seed SNR is ``|m_a - m_b|`` over the pooled
seed-to-seed standard deviation ``sqrt((s_a^2 + s_b^2) / 2)`` (sample sds).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
from scipy.optimize import brentq, minimize

HUBER_DELTA = 1e-3
LEVEL = 0.95
INIT_EXPONENTS = np.concatenate([np.linspace(0.02, 0.3, 8), np.linspace(0.35, 2.0, 12)])
BOUNDS_EXP = (0.0, 3.0)  # alpha, beta: a loss law that rises with size is reported at the bound, not fitted
BOUNDS_LOG_E = (-20.0, 10.0)  # e = log E: E >= 0 in effect
BOUNDS_LOG_A = (-50.0, 80.0)
# A parameter within these tolerances of its bound is "at the bound" (the optimiser stops short of the box edge when
# the objective is flat there: for E -> 0 the gradient in e = log E vanishes like E / L)
E_REL_TOL = 1e-3        # E below 1e-3 of the smallest fitted loss: the E >= 0 bound
EXP_TOL = 1e-3          # alpha or beta within 1e-3 of 0 or 3
LOG_TOL = 1e-3          # log A, log B within 1e-3 of their box
ZERO_WIDTH_REL = 1e-6   # a bootstrap interval narrower than 1e-6 of the value: every replicate stuck at one value
SIGNIFICANCE = 0.05     # Welch's t-test level for "a measured difference is decisive at this size"


def huber(r: np.ndarray, delta: float = HUBER_DELTA) -> np.ndarray:
    a = np.abs(r)
    return np.where(a <= delta, 0.5 * r * r, delta * (a - 0.5 * delta))


def _huber_grad(r: np.ndarray, delta: float) -> np.ndarray:
    return np.clip(r, -delta, delta)


@dataclass(frozen=True)
class PowerLaw:
    """``L(N) = E + A N^-alpha`` (and ``+ B D^-beta`` when ``B`` is set)."""

    E: float
    A: float
    alpha: float
    B: float | None = None
    beta: float | None = None
    objective: float = 0.0

    def __call__(self, n: Any, d: Any = None) -> Any:
        n = np.asarray(n, dtype=float)
        out = self.E + self.A * n ** (-self.alpha)
        if self.B is not None:
            out = out + self.B * np.asarray(d, dtype=float) ** (-self.beta)
        return out

    def params(self) -> dict[str, float]:
        keys = ("E", "A", "alpha") + (("B", "beta") if self.B is not None else ())
        return {k: float(getattr(self, k)) for k in keys}


def _objective(x: np.ndarray, feats: np.ndarray, y: np.ndarray, delta: float) -> tuple[float, np.ndarray]:
    """Huber objective (divided by ``delta^2`` so the optimiser's tolerances are relative to the residual scale)
    and its gradient. ``x = (e, a, alpha[, b, beta])``; ``feats`` columns: log N[, log D]."""
    k = feats.shape[1]
    terms = [np.full(len(y), x[0])]
    for j in range(k):
        terms.append(x[1 + 2 * j] - x[2 + 2 * j] * feats[:, j])
    t = np.stack(terms)                      # [1 + k, n]
    pred = np.logaddexp.reduce(t, axis=0)
    r = pred - y
    g = _huber_grad(r, delta) / delta**2
    w = np.exp(t - pred)                     # softmax weights of each term
    grad = np.empty_like(x)
    grad[0] = np.sum(g * w[0])
    for j in range(k):
        grad[1 + 2 * j] = np.sum(g * w[1 + j])
        grad[2 + 2 * j] = -np.sum(g * w[1 + j] * feats[:, j])
    return float(np.sum(huber(r, delta))) / delta**2, grad


def _minimise(feats: np.ndarray, y: np.ndarray, inits: list[np.ndarray], delta: float) -> tuple[np.ndarray, float]:
    k = feats.shape[1]
    bounds = [BOUNDS_LOG_E] + [BOUNDS_LOG_A, BOUNDS_EXP] * k
    best_x, best_f = None, math.inf
    for x0 in inits:
        x0 = np.clip(x0, [b[0] for b in bounds], [b[1] for b in bounds])
        res = minimize(_objective, x0, args=(feats, y, delta), jac=True, method="L-BFGS-B", bounds=bounds,
                       options={"maxiter": 1000})
        if math.isfinite(res.fun) and res.fun < best_f:
            best_x, best_f = res.x, float(res.fun)
    if best_x is None:
        raise ValueError("no initialisation gave a finite fit")
    return best_x, best_f * delta**2


def _law(x: np.ndarray, f: float) -> PowerLaw:
    if len(x) == 3:
        return PowerLaw(math.exp(x[0]), math.exp(x[1]), float(x[2]), objective=f)
    return PowerLaw(math.exp(x[0]), math.exp(x[1]), float(x[2]), math.exp(x[3]), float(x[4]), objective=f)


def _x(law: PowerLaw) -> np.ndarray:
    x = [math.log(law.E), math.log(law.A), law.alpha]
    if law.B is not None:
        x += [math.log(law.B), law.beta]
    return np.array(x)


def _inits(feats: np.ndarray, y: np.ndarray, delta: float, keep: int = 4) -> list[np.ndarray]:
    """Starting points by variable projection: for each exponent on a grid (each pair for ``L(N, D)``), the
    linear least-squares ``E, A[, B]`` (relative errors), floored at a tiny positive value; the ``keep`` best by
    the Huber objective, plus Hoffmann et al.'s generic start. Replaces their 4,500-point grid of full fits."""
    loss = np.exp(y)
    k = feats.shape[1]
    cands = []
    for exps in itertools.product(INIT_EXPONENTS, repeat=k):
        cols = [np.ones_like(loss)] + [np.exp(-e * feats[:, j]) for j, e in enumerate(exps)]
        m = np.stack(cols, axis=1) / loss[:, None]
        coef, *_ = np.linalg.lstsq(m, np.ones_like(loss), rcond=None)
        coef = np.maximum(coef, 1e-6 * float(np.mean(loss)))
        x = [math.log(coef[0])]
        for j, e in enumerate(exps):
            x += [math.log(coef[1 + j]), float(e)]
        x = np.array(x)
        cands.append((_objective(x, feats, y, delta)[0], x))
    cands.sort(key=lambda c: c[0])
    generic = np.array([0.5] + [5.0, 0.5] * k)
    return [x for _, x in cands[:keep]] + [generic]


def fit_law(n: Sequence[float], loss: Sequence[float], d: Sequence[float] | None = None, *,
            delta: float = HUBER_DELTA, start: PowerLaw | None = None) -> PowerLaw:
    """Fit ``L(N)`` (or ``L(N, D)`` when ``d`` is given) to points; ``start``: warm start instead of the grid."""
    n = np.asarray(n, dtype=float)
    y = np.log(np.asarray(loss, dtype=float))
    feats = np.log(n)[:, None] if d is None else np.stack([np.log(n), np.log(np.asarray(d, dtype=float))], axis=1)
    inits = [_x(start)] if start is not None else _inits(feats, y, delta)
    x, f = _minimise(feats, y, inits, delta)
    return _law(x, f)


@dataclass
class Cell:
    """The runs of one variant at one model size: ``losses[seed] = final loss``."""

    n: float
    losses: dict[int, float]
    d: float | None = None


def _resample(cells: dict[Any, Cell], draws: dict[Any, list[int]]) -> tuple[list[float], list[float], list[float]]:
    """One point per cell: the mean loss over the drawn seeds (cells with none of them are left out)."""
    ns, ds, ys = [], [], []
    for key, cell in cells.items():
        vals = [cell.losses[s] for s in draws.get(key, []) if s in cell.losses]
        if vals:
            ns.append(cell.n)
            ds.append(cell.d if cell.d is not None else 0.0)
            ys.append(sum(vals) / len(vals))
    return ns, ds, ys


def seed_draws(seeds_per_size: dict[Any, list[int]], replicates: int, rng: np.random.Generator
               ) -> list[dict[Any, list[int]]]:
    """Bootstrap draws: per replicate and size, ``len(seeds)`` seeds drawn with replacement."""
    out = []
    for _ in range(replicates):
        out.append({k: [int(s) for s in rng.choice(seeds, size=len(seeds), replace=True)]
                    for k, seeds in seeds_per_size.items()})
    return out


@dataclass
class FitResult:
    """A fit and its bootstrap replicates (None where a replicate had too few sizes)."""

    law: PowerLaw
    replicates: list[PowerLaw | None] = field(default_factory=list)
    n_points: int = 0
    n_sizes: int = 0
    with_d: bool = False
    delta: float = HUBER_DELTA
    loss_min: float = 0.0  # the smallest fitted point (mean loss at a size): the scale for "E is at 0"
    n_min: float = 0.0     # the smallest fitted size: where the N term is largest

    def issues(self) -> list[str]:
        """Why this fit is degenerate, one phrase each (empty when it is not): a parameter at (or within numerical
        tolerance of) its bound, or a bootstrap interval of zero width. Forecasts and crossovers from a degenerate
        fit are a property of the bound, not of the data, and are reported as not resolvable."""
        return fit_issues(self)

    def interval(self, key: str, level: float = LEVEL) -> tuple[float, float] | None:
        vals = [getattr(r, key) for r in self.replicates if r is not None]
        if len(vals) < 10:
            return None
        lo, hi = np.quantile(vals, [(1 - level) / 2, (1 + level) / 2])
        return float(lo), float(hi)


def fit_cells(cells: dict[Any, Cell], draws: list[dict[Any, list[int]]], *, with_d: bool = False) -> FitResult:
    """Fit the per-size mean loss over seeds, then refit each bootstrap draw (warm-started). Needs >= 3 sizes.

    Means, not every seed: with Huber's tiny ``delta`` the objective is an L1 fit, and two seeds per size further
    apart than ``delta`` leave every curve between them equally good (a flat optimum); the mean is one point per
    size, as each (N, D) was one run in Hoffmann et al."""
    ns, ds, ys = _resample(cells, {k: sorted(c.losses) for k, c in cells.items()})
    delta = huber_delta(cells)
    law = fit_law(ns, ys, ds if with_d else None, delta=delta)
    reps: list[PowerLaw | None] = []
    min_cells = 5 if with_d else 3
    for dr in draws:
        rn, rd, ry = _resample(cells, dr)
        if len(rn) < min_cells:
            reps.append(None)
            continue
        reps.append(fit_law(rn, ry, rd if with_d else None, start=law, delta=delta))
    return FitResult(law, reps, sum(len(c.losses) for c in cells.values()), len(ys), with_d, delta, float(min(ys)),
                     float(min(ns)))


def fit_issues(fit: FitResult) -> list[str]:
    """See ``FitResult.issues``. Checked: ``E >= 0`` (E below ``E_REL_TOL`` of the smallest fitted loss: no
    flattening in the data, so the irreducible loss is not identified and the law is a pure power law by the
    bound), the exponents' box ``[0, 3]``, the box of ``log A``/``log B`` and zero-width bootstrap intervals."""
    law, out = fit.law, []
    scale = fit.loss_min if fit.loss_min > 0 else 1.0
    if law.E <= E_REL_TOL * scale:
        out.append(f"E is at the E >= 0 bound (E = {law.E:.2g})")
    elif math.log(law.E) >= BOUNDS_LOG_E[1] - LOG_TOL:
        out.append(f"E is at its upper bound (E = {law.E:.3g})")
    for key in ("alpha", "beta"):
        v = getattr(law, key)
        if v is None:
            continue
        if v <= BOUNDS_EXP[0] + EXP_TOL:
            out.append(f"{key} is at its lower bound 0 (the loss does not fall with "
                       f"{'N' if key == 'alpha' else 'D'} in the fit)")
        elif v >= BOUNDS_EXP[1] - EXP_TOL:
            out.append(f"{key} is at its upper bound {BOUNDS_EXP[1]:g}")
    if fit.n_min > 0 and law.A * fit.n_min ** -law.alpha <= E_REL_TOL * scale:
        out.append("the N term A N^-alpha is negligible at every trained size (a flat law: the loss does not "
                   "fall with N in the fit, so A and alpha are not identified)")
    for key in ("A", "B"):
        v = getattr(law, key)
        if v is not None and not (BOUNDS_LOG_A[0] + LOG_TOL < math.log(v) < BOUNDS_LOG_A[1] - LOG_TOL):
            out.append(f"{key} is at its bound ({key} = {v:.3g})")
    stuck = []
    for key, v in law.params().items():
        iv = fit.interval(key)
        if iv is not None and iv[1] - iv[0] <= ZERO_WIDTH_REL * max(abs(v), 1e-300):
            stuck.append(key)
    if stuck:
        out.append(f"the bootstrap interval of {', '.join(stuck)} has zero width")
    return out


def huber_delta(cells: dict[Any, Cell]) -> float:
    """``max(1e-3, 1.345 * se)``: Huber's classical tuning constant (95% efficiency under Gaussian noise) times the
    standard error of a size's mean log-loss, from the pooled seed-to-seed sd of log-loss; Hoffmann et al.'s
    1e-3 when no cell has two seeds. With Hoffmann's fixed 1e-3 and seed noise of ~1%, every residual is in the
    linear part: the fit is an L1 fit through three of the points, and a bootstrap of it is unreliable."""
    ss, dof, ks = 0.0, 0, []
    for c in cells.values():
        logs = np.log(list(c.losses.values()))
        if len(logs) >= 2:
            ss += float(np.sum((logs - logs.mean()) ** 2))
            dof += len(logs) - 1
            ks.append(len(logs))
    if dof == 0 or ss == 0.0:
        return HUBER_DELTA
    se = math.sqrt(ss / dof) / math.sqrt(float(np.mean(ks)))
    return max(HUBER_DELTA, 1.345 * se)


# ---------------------------------------------------------------------------------------------- crossovers
def crossings(f: Callable[[np.ndarray], np.ndarray], lo: float, hi: float, points: int = 400) -> list[float]:
    """Every ``N`` in ``[lo, hi]`` where ``f`` changes sign (log-spaced scan, then Brent's method)."""
    xs = np.linspace(math.log(lo), math.log(hi), points)
    vals = f(np.exp(xs))
    roots = []
    for i in range(points - 1):
        a, b = vals[i], vals[i + 1]
        if a == 0.0:
            roots.append(float(math.exp(xs[i])))
        elif a * b < 0.0:
            r = brentq(lambda t: float(f(np.exp(np.array([t])))[0]), xs[i], xs[i + 1], xtol=1e-10)
            roots.append(float(math.exp(r)))
    return roots


def difference(a: PowerLaw, b: PowerLaw, d_of_n: Callable[[np.ndarray], np.ndarray] | None = None
               ) -> Callable[[np.ndarray], np.ndarray]:
    """``N -> L_a(N) - L_b(N)`` (``d_of_n`` gives the tokens at ``N`` for laws in ``N`` and ``D``)."""
    def f(n: np.ndarray) -> np.ndarray:
        d = d_of_n(n) if d_of_n is not None else None
        return a(n, d) - b(n, d)
    return f


@dataclass(frozen=True)
class Measured:
    """The measured difference ``a - b`` at one size: mean over seeds, seed SNR and Welch's t-test p-value."""

    params: float
    diff: float
    seed_snr: float | None = None
    p: float | None = None
    size: str = ""
    p_adj: float | None = None    # ``p`` adjusted over the declared family (Holm by default); None: not adjusted
    correction: str = ""          # the adjustment's name, e.g. "holm"

    @property
    def decisive(self) -> bool:
        """Significant at ``SIGNIFICANCE`` by Welch's t-test (needs >= 2 seeds per variant), judged on the
        family-adjusted p-value when one is given (``p_adj``): a sign change significant only before the
        correction is not decisive."""
        q = self.p_adj if self.p_adj is not None else self.p
        return q is not None and q < SIGNIFICANCE

    def text(self) -> str:
        snr = f"seed SNR {self.seed_snr:.1f}" if self.seed_snr is not None else "one seed"
        p = f", p = {self.p:.2g}" if self.p is not None else ""
        if self.p_adj is not None:
            p += f", {self.correction or 'adjusted'} {self.p_adj:.2g}"
        return f"{self.diff:+.3f} at {self.size or _n(self.params)} ({snr}{p})"


def fit_blocks(names: Sequence[str], fits: Sequence[FitResult]) -> list[str]:
    """One phrase per degenerate fit among ``fits``, e.g. ``"Post-LN's fit is degenerate: E is at the E >= 0
    bound (E = 8.7e-09)"``: what makes forecasts and crossovers from them not resolvable."""
    return [f"{name}'s fit is degenerate: {', '.join(fit.issues())}" for name, fit in zip(names, fits)
            if fit.issues()]


def measured_flip(measured: Sequence[Measured]) -> tuple[Measured, Measured] | None:
    """The first pair of sizes (ordered by N) whose differences are both decisive and of opposite sign, taking
    consecutive decisive sizes: the measurements alone then show a crossover between them."""
    dec = [m for m in sorted(measured, key=lambda m: m.params) if m.decisive and m.diff != 0.0]
    for lo, hi in zip(dec, dec[1:]):
        if (lo.diff > 0) != (hi.diff > 0):
            return lo, hi
    return None


@dataclass
class Crossover:
    """Where two fitted curves cross in ``[n_min, horizon]``, with the bootstrap's view of it, checked against the
    fits' degeneracy (``blocked``: a fit at a bound) and the measured differences (``measured``)."""

    roots: list[float]
    fraction: float | None            # share of bootstrap replicates with a crossing in range
    interval: tuple[float, float] | None
    n_min: float
    n_max: float
    horizon: float
    blocked: list[str] = field(default_factory=list)    # e.g. "Post-LN's fit is at the E >= 0 bound"
    measured: list[Measured] | None = None              # None: judge the fits alone

    def _support(self, root: float) -> bool:
        """A decisive measured difference on each side of ``root``, of opposite signs."""
        ms = [m for m in self.measured or [] if m.decisive]
        return any((lo.diff > 0) != (hi.diff > 0) for lo in ms if lo.params < root for hi in ms if hi.params > root)

    @property
    def verdict(self) -> str:
        """``crossover`` / ``forecast crossover`` (fits and bootstrap agree, and the measurements back it),
        ``measured crossover`` (the measured sign flips between two sizes, each decisive; the fits cannot place
        it), ``no crossover`` or ``not resolvable``."""
        flip = measured_flip(self.measured) if self.measured is not None else None
        if self.blocked:
            return "measured crossover" if flip else "not resolvable"
        f = self.fraction
        fits_cross = bool(self.roots) and (f is None or f >= LEVEL)
        fits_none = not self.roots and (f is None or f <= 1 - LEVEL)
        if fits_cross:
            root = self.roots[0]
            if self.measured is None:
                return "crossover" if root <= self.n_max else "forecast crossover"
            if root <= self.n_max:
                return "crossover" if self._support(root) else "measured crossover" if flip else "not resolvable"
            if flip:
                return "measured crossover"
            return "forecast crossover" if any(m.decisive for m in self.measured) else "not resolvable"
        if fits_none:
            return "measured crossover" if flip else "no crossover"
        return "measured crossover" if flip else "not resolvable"

    def text(self) -> str:
        v = self.verdict
        span = f"{_n(self.n_min)}-{_n(self.horizon)}"
        frac = f"{self.fraction:.0%} of bootstrap fits cross" if self.fraction is not None else "no bootstrap"
        iv = f" (95% interval {_n(self.interval[0])}-{_n(self.interval[1])})" if self.interval else ""
        fit_says = f"the fits cross at N = {_n(self.roots[0])}" if self.roots else "the fits do not cross"
        meas = self.measured or []
        if v == "measured crossover":
            lo, hi = measured_flip(meas)  # type: ignore[misc]
            why = ("its place is not resolvable from the fits: " + "; ".join(self.blocked) if self.blocked
                   else f"{fit_says}, {frac}")
            return (f"measured crossover between N = {_n(lo.params)} and {_n(hi.params)}: {lo.text()} vs "
                    f"{hi.text()}; {why}")
        if self.blocked:
            return f"not resolvable: {'; '.join(self.blocked)} ({fit_says})"
        if v == "crossover":
            return f"crossover within the fitted range at N = {_n(self.roots[0])}{iv}; {frac}"
        if v == "forecast crossover":
            return f"crossover forecast beyond the fitted range at N = {_n(self.roots[0])}{iv}; {frac}"
        if v == "no crossover":
            out = f"no crossover within N = {span} (the fitted range and up to 100x beyond); {frac}"
            if self.measured is not None and not any(m.decisive for m in meas):
                out += ("; but the measured difference is significant at no size, so which is better is not "
                        "resolved either")
            return out
        if self.roots and (self.fraction is None or self.fraction >= LEVEL) and self.measured is not None:
            best = max((m for m in meas if m.seed_snr is not None), key=lambda m: m.seed_snr, default=None)
            noise = ("the measured difference is significant at no size" if not any(m.decisive for m in meas)
                     else "no decisive measured difference of each sign brackets it")
            top = f" (largest seed SNR {best.seed_snr:.1f})" if best is not None else ""
            return f"not resolvable: {fit_says}{iv} and {frac}, but {noise}{top}"
        return f"not resolvable: {fit_says} but {frac} in N = {span}"


def _n(x: float) -> str:
    for unit, div in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if x >= div:
            return f"{x / div:.3g}{unit}"
    return f"{x:.3g}"


def crossover(a: FitResult, b: FitResult, n_min: float, n_max: float, horizon: float,
              d_of_n: Callable[[np.ndarray], np.ndarray] | None = None, *, names: tuple[str, str] = ("a", "b"),
              measured: Sequence[Measured] | None = None) -> Crossover:
    """The crossover of the fitted curves of ``a`` and ``b`` (named ``names``) in ``[n_min, horizon]``; with
    ``measured`` (the measured differences per size) the verdict is also checked against the data."""
    blocked = fit_blocks(names, (a, b))
    roots = crossings(difference(a.law, b.law, d_of_n), n_min, horizon)
    firsts, total = [], 0
    for ra, rb in zip(a.replicates, b.replicates):
        if ra is None or rb is None:
            continue
        total += 1
        rr = crossings(difference(ra, rb, d_of_n), n_min, horizon, points=120)
        if rr:
            firsts.append(rr[0])
    frac = len(firsts) / total if total >= 10 else None
    interval = None
    if len(firsts) >= 10:
        lo, hi = np.quantile(np.log(firsts), [(1 - LEVEL) / 2, (1 + LEVEL) / 2])
        interval = (float(math.exp(lo)), float(math.exp(hi)))
    return Crossover(roots, frac, interval, n_min, n_max, horizon, blocked,
                     list(measured) if measured is not None else None)


def forecast(a: FitResult, b: FitResult, n: float, d: float | None = None) -> tuple[float, tuple[float, float] | None]:
    """``L_a(n) - L_b(n)`` from the fits, with the percentile interval over paired bootstrap replicates."""
    point = float(a.law(n, d) - b.law(n, d))
    vals = [
        float(ra(n, d) - rb(n, d)) for ra, rb in zip(a.replicates, b.replicates) if ra is not None and rb is not None
    ]
    if len(vals) < 10:
        return point, None
    lo, hi = np.quantile(vals, [(1 - LEVEL) / 2, (1 + LEVEL) / 2])
    return point, (float(lo), float(hi))


# ---------------------------------------------------------------------------------------------- signal/noise
def heineman_snr(signal_scores: Sequence[float], noise_scores: Sequence[Sequence[float]]) -> float | None:
    """Heineman et al. 2025: ``(max |m_j - m_k| / mean(m)) / mean_r(sd(c_r) / mean(c_r))`` where ``m`` are the
    models' scores and ``c_r`` each run's last checkpoint scores (population sd). None when the noise is 0."""
    m = np.asarray(signal_scores, dtype=float)
    signal = float(np.max(np.abs(m[:, None] - m[None, :])) / np.mean(m))
    rel = [float(np.std(c) / np.mean(c)) for c in (np.asarray(c, dtype=float) for c in noise_scores) if len(c) >= 2]
    if not rel or np.mean(rel) == 0.0:
        return None
    return signal / float(np.mean(rel))


def seed_snr(a: Sequence[float], b: Sequence[float]) -> float | None:
    """``|mean(a) - mean(b)| / sqrt((s_a^2 + s_b^2) / 2)`` (sample sds); None with < 2 seeds or no spread."""
    if len(a) < 2 or len(b) < 2:
        return None
    pooled = math.sqrt((np.var(a, ddof=1) + np.var(b, ddof=1)) / 2.0)
    if pooled == 0.0:
        return None
    return abs(float(np.mean(a)) - float(np.mean(b))) / pooled


def pairs(names: Sequence[str]) -> list[tuple[str, str]]:
    return list(itertools.combinations(names, 2))
