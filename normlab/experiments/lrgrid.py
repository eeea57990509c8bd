"""Learning-rate sweeps in the report: per variant the best learning rate, the best final loss, the LR sensitivity
and the stable range, each over seeds; paired comparisons with a baseline variant; instability signals.

LR sensitivity (Wortsman et al. 2023, "Small-scale proxies for large-scale Transformer training instabilities",
arXiv:2309.14322, section 2): for one variant and seed, over the learning-rate grid ``G``::

    LR sensitivity = mean_{lr in G} [ min(L(lr), L_init) - L* ],   L* = min_{lr in G} min(L(lr), L_init)

with ``L`` the final validation bits/byte and ``L_init`` the validation bits/byte at initialisation (recorded by
the trainer, ``init_val_bpb``); a run that diverged, did not finish or collapsed (did not learn, below) scores
``L_init`` (one score for every failed run: under the earlier definition a collapsed run scored its own loss, near the
unigram level, so a variant that collapsed looked more stable than one that diverged; docs/claims.md lists the
verdicts that changed). The best learning rate is
the grid point reaching ``L*`` (the smallest such lr on a tie). The stable range is the set of learning rates whose
run neither diverged nor ended more than ``STABLE_MARGIN`` bits/byte above ``L*``. Every per-seed number gets a 95%
Student-t interval over seeds (the best learning rate on a log10 scale).

"Did not learn" (docs/compare.md; the one rule, normlab.stats.learning): a run whose final loss is no more than
``DID_NOT_LEARN_MARGIN`` bits/byte below the training split's unigram entropy per byte (normlab.data.unigram; the
loss of the best context-free model) learned only frequencies. A seed whose best learning rate did not learn makes
its variant unrankable (on LR sensitivity: a model that fails uniformly has a small sensitivity); per learning
rate, the collapse rate (did not learn or diverged) gets an exact Clopper-Pearson interval and the loss is reported
over the seeds that did not collapse.

Comparisons with the baseline and the decisions on them: normlab.decide.decisions (per-seed numbers only).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from statistics import mean
from typing import Any

from normlab.decide.decisions import PairedRow, build_rows
from normlab.errors import NormlabError
from normlab.decide.question import Question, default_primary
from normlab.stats.exact import ClopperPearson, clopper_pearson
from normlab.stats.intervals import MeanCI, mean_ci
from normlab.stats.learning import DID_NOT_LEARN_MARGIN, collapsed, did_not_learn

STABLE_MARGIN = 0.1  # bits/byte above the best loss of the same seed

__all__ = ["DID_NOT_LEARN_MARGIN", "STABLE_MARGIN", "GridReport", "GridRun", "GroupGrid", "PairedRow", "SeedGrid",
           "analyze", "grid_runs_from_rows", "lr_sensitivity", "stable_lrs"]


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def lr_sensitivity(losses: dict[float, float | None], loss_init: float, unigram: float | None = None
                   ) -> tuple[float, float, float]:
    """``(sensitivity, best loss, best lr)`` of one seed's grid ``{lr: final loss or None (diverged)}`` (see the
    module docstring). In the sensitivity every loss is capped at ``loss_init``, and a run that diverged, did not
    finish or collapsed (did not learn: at or above ``unigram - DID_NOT_LEARN_MARGIN``, normlab.stats.learning;
    ``unigram`` None: not checked) scores ``loss_init``: one score for every failed run, so a variant that
    collapses cannot look stable. The best loss is the grid's best final loss (capped at ``loss_init``, a diverged
    run at it), whether or not it learned: the guard reads it."""
    if not losses:
        raise ValueError("lr_sensitivity needs at least one grid point")
    scored = {lr: min(v, loss_init) if _finite(v) and not did_not_learn(v, unigram) else loss_init
              for lr, v in losses.items()}
    star = min(scored.values())
    # the best final loss and its learning rate are the runs' own (a collapsed run keeps its loss there: the
    # guard, not the score, says it did not learn)
    capped = {lr: min(v, loss_init) if _finite(v) else loss_init for lr, v in losses.items()}
    best = min(capped.values())
    best_lr = min(lr for lr, v in capped.items() if v == best)
    return mean(v - star for v in scored.values()), best, best_lr


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
    unigram: float | None = None  # the training split's unigram entropy, bits/byte (summary.json unigram_bpb)

    @property
    def diverged(self) -> bool:
        return self.status == "diverged"

    def collapsed(self, floor: float | None) -> bool | None:
        """Diverged, or finished no more than DID_NOT_LEARN_MARGIN below ``floor`` (normlab.stats.learning.collapsed);
        None if unknown."""
        if self.diverged:
            return True
        if floor is None or not _finite(self.final) or self.status != "completed":
            return None
        return collapsed(self.final, floor)


@dataclass
class SeedGrid:
    seed: int
    losses: dict[float, float | None]
    init: float
    sensitivity: float
    best: float
    best_lr: float
    stable: list[float]
    learned: bool | None = None  # its best learning rate ended below the unigram floor - margin (None: no floor)


@dataclass
class CollapseRow:
    """One learning rate of one variant: seeds that collapsed (did not learn or diverged) with the exact interval,
    and the final loss over the seeds that did not."""

    lr: float
    rate: ClopperPearson
    loss_ok: MeanCI | None


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
    floor: float | None = None  # unigram entropy of the training split, bits/byte

    @property
    def learned(self) -> bool | None:
        """False when a seed did not learn at its own best learning rate (no LR-sensitivity rank); None: no floor."""
        flags = [s.learned for s in self.seeds]
        if not flags or any(f is None for f in flags):
            return None
        return all(flags)

    def collapse(self) -> list[CollapseRow]:
        """Per learning rate with a known floor: the collapse rate over finished seeds and the loss given none."""
        out = []
        for lr in self.lrs:
            runs = [r for r in self.runs if r.lr == lr and r.status in ("completed", "diverged")]
            flags = [r.collapsed(self.floor) for r in runs]
            if not runs or any(f is None for f in flags):
                continue
            ok = [r.final for r, f in zip(runs, flags) if not f]
            out.append(CollapseRow(lr, clopper_pearson(sum(flags), len(runs)), mean_ci(ok) if ok else None))
        return out

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

    def best_grid_lr(self) -> float | None:
        """The grid learning rate with the lowest seed-mean (capped) final loss, smallest on a tie; None without a
        finished seed. Always a grid point, unlike the geometric mean of the seeds' best learning rates (which
        can fall between points, and whose interval factor over two seeds a decade apart is meaningless)."""
        curve = self.mean_curve()
        if not curve or not self.seeds:
            return None
        low = min(m for m, _, _ in curve.values())
        return min(lr for lr, (m, _, _) in curve.items() if m == low)

    def seed_best_lrs(self) -> list[float]:
        """Each seed's own best grid learning rate, sorted (the spread shown beside :meth:`best_grid_lr`)."""
        return sorted(s.best_lr for s in self.seeds)

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
class GridReport:
    groups: list[GroupGrid]
    baseline: str | None
    paired: list[PairedRow]
    lrs: list[float]
    question: dict[str, Any] = field(default_factory=dict)  # the declared (or default) question
    exploratory: str | None = None  # why no comparison is decided (design changed after results), else None

    @property
    def is_grid(self) -> bool:
        return any(len(g.lrs) >= 2 for g in self.groups)


