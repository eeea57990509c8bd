"""Does the answer hold at scale? Scaling-law fits per variant, forecasts, crossovers and signal-to-noise for a sweep
over model sizes (docs/scaling.md), from saved artifacts only: the results store, its curves and ``sweep.yaml``.

Per variant (a sweep's named variant plus any axes other than size and learning rate) the mean final validation
bits/byte over the completed seeds at every size is fitted with ``L(N) = E + A N^-alpha`` (``N``: non-embedding
parameters), and with ``L(N, D) = E + A N^-alpha + B D^-beta`` per named variant when the sweep trains one size
on several token budgets (with ``tokens_per_param`` alone ``D`` is proportional to ``N`` and the two cannot be
told apart, so that fit is not made). Where a variant has several learning rates at one size (an ``lr_grid`` or
a ``train.lr`` axis), the one with the lowest mean final loss is kept (best-of-grid). Diverged and unfinished runs
are left out of the fits and counted. Numbers: ``normlab.report.scaling_fit``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from statistics import mean
from typing import Any

import numpy as np

from normlab.experiments.sizes import count_params, lr_rule, run_tokens
from normlab.experiments.sweepspec import SweepSpec, stored_sweep
from normlab.report import scaling_fit as sf
from normlab.report.analysis import RunInfo, SweepReport
from normlab.report.scaling_design import confound_text, confounds
from normlab.stats.intervals import welch
from normlab.stats.multiplicity import adjust

REPLICATES = 400
NOISE_LAST_N = 5
FACTORS = (10, 100)
_SIZE_AXES = ("size", "variant", "grid_group", "model.width", "model.depth", "model.heads")


@dataclass
class Point:
    """One variant at one size: the chosen learning rate's completed seeds."""

    size: str
    width: int
    depth: int
    params: int
    tokens: int
    lr: float
    losses: dict[int, float]
    last: dict[int, list[float]]
    diverged: int = 0
    unfinished: int = 0
    lrs_tried: int = 1
    head_norm: float | None = None  # mean over the ok seeds of the output layer's RMS->inf norm (Filatov et al. 2025)

    @property
    def mean(self) -> float | None:
        return mean(self.losses.values()) if self.losses else None


@dataclass
class Curve:
    name: str
    base: str
    points: list[Point]
    fit: sf.FitResult | None = None
    fit_error: str | None = None

    def cells(self) -> dict[Any, sf.Cell]:
        return {(p.size, p.tokens): sf.Cell(float(p.params), dict(p.losses), float(p.tokens))
                for p in self.points if p.losses}


@dataclass
class ScalingAnalysis:
    sweep_dir: Path
    lr_rule: str
    tokens_rule: str
    curves: list[Curve]
    comparisons: list[dict[str, Any]] = field(default_factory=list)
    nd_fits: list[dict[str, Any]] = field(default_factory=list)
    size_snr: list[dict[str, Any]] = field(default_factory=list)
    summary: list[str] = field(default_factory=list)
    n_min: float = 0.0
    n_max: float = 0.0
    correction: str = "holm"   # the family's multiplicity adjustment (the sweep's ``correction:``, Holm by default)
    confounds: list[dict[str, Any]] = field(default_factory=list)   # normlab.report.scaling_design.confounds


def is_size_sweep(rep: SweepReport) -> bool:
    """True when the runs span at least 3 model sizes (by width, depth) within one variant."""
    sizes: dict[str, set] = {}
    for r in rep.runs:
        m = r.row["config"]["model"]
        sizes.setdefault(_curve_name(r.row["axes"]), set()).add((m["width"], m["depth"]))
    return any(len(s) >= 3 for s in sizes.values())


def _curve_name(axes: dict[str, Any]) -> str:
    extra = [f"{k.split('.')[-1]}={v}" for k, v in axes.items() if k not in _SIZE_AXES and not k.endswith("lr")]
    return " · ".join([p for p in (axes.get("variant", ""),) if p] + extra) or "base"


def _last_values(info: RunInfo, n: int) -> list[float]:
    pts = [v for _, v in sorted(info.curves.get("val_bpb", [])) if isinstance(v, (int, float)) and math.isfinite(v)]
    return pts[-n:]


