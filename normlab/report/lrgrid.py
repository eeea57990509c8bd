"""Learning-rate sweeps in the report: per variant the best learning rate, the best final loss, the LR sensitivity
and the stable range, each over seeds; paired comparisons with a baseline variant; instability signals.

LR sensitivity (Wortsman et al. 2023, "Small-scale proxies for large-scale Transformer training instabilities",
arXiv:2309.14322, section 2): for one variant and seed, over the learning-rate grid ``G``::

    LR sensitivity = mean_{lr in G} [ min(L(lr), L_init) - L* ],   L* = min_{lr in G} min(L(lr), L_init)

with ``L`` the final validation bits/byte and ``L_init`` the validation bits/byte at initialisation (recorded by
the trainer, ``init_val_bpb``); a run that diverged (or did not finish) scores ``L_init``. The best learning rate is
the grid point reaching ``L*`` (the smallest such lr on a tie). The stable range is the set of learning rates whose
run neither diverged nor ended more than ``STABLE_MARGIN`` bits/byte above ``L*``. Every per-seed number gets a 95%
Student-t interval over seeds (the best learning rate on a log10 scale).

Paired comparisons (normlab.stats): a seed fixes the data order and the validation windows of every variant
(common random numbers), so each variant is compared with the baseline by the per-seed differences (paired t over
seeds), and the capped losses also by the differences over every (seed, lr) cell both ran; only when two variants
share fewer than two seeds does the comparison fall back to Welch's unpaired interval. An interval that contains 0
comes with ``seeds_needed``: how many seeds the observed spread of the differences would need to resolve the
observed difference with 80% power.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from statistics import mean
from typing import Any

from normlab.stats import SEEDS_NEEDED_MAX, Diff, MeanCI, mean_ci, paired_diff, seeds_needed, welch_diff

STABLE_MARGIN = 0.1  # bits/byte above the best loss of the same seed


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def lr_sensitivity(losses: dict[float, float | None], loss_init: float) -> tuple[float, float, float]:
    """``(sensitivity, L*, best lr)`` of one seed's grid ``{lr: final loss or None (diverged)}`` (see the module
    docstring); every loss is capped at ``loss_init`` and a missing one counts as ``loss_init``."""
    if not losses:
        raise ValueError("lr_sensitivity needs at least one grid point")
    capped = {lr: min(v, loss_init) if _finite(v) else loss_init for lr, v in losses.items()}
    best = min(capped.values())
    best_lr = min(lr for lr, v in capped.items() if v == best)
    return mean(v - best for v in capped.values()), best, best_lr


def stable_lrs(losses: dict[float, float | None], best: float, margin: float = STABLE_MARGIN) -> list[float]:
    """Learning rates whose run finished (finite loss) no more than ``margin`` above ``best``."""
    return sorted(lr for lr, v in losses.items() if _finite(v) and v <= best + margin)


@dataclass
class GridRun:
    """One run seen by the grid analysis. ``final``: final validation bits/byte (None unless completed)."""

    group: str
    lr: float
    seed: int
    status: str
    final: float | None
    init: float | None
    run_id: str
    curves: dict[str, list[tuple[int, float]]] = field(default_factory=dict)

    @property
    def diverged(self) -> bool:
        return self.status == "diverged"


@dataclass
class SeedGrid:
    seed: int
    losses: dict[float, float | None]
    init: float
    sensitivity: float
    best: float
    best_lr: float
    stable: list[float]


@dataclass
class GroupGrid:
    """One variant over the grid: per-seed results and their intervals over seeds."""

    name: str
    runs: list[GridRun]
    lrs: list[float]
    seeds: list[SeedGrid]
    sensitivity: MeanCI | None = None
    best: MeanCI | None = None
    log10_best_lr: MeanCI | None = None
    stable_decades: MeanCI | None = None
    rank: int | None = None

    def capped(self, seed: SeedGrid, lr: float) -> float:
        v = seed.losses.get(lr)
        return min(v, seed.init) if _finite(v) else seed.init

    def mean_curve(self) -> dict[float, tuple[float, float, float]]:
        """``{lr: (mean, min, max)}`` of the capped loss over seeds."""
        out = {}
        for lr in self.lrs:
            xs = [self.capped(s, lr) for s in self.seeds if lr in s.losses]
            if xs:
                out[lr] = (mean(xs), min(xs), max(xs))
        return out

    def stable_range(self) -> list[float]:
        """Stable learning rates of the seed-mean curve: no seed diverged and the mean within the margin."""
        curve = self.mean_curve()
        if not curve:
            return []
        best = min(m for m, _, _ in curve.values())
        bad = {r.lr for r in self.runs if r.status != "completed"}
        return sorted(lr for lr, (m, _, _) in curve.items() if lr not in bad and m <= best + STABLE_MARGIN)

    def diverged_at(self) -> dict[float, int]:
        out: dict[float, int] = {}
        for r in self.runs:
            if r.diverged:
                out[r.lr] = out.get(r.lr, 0) + 1
        return dict(sorted(out.items()))


@dataclass
class PairedRow:
    """``variant - baseline`` for one metric."""

    variant: str
    baseline: str
    metric: str
    diff: Diff
    seeds_needed: int | None
    seeds_needed_more_than: int | None = None  # within noise, a difference, but more seeds than the search covers

    @property
    def verdict(self) -> str:
        d = self.diff
        if d.half is None:
            return "not testable (fewer than 2 pairs)"
        if d.resolved:
            return "lower" if d.mean < 0 else "higher"
        return "within noise"


@dataclass
class GridReport:
    groups: list[GroupGrid]
    baseline: str | None
    paired: list[PairedRow]
    lrs: list[float]

    @property
    def is_grid(self) -> bool:
        return any(len(g.lrs) >= 2 for g in self.groups)


def _seed_grid(runs: list[GridRun], fallback_init: float | None) -> SeedGrid | None:
    inits = [r.init for r in runs if _finite(r.init)]
    init = mean(inits) if inits else fallback_init
    if init is None:
        return None
    losses = {r.lr: (r.final if r.status == "completed" and _finite(r.final) else None) for r in runs}
    sens, best, best_lr = lr_sensitivity(losses, init)
    return SeedGrid(runs[0].seed, losses, init, sens, best, best_lr, stable_lrs(losses, best))


def group_grid(name: str, runs: list[GridRun]) -> GroupGrid:
    """Per-seed grids and their intervals for one variant (only finished runs enter: completed or diverged)."""
    done = [r for r in runs if r.status in ("completed", "diverged")]
    lrs = sorted({r.lr for r in runs})
    inits = [r.init for r in done if _finite(r.init)]
    fallback = mean(inits) if inits else None
    seeds = []
    for s in sorted({r.seed for r in done}):
        sg = _seed_grid([r for r in done if r.seed == s], fallback)
        if sg is not None:
            seeds.append(sg)
    g = GroupGrid(name, runs, lrs, seeds)
    if seeds:
        g.sensitivity = mean_ci([s.sensitivity for s in seeds])
        g.best = mean_ci([s.best for s in seeds])
        g.log10_best_lr = mean_ci([math.log10(s.best_lr) for s in seeds])
        g.stable_decades = mean_ci([math.log10(max(s.stable) / min(s.stable)) if s.stable else 0.0 for s in seeds])
    return g


def _compare(g: GroupGrid, b: GroupGrid, metric: str, get) -> PairedRow | None:
    mine, base = {s.seed: get(s) for s in g.seeds}, {s.seed: get(s) for s in b.seeds}
    common = sorted(set(mine) & set(base))
    if len(common) >= 2:
        d = paired_diff([mine[s] for s in common], [base[s] for s in common])
    elif len(mine) >= 2 and len(base) >= 2:
        d = welch_diff(list(mine.values()), list(base.values()))
    elif common:
        d = paired_diff([mine[common[0]]], [base[common[0]]])
    else:
        return None
    need = None if d.resolved or d.half is None else seeds_needed(d.mean, d.sd)
    return PairedRow(g.name, b.name, metric, d, need, _beyond(d, need, SEEDS_NEEDED_MAX))


def _beyond(d: Diff, need: int | None, limit: int) -> int | None:
    """``limit`` when an unresolved nonzero difference with a spread needs more seeds than ``seeds_needed``
    searched (it returned None), else None: "no difference to resolve" is for a difference of exactly 0."""
    if need is not None or d.resolved or d.half is None or d.mean == 0.0 or not d.sd or not math.isfinite(d.sd):
        return None
    return limit


def _compare_cells(g: GroupGrid, b: GroupGrid) -> PairedRow | None:
    """Capped loss over every (seed, lr) cell both variants ran."""
    bs = {s.seed: s for s in b.seeds}
    a, c = [], []
    for s in g.seeds:
        if s.seed not in bs:
            continue
        for lr in sorted(set(s.losses) & set(bs[s.seed].losses)):
            a.append(g.capped(s, lr))
            c.append(b.capped(bs[s.seed], lr))
    if len(a) < 2:
        return None
    d = paired_diff(a, c)
    need = over = None
    if not d.resolved and d.half is not None and d.sd is not None:
        cells_per_seed = max(1, len(a) // max(1, len({s.seed for s in g.seeds} & set(bs))))
        n_cells = seeds_needed(d.mean, d.sd)
        need = None if n_cells is None else max(2, math.ceil(n_cells / cells_per_seed))
        over = _beyond(d, n_cells, math.ceil(SEEDS_NEEDED_MAX / cells_per_seed))
    return PairedRow(g.name, b.name, "loss at each (seed, lr)", d, need, over)


def analyze(runs: list[GridRun], baseline: str | None = None, order: list[str] | None = None) -> GridReport:
    """Group ``runs`` by variant, rank by mean LR sensitivity (best loss on a grid of one lr) and compare each
    variant with ``baseline`` (default: the first variant in ``order``)."""
    order = order or list(dict.fromkeys(r.group for r in runs))
    groups = [group_grid(n, [r for r in runs if r.group == n]) for n in order]
    lrs = sorted({r.lr for r in runs})
    grid = any(len(g.lrs) >= 2 for g in groups)
    key = (lambda g: g.sensitivity.mean) if grid else (lambda g: g.best.mean)
    ranked = sorted((g for g in groups if g.seeds), key=lambda g: (key(g), g.best.mean))
    for i, g in enumerate(ranked):
        g.rank = i + 1
    base_name = baseline if baseline in order else (order[0] if order else None)
    base = next((g for g in groups if g.name == base_name), None)
    paired: list[PairedRow] = []
    if base is not None and base.seeds:
        for g in groups:
            if g is base or not g.seeds:
                continue
            rows = [_compare(g, base, "best loss" if grid else "final loss", lambda s: s.best)]
            if grid:
                rows += [_compare(g, base, "LR sensitivity", lambda s: s.sensitivity), _compare_cells(g, base)]
            paired += [r for r in rows if r is not None]
    return GridReport(groups, base_name, paired, lrs)


def grid_runs_from_rows(rows: list[dict[str, Any]], curves: dict[str, dict], summaries: dict[str, dict | None]
                        ) -> list[GridRun]:
    """GridRuns from results-store rows (``axes.grid_group`` or the variant label; lr from the config)."""
    out = []
    for row in rows:
        rid = row["run_id"]
        c = curves.get(rid, {})
        init = None
        if c.get("init_val_bpb"):
            init = c["init_val_bpb"][0][1]
        elif summaries.get(rid) and _finite(summaries[rid].get("init_val_bpb")):
            init = float(summaries[rid]["init_val_bpb"])
        group = (row.get("axes") or {}).get("grid_group") or row["variant"]
        lr = float(row["config"]["train"]["lr"])
        out.append(GridRun(group, lr, int(row["seed"]), row["status"], row.get("val_bpb"), init, rid, c))
    return out


# -- instability signals -----------------------------------------------------------------------------------------
def signal_series(curves: dict[str, list[tuple[int, float]]]) -> dict[str, list[tuple[int, float]]]:
    """``{"attn_logit_max": [(step, max over blocks)], "output_lse": [(step, value)]}`` from a run's curves."""
    by_step: dict[int, float] = {}
    for k, pts in curves.items():
        if k.startswith("diag/attn_logit_max/"):
            for s, v in pts:
                by_step[s] = max(by_step.get(s, -math.inf), v)
    out = {}
    if by_step:
        out["attn_logit_max"] = sorted(by_step.items())
    for key in ("output_lse", "softmax_collapse", "tev_mean", "head_rms_inf_norm"):
        if curves.get(f"diag/{key}"):
            out[key] = list(curves[f"diag/{key}"])
    return out


SIGNALS = {"attn_logit_max": "largest pre-softmax attention logit (max over blocks)",
           "output_lse": "mean logsumexp of the output logits (log Z)",
           "softmax_collapse": "fraction of positions in Softmax Collapse (fp32 target probability exactly 1)",
           "tev_mean": "Token Embedding Variability (mean over the vocabulary)",
           "head_rms_inf_norm": "output layer's RMS->inf operator norm"}


def signal_at_end(run: GridRun, key: str) -> float | None:
    """The signal at the run's last diagnostic step (for a diverged run: the last one before it diverged)."""
    pts = signal_series(run.curves).get(key)
    return pts[-1][1] if pts else None