def _seed_grid(runs: list[GridRun], fallback_init: float | None, floor: float | None) -> SeedGrid | None:
    inits = [r.init for r in runs if _finite(r.init)]
    init = mean(inits) if inits else fallback_init
    if init is None:
        return None
    losses = {r.lr: (r.final if r.status == "completed" and _finite(r.final) else None) for r in runs}
    sens, best, best_lr = lr_sensitivity(losses, init, floor)
    dnl = did_not_learn(best, floor)
    learned = None if dnl is None else not dnl
    return SeedGrid(runs[0].seed, losses, init, sens, best, best_lr, stable_lrs(losses, best), learned)


def group_grid(name: str, runs: list[GridRun]) -> GroupGrid:
    """Per-seed grids and their intervals for one variant (only finished runs enter: completed or diverged)."""
    done = [r for r in runs if r.status in ("completed", "diverged")]
    lrs = sorted({r.lr for r in runs})
    inits = [r.init for r in done if _finite(r.init)]
    fallback = mean(inits) if inits else None
    floors = [r.unigram for r in runs if _finite(r.unigram)]
    floor = mean(floors) if floors else None
    seeds = []
    for s in sorted({r.seed for r in done}):
        sg = _seed_grid([r for r in done if r.seed == s], fallback, floor)
        if sg is not None:
            seeds.append(sg)
    g = GroupGrid(name, runs, lrs, seeds, floor=floor)
    if seeds:
        g.sensitivity = mean_ci([s.sensitivity for s in seeds])
        g.best = mean_ci([s.best for s in seeds])
        g.log10_best_lr = mean_ci([math.log10(s.best_lr) for s in seeds])
        g.stable_decades = mean_ci([math.log10(max(s.stable) / min(s.stable)) if s.stable else 0.0 for s in seeds])
    return g