def _collect(rep: SweepReport) -> list[Curve]:
    n_cache: dict[str, int] = {}

    def params(config: dict[str, Any]) -> int:
        key = json.dumps(config["model"], sort_keys=True)
        if key not in n_cache:
            n_cache[key] = count_params(config)
        return n_cache[key]

    groups: dict[tuple[str, str, int], list[RunInfo]] = {}
    order: list[str] = []
    for r in rep.runs:
        cfg = r.row["config"]
        name = _curve_name(r.row["axes"])
        if name not in order:
            order.append(name)
        size = r.row["axes"].get("size") or f"w{cfg['model']['width']}-d{cfg['model']['depth']}"
        groups.setdefault((name, size, run_tokens(cfg)), []).append(r)
    curves = []
    for name in order:
        pts = []
        for (cname, size, tokens), runs in groups.items():
            if cname != name:
                continue
            by_lr: dict[float, list[RunInfo]] = {}
            for r in runs:
                by_lr.setdefault(float(r.row["config"]["train"]["lr"]), []).append(r)

            def score(item: tuple[float, list[RunInfo]]) -> tuple[int, float]:
                done = [r.row["val_bpb"] for r in item[1] if _ok(r)]
                return (0, mean(done)) if done else (1, 0.0)

            lr, chosen = min(by_lr.items(), key=score)
            cfg = chosen[0].row["config"]
            ok = [r for r in chosen if _ok(r)]
            pts.append(Point(
                size=size, width=cfg["model"]["width"], depth=cfg["model"]["depth"], params=params(cfg),
                tokens=tokens, lr=lr, losses={r.row["seed"]: float(r.row["val_bpb"]) for r in ok},
                last={r.row["seed"]: _last_values(r, NOISE_LAST_N) for r in ok},
                diverged=sum(r.row["status"] == "diverged" for r in chosen),
                unfinished=sum(r.row["status"] not in ("completed", "diverged") for r in chosen),
                lrs_tried=len(by_lr), head_norm=_head_norm(ok)))
        pts.sort(key=lambda p: (p.params, p.tokens))
        base = next((r.row["axes"].get("variant", "") for r in rep.runs if _curve_name(r.row["axes"]) == name), "")
        curves.append(Curve(name, base or name, pts))
    return curves


def _head_norm(runs: list[RunInfo]) -> float | None:
    """Mean final ``weight_norms.head_rms_inf_norm`` (summary.json) of ``runs``: the output layer's operator norm
    that "Optimal Scaling Needs Optimal Norm" (Filatov et al. 2025) finds constant at the optimum across sizes."""
    vals = [r.summary["weight_norms"].get("head_rms_inf_norm") for r in runs
            if r.summary and isinstance(r.summary.get("weight_norms"), dict)]
    vals = [float(v) for v in vals if isinstance(v, (int, float)) and math.isfinite(v)]
    return mean(vals) if vals else None


def _ok(r: RunInfo) -> bool:
    v = r.row["val_bpb"]
    return r.row["status"] == "completed" and isinstance(v, (int, float)) and math.isfinite(v) and v > 0


def _fit_error(curve: Curve, with_d: bool) -> str | None:
    cells = curve.cells()
    n_sizes = len({c.n for c in cells.values()})
    if n_sizes < 3:
        return f"needs completed runs at >= 3 sizes, has {n_sizes}"
    if with_d and len(cells) < 5:
        return f"needs >= 5 (size, tokens) points, has {len(cells)}"
    return None


def analyse(rep: SweepReport, *, replicates: int = REPLICATES, seed: int = 0) -> ScalingAnalysis:
    """Fits, forecasts, crossovers and SNR for a size sweep (see the module docstring)."""
    curves = _collect(rep)
    spec = stored_sweep(rep.sweep_dir) or SweepSpec()
    lrs = max((p.lrs_tried for c in curves for p in c.points), default=1)
    tpp = spec.tokens_per_param
    tokens = sorted({p.tokens for c in curves for p in c.points})
    tokens_rule = (f"proportional to parameters: {tpp:g} tokens per parameter" if tpp
                   else f"fixed: {tokens[0]:,} tokens per run" if len(tokens) == 1
                   else f"varies: {len(tokens)} token budgets from {tokens[0]:,} to {tokens[-1]:,}")
    an = ScalingAnalysis(rep.sweep_dir, lr_rule(spec.lr_transfer, lrs), tokens_rule, curves)
    corr = spec.correction
    an.correction = corr if isinstance(corr, str) and corr in ("holm", "bh", "none") else "holm"
    an.confounds = confounds([p for c in curves for p in c.points if p.losses], lr_rule=an.lr_rule)
    all_n = [p.params for c in curves for p in c.points if p.losses]
    if not all_n:
        an.summary.append("No completed run yet: nothing to fit.")
        return an
    an.n_min, an.n_max = float(min(all_n)), float(max(all_n))

    keys: dict[Any, set[int]] = {}
    for c in curves:
        for k, cell in c.cells().items():
            keys.setdefault(k, set()).update(cell.losses)
    draws = sf.seed_draws({k: sorted(v) for k, v in keys.items()}, replicates, np.random.default_rng(seed))
    with _one_thread():
        for c in curves:
            cells = c.cells()
            budgets: dict[float, set[float | None]] = {}
            for cell in cells.values():
                budgets.setdefault(cell.n, set()).add(cell.d)
            # one size on several token budgets: L(N) would mix them (L(N, D) is fitted below). One budget per size
            # (fixed tokens, or tokens_per_param: D = r N) is a curve L(N) along that rule, fitted as such.
            if any(len(ds) > 1 for ds in budgets.values()):
                c.fit_error = "one size trained on several token budgets; see the L(N, D) fit"
                continue
            c.fit_error = _fit_error(c, False)
            if c.fit_error is None:
                c.fit = sf.fit_cells(cells, draws)
        an.nd_fits = _nd_fits(curves, draws)
    _compare(an)
    an.summary = _summary(an)
    return an


class _one_thread:
    """Single-threaded BLAS for the many tiny fits (threadpoolctl): on a busy machine, BLAS threads spinning on
    3x3 problems made each fit 20x slower."""

    def __enter__(self) -> "_one_thread":
        try:
            from threadpoolctl import threadpool_limits

            self._ctl = threadpool_limits(1)
        except ImportError:
            self._ctl = None
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._ctl is not None:
            self._ctl.restore_original_limits()


def _nd_fits(curves: list[Curve], draws: list[dict[Any, list[int]]]) -> list[dict[str, Any]]:
    """``L(N, D)`` per named variant, pooling its curves, when sizes and token budgets vary independently."""
    out = []
    for base in dict.fromkeys(c.base for c in curves):
        cells: dict[Any, sf.Cell] = {}
        for c in curves:
            if c.base == base:
                cells.update(c.cells())
        ns = np.log([cell.n for cell in cells.values()])
        ds = np.log([cell.d for cell in cells.values()])
        entry: dict[str, Any] = {"variant": base}
        if len(set(ds)) < 2:
            continue  # one token budget: L(N) says it all
        if len(set(ns)) < 2 or len(cells) < 5 or abs(np.corrcoef(ns, ds)[0, 1]) > 0.999:
            entry["error"] = ("not identifiable: tokens are proportional to parameters (tokens_per_param), so N and "
                              "D vary together; train some sizes on several token budgets to fit L(N, D)")
        else:
            fit = sf.fit_cells(cells, draws, with_d=True)
            entry.update(_fit_json(fit))
        out.append(entry)
    return out


def _fit_json(fit: sf.FitResult) -> dict[str, Any]:
    return {"params": fit.law.params(), "degenerate": bool(fit.issues()), "issues": fit.issues(),
            "ci95": {k: fit.interval(k) for k in fit.law.params()},
            "objective": fit.law.objective, "huber_delta": fit.delta, "n_points": fit.n_points, "n_sizes": fit.n_sizes,
            "replicates": sum(r is not None for r in fit.replicates)}