def analyze(runs: list[GridRun], baseline: str | None = None, order: list[str] | None = None, *,
            question: dict[str, Any] | None = None, exploratory: str | None = None) -> GridReport:
    """Group ``runs`` by variant, rank by mean LR sensitivity (best loss on a grid of one lr; a variant that did not
    learn at its best learning rate in some seed gets no rank) and compare each variant with the baseline
    (``question["baseline"]``, else ``baseline``, else the first variant in ``order``): normlab.decide.decisions.
    ``question``: the sweep's declared question (normlab.experiments.design; default: undeclared, exploratory);
    ``exploratory``: a reason to decide nothing (the design changed after results)."""
    order = order or list(dict.fromkeys(r.group for r in runs))
    groups = [group_grid(n, [r for r in runs if r.group == n]) for n in order]
    lrs = sorted({r.lr for r in runs})
    grid = any(len(g.lrs) >= 2 for g in groups)
    key = (lambda g: g.sensitivity.mean) if grid else (lambda g: g.best.mean)
    ranked = sorted((g for g in groups if g.seeds and g.learned is not False),
                    key=lambda g: (key(g), g.best.mean))
    for i, g in enumerate(ranked):
        g.rank = i + 1
    if question is not None and question.get("baseline") in order:
        baseline = question["baseline"]
    base_name = baseline if baseline in order else (order[0] if order else None)
    q = dict(question) if question is not None else Question(default_primary(grid), base_name, declared=False).as_dict()
    q["baseline"] = base_name
    base = next((g for g in groups if g.name == base_name), None)
    paired: list[PairedRow] = []
    if base is not None and base.seeds:
        paired = build_rows(groups, base, q, grid=grid, exploratory=exploratory)
    return GridReport(groups, base_name, paired, lrs, q, exploratory)


def grid_runs_from_rows(rows: list[dict[str, Any]], curves: dict[str, dict], summaries: dict[str, dict | None]
                        ) -> list[GridRun]:
    """GridRuns from results-store rows (``axes.grid_group`` or the variant label; lr from the config)."""
    out = []
    for row in rows:
        rid = row["run_id"]
        c = curves.get(rid, {})
        init = None
        if c.get("init_val_bpb") and _finite(c["init_val_bpb"][0][1]):
            init = c["init_val_bpb"][0][1]
        elif summaries.get(rid) and _finite(summaries[rid].get("init_val_bpb")):
            init = float(summaries[rid]["init_val_bpb"])
        group = (row.get("axes") or {}).get("grid_group") or row["variant"]
        lr = (row["config"].get("train") or {}).get("lr")
        if not isinstance(lr, (int, float)) or isinstance(lr, bool):
            raise NormlabError(f"run {rid!r}: its stored config has no numeric train.lr (every stored config is a "
                               "full, resolved config); the results store is damaged")
        lr = float(lr)
        sm = summaries.get(rid) or {}
        uni = float(sm["unigram_bpb"]) if _finite(sm.get("unigram_bpb")) else None
        out.append(GridRun(group, lr, int(row["seed"]), row["status"], row.get("val_bpb"), init, rid, c, uni))
    return out


# -- instability signals -----------------------------------------------------------------------------------------
def signal_series(curves: dict[str, list[tuple[int, float]]]) -> dict[str, list[tuple[int, float]]]:
    """``{"attn_logit_max": [(step, max over blocks)], "output_lse": [(step, value)]}`` from a run's curves; a value
    the store holds as null (a NaN or missing number logged) is left out."""
    by_step: dict[int, float] = {}
    for k, pts in curves.items():
        if k.startswith("diag/attn_logit_max/"):
            for s, v in pts:
                if _finite(v):
                    by_step[s] = max(by_step.get(s, -math.inf), v)
    out = {}
    if by_step:
        out["attn_logit_max"] = sorted(by_step.items())
    for key in ("output_lse", "softmax_collapse", "tev_mean", "head_rms_inf_norm", "hc_gain_fwd", "hc_gain_bwd"):
        pts = [(s, v) for s, v in curves.get(f"diag/{key}") or [] if _finite(v)]
        if pts:
            out[key] = pts
    return out


SIGNALS = {"attn_logit_max": "largest pre-softmax attention logit (max over blocks)",
           "output_lse": "mean logsumexp of the output logits (log Z)",
           "softmax_collapse": "fraction of positions in Softmax Collapse (fp32 softmax exactly one-hot)",
           "tev_mean": "Token Embedding Variability (mean over the vocabulary)",
           "head_rms_inf_norm": "output layer's RMS->inf operator norm",
           "hc_gain_fwd": "composite residual gain over depth, max row sum of |prod H_res| (streams only)",
           "hc_gain_bwd": "composite residual gain over depth, max column sum of |prod H_res| (streams only)"}


def signal_at_end(run: GridRun, key: str) -> float | None:
    """The signal at the run's last diagnostic step (for a diverged run: the last one before it diverged)."""
    pts = signal_series(run.curves).get(key)
    return pts[-1][1] if pts else None