def _compare(an: ScalingAnalysis) -> None:
    """Every pair's per-size tests, adjusted together over the sweep's family (all pairs x sizes) with the sweep's
    correction (Holm by default): a size is decisive for a pair only when its adjusted p is below
    ``sf.SIGNIFICANCE``, so a crossover significant only before the correction is not stated."""
    fitted = [c for c in an.curves if c.fit is not None]
    pairs = []
    for a, b in sf.pairs([c.name for c in an.curves]):
        ca = next(c for c in an.curves if c.name == a)
        cb = next(c for c in an.curves if c.name == b)
        pairs.append((a, b, ca, cb, _observed(ca, cb)))
    family = [o for *_, obs in pairs for o in obs]
    for o, q in zip(family, adjust([o["welch_p"] for o in family], an.correction)):
        o["p_adj"] = q
        o["decisive"] = q is not None and q < sf.SIGNIFICANCE
    for a, b, ca, cb, observed in pairs:
        # every member counts, an untestable one as p = 1 (normlab.stats.multiplicity): the family never shrinks
        entry: dict[str, Any] = {"a": a, "b": b, "correction": an.correction, "family_size": len(family),
                                 "observed": observed}
        if ca in fitted and cb in fitted:
            lo = max(min(p.params for p in c.points if p.losses) for c in (ca, cb))
            hi = an.n_max
            blocked = sf.fit_blocks((a, b), (ca.fit, cb.fit))
            entry["forecast"] = []
            for f in FACTORS:
                d, iv = sf.forecast(ca.fit, cb.fit, f * hi)
                entry["forecast"].append({"factor": f, "params": f * hi, "diff": d, "ci95": iv,
                                          "resolvable": not blocked,
                                          "reason": "; ".join(blocked) if blocked else None})
            measured = [sf.Measured(float(o["params"]), o["diff"], o["seed_snr"], o["welch_p"], o["size"],
                                    o["p_adj"], an.correction) for o in entry["observed"]]
            co = sf.crossover(ca.fit, cb.fit, float(lo), hi, FACTORS[-1] * hi, names=(a, b), measured=measured)
            flip = sf.measured_flip(measured)
            entry["crossover"] = {"verdict": co.verdict, "text": co.text(), "roots": co.roots,
                                  "bootstrap_fraction": co.fraction, "ci95": co.interval,
                                  "range": [co.n_min, co.n_max], "horizon": co.horizon,
                                  "fit_issues": co.blocked,
                                  "measured_flip": [flip[0].size, flip[1].size] if flip else None,
                                  "decisive_sizes": [m.size for m in measured if m.decisive]}
            if an.confounds and co.verdict != "not resolvable":
                entry["crossover"]["text"] += f" — {confound_text(an.confounds)}"
            entry["confounds"] = [c["kind"] for c in an.confounds]
        an.comparisons.append(entry)
    sizes = sorted({p.size for c in an.curves for p in c.points})
    for size in sizes:
        pts = [(c.name, p) for c in an.curves for p in c.points if p.size == size and p.losses]
        if len(pts) < 2:
            continue
        snr = sf.heineman_snr([p.mean for _, p in pts], [v for _, p in pts for v in p.last.values()])
        an.size_snr.append({"size": size, "params": max(p.params for _, p in pts), "variants": len(pts),
                            "step_snr": snr})
    an.size_snr.sort(key=lambda r: r["params"])


def _observed(a: Curve, b: Curve) -> list[dict[str, Any]]:
    """Measured difference ``a - b`` per common size, with its seed SNR and step-to-step SNR."""
    out = []
    pb = {(p.size, p.tokens): p for p in b.points}
    for p in a.points:
        q = pb.get((p.size, p.tokens))
        if q is None or not p.losses or not q.losses:
            continue
        w = welch(list(p.losses.values()), list(q.losses.values()))
        pv = None if w is None else w.p
        out.append({"size": p.size, "params": p.params, "tokens": p.tokens, "diff": p.mean - q.mean,
                    "seeds": [len(p.losses), len(q.losses)],
                    "seed_snr": sf.seed_snr(list(p.losses.values()), list(q.losses.values())),
                    "step_snr": sf.heineman_snr([p.mean, q.mean], [*p.last.values(), *q.last.values()]),
                    "welch_p": pv, "p_adj": None, "decisive": False})  # p_adj, decisive: set over the family
    return out


def _fmt_ci(iv: tuple[float, float] | None, digits: int = 3) -> str:
    return f"[{iv[0]:+.{digits}f}, {iv[1]:+.{digits}f}]" if iv else "(too few bootstrap fits)"


def _snr_word(x: float | None) -> str:
    if x is None:
        return "n/a"
    return f"{x:.1f}" + (" (noise-dominated)" if x < 1 else "")


def _summary(an: ScalingAnalysis) -> list[str]:
    out = []
    sizes = sorted({p.size for c in an.curves for p in c.points if p.losses})
    out.append(f"{len(an.curves)} variants at {len(sizes)} sizes, N = {sf._n(an.n_min)} to {sf._n(an.n_max)} "
               f"non-embedding parameters; learning rate {an.lr_rule}; tokens {an.tokens_rule}.")
    for c in an.curves:
        if c.fit is None:
            out.append(f"{c.name}: no L(N) fit ({c.fit_error}).")
            continue
        p = c.fit.law
        ia = c.fit.interval("alpha")
        ie = c.fit.interval("E")
        line = (f"{c.name}: L(N) = {p.E:.3f} + {p.A:.3g} N^-{p.alpha:.3f} bits/byte (alpha 95% interval "
                f"{f'{ia[0]:.3f}-{ia[1]:.3f}' if ia else 'n/a'}, E {f'{ie[0]:.3f}-{ie[1]:.3f}' if ie else 'n/a'})")
        issues = c.fit.issues()
        if issues:
            line += (f" — DEGENERATE FIT: {'; '.join(issues)}. The data do not pin this law down (for E at 0: "
                     "the loss shows no flattening over the trained sizes, so the irreducible loss is not "
                     "identified); forecasts and crossovers from it are not resolvable")
        out.append(line + ".")
    for cmp in an.comparisons:
        obs = cmp["observed"]
        if not obs:
            continue
        last = obs[-1]
        better = cmp["a"] if last["diff"] < 0 else cmp["b"]
        line = (f"{cmp['a']} vs {cmp['b']} at the largest size ({sf._n(last['params'])}): {better} lower by "
                f"{abs(last['diff']):.4f} bits/byte, seed SNR {_snr_word(last['seed_snr'])}, step SNR "
                f"{_snr_word(last['step_snr'])}")
        if "forecast" in cmp:
            f100 = cmp["forecast"][-1]
            if f100["resolvable"]:
                line += (f"; forecast {cmp['a']} − {cmp['b']} at 100x ({sf._n(f100['params'])}): "
                         f"{f100['diff']:+.3f} {_fmt_ci(f100['ci95'])}"
                         + (f" ({confound_text(an.confounds)})" if an.confounds else ""))
            else:
                line += f"; forecast at 100x not resolvable ({f100['reason']})"
            line += f"; crossover: {cmp['crossover']['text']}"
        out.append(line + ".")
    if an.confounds:
        out.append("Design confounds (named next to every crossover and forecast): "
                   + "; ".join(c["text"] for c in an.confounds) + ".")
    else:
        out.append("Design confounds: none visible (depth fixed or not varying with width, learning rate chosen "
                   "per size, tokens per parameter constant and at least 20).")
    fam = sum(o["welch_p"] is not None for c in an.comparisons for o in c["observed"])
    word = {"holm": "Holm", "bh": "Benjamini-Hochberg", "none": "no"}[an.correction]
    out.append(f"A measured difference is decisive at a size when Welch's t-test over the seeds, adjusted with "
               f"{word} correction over the sweep's family of {fam} per-size tests (every pair of variants at "
               f"every size), gives p < {sf.SIGNIFICANCE:g}; a crossover is stated only when decisive differences "
               "of opposite sign bracket it (else: not resolvable), and forecasts and crossovers from a degenerate "
               "fit (a parameter at its bound) are not resolvable.")
    out.append("Intervals are 95% percentile bootstraps over seeds; with 2 seeds per size they are coarse, and "
               "forecasts 100x beyond the largest trained size extrapolate far outside the data.")
    return out


def to_json(an: ScalingAnalysis) -> dict[str, Any]:
    curves = []
    for c in an.curves:
        curves.append({
            "variant": c.name,
            "points": [{"size": p.size, "width": p.width, "depth": p.depth, "params": p.params, "tokens": p.tokens,
                        "lr": p.lr, "lrs_tried": p.lrs_tried, "losses": {str(s): v for s, v in p.losses.items()},
                        "mean": p.mean, "diverged": p.diverged, "unfinished": p.unfinished,
                        "head_rms_inf_norm": p.head_norm} for p in c.points],
            "fit": _fit_json(c.fit) if c.fit else None, "fit_error": c.fit_error,
            "fit_issues": c.fit.issues() if c.fit else None})
    return _clean({
        "sweep_dir": str(an.sweep_dir), "params": "non-embedding", "metric": "final validation bits/byte",
        "lr_rule": an.lr_rule, "tokens_rule": an.tokens_rule, "correction": an.correction,
        "significance": sf.SIGNIFICANCE, "confounds": an.confounds,
        "fit": "Huber on log loss (delta: max(1e-3, 1.345 standard errors)), L-BFGS",
        "bootstrap_replicates": REPLICATES, "level": sf.LEVEL, "noise_last_n": NOISE_LAST_N,
        "range": [an.n_min, an.n_max], "variants": curves, "nd_fits": an.nd_fits, "comparisons": an.comparisons,
        "size_snr": an.size_snr, "summary": an.summary})


def _clean(x: Any) -> Any:
    """JSON-safe: tuples to lists, non-finite floats to None."""
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if isinstance(x, (float, np.floating)):
        return float(x) if math.isfinite(x) else None
    if isinstance(x, np.integer):
        return int(x)
    return x
