"""Measurements of the learning-rate sweep claims (Wortsman et al. 2023, "Small-scale proxies for large-scale
Transformer training instabilities", arXiv:2309.14322), measured the paper's way: every variant trained at each
learning rate of the budget's grid (``Budget.grid_lrs``), one number per seed from the whole grid.

- LR sensitivity (normlab.experiments.lrgrid): ``mean_lr [min(L(lr), L_init) - L*]`` in bits/byte, ``L`` the final
  validation bits/byte, ``L_init`` the validation bits/byte at initialisation (``init_val_bpb`` in summary.json),
  a diverged run scoring ``L_init``.
- Output logit divergence: ``|mean logsumexp(logits)|`` (``diag/output_lse``) at the last diagnostic step of the run
  at the grid's highest learning rate (normlab.diagnostics.instability).

A measurement gets, for each grid variant, one seed's runs as a mapping learning rate -> run directory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from normlab.experiments.claims.measure_registry import register_measure
from normlab.experiments.lrgrid import lr_sensitivity
from normlab.rundir.files import METRICS_FILE
from normlab.rundir.readers import open_config, read_metrics
from normlab.stats.learning import collapsed

def unigram_bpb(ctx: Any, cfg: Any) -> float:
    """Bits per byte of the unigram model of the training split (its token frequencies): the loss of a model that
    learned nothing beyond them, the level a collapsed run ends at."""

    data = ctx.data(cfg)
    ids = np.asarray(data.train)
    counts = np.bincount(ids, minlength=data.vocab_size).astype(np.float64)
    p = counts[counts > 0] / counts.sum()
    bits = float(-(counts[counts > 0] * np.log2(p)).sum())
    return bits / float(np.asarray(data.token_bytes)[ids].sum())


def seed_grid(ctx: Any, grid: dict[float, Path]) -> tuple[float, float, float, dict]:
    """``(LR sensitivity, best loss L*, best lr, details)`` of one variant and seed over ``ctx.budget.grid_lrs``."""

    losses, inits, status = {}, [], {}
    for lr in ctx.budget.grid_lrs:
        s = ctx.summary(grid[lr])
        status[f"{lr:g}"] = s.get("status")
        v = s.get("val_bpb")
        losses[lr] = float(v) if s.get("status") == "completed" and isinstance(v, (int, float)) else None
        if isinstance(s.get("init_val_bpb"), (int, float)):
            inits.append(float(s["init_val_bpb"]))
    init = sum(inits) / len(inits)
    level = unigram_bpb(ctx, open_config(grid[ctx.budget.grid_lrs[0]]))
    sens, best, best_lr = lr_sensitivity(losses, init, level)
    return sens, best, best_lr, {"final_bpb": {f"{k:g}": v for k, v in losses.items()}, "init_bpb": init,
                                 "status": status}


def sens_from_details(detail: dict, a: str, b: str) -> tuple[float | None, str | None]:
    """``sensitivity(a) - sensitivity(b)`` recomputed from one seed's stored details under the current definition
    (:func:`normlab.experiments.lrgrid.lr_sensitivity`: a collapsed run scores ``L_init``), and a note where an
    initial loss had to be inferred: the details store ``init_bpb`` (variant ``a``'s) and, in results measured
    since the rule, ``init_bpb_<v>`` per variant; ``b``'s is recovered from its stored sensitivity where it has a
    diverged run, else ``a``'s is used (both are the loss of an untrained model on the same windows). (None, why)
    when the per-learning-rate losses are not stored."""
    out, notes = [], []
    for v in (a, b):
        cells = {k.split("@", 1)[1]: x for k, x in detail.items() if k.startswith(f"bpb_{v}@")}
        level, init = detail.get("unigram_bpb"), detail.get(f"init_bpb_{v}")
        if not cells or not isinstance(level, (int, float)):
            return None, f"no per-learning-rate losses of {v} stored"
        losses = {float(k): (float(x) if isinstance(x, (int, float)) else None) for k, x in cells.items()}
        if init is None and v == a:
            init = detail.get("init_bpb")
        if init is None:
            init = _init_from_sens(losses, detail.get(f"sens_{v}"))
        if init is None:
            init = detail.get("init_bpb")
            notes.append(f"{v}: initial loss of {a} used")
        if not isinstance(init, (int, float)):
            return None, "no initial loss stored"
        out.append(lr_sensitivity(losses, float(init), float(level))[0])
    return out[0] - out[1], "; ".join(notes) or None


def _init_from_sens(losses: dict[float, float | None], sens: Any) -> float | None:
    """The initial loss that reproduces a stored sensitivity under the old definition (a diverged run scored
    ``L_init``, a finished one ``min(L, L_init)``): solvable where some run diverged and the finished ones are below
    it; None otherwise."""
    done = [x for x in losses.values() if x is not None]
    k = len(losses) - len(done)
    if not isinstance(sens, (int, float)) or not k or not done:
        return None
    best = min(done)  # the best is a finished run below L_init
    init = (sens * len(losses) + len(losses) * best - sum(done)) / k
    return init if init >= max(done) else None




def collapse_cells(ctx: Any, variant: str, grid: dict[float, Path], final: dict[str, float | None]) -> dict:
    """Per learning rate of one variant and seed: ``collapsed_<variant>@<lr>`` (1 when the run diverged or ended
    at or above the unigram bits/byte of the training split minus the one margin, normlab.stats.learning.collapsed,
    else 0) and
    ``bpb_<variant>@<lr>`` (its final bits/byte, None when diverged): the split outcome the collapse rates per
    condition (Clopper-Pearson) and the loss given no collapse are counted from."""

    lrs = sorted(grid)
    level = unigram_bpb(ctx, open_config(grid[lrs[0]]))
    out: dict[str, Any] = {"unigram_bpb": level}
    for lr in lrs:
        x = final.get(f"{lr:g}")
        out[f"bpb_{variant}@{lr:g}"] = x
        out[f"collapsed_{variant}@{lr:g}"] = int(bool(collapsed(x, level)))
    return out


@register_measure("sens_diff")
def m_sens_diff(ctx: Any, runs: dict[str, Any], a: str, b: str) -> tuple[float | None, dict]:
    """``sensitivity(a) - sensitivity(b)``; the details carry each learning rate's collapse flag and final loss
    (:func:`collapse_cells`), so a sensitivity that comes from collapses shows as such."""
    sa, ba, la, da = seed_grid(ctx, runs[a])
    sb, bb, lb, db = seed_grid(ctx, runs[b])
    return sa - sb, {f"sens_{a}": sa, f"sens_{b}": sb, f"best_lr_{a}": la, f"best_lr_{b}": lb,
                     f"bpb_{a}": da["final_bpb"], f"bpb_{b}": db["final_bpb"], "init_bpb": da["init_bpb"],
                     f"init_bpb_{a}": da["init_bpb"], f"init_bpb_{b}": db["init_bpb"],
                     **collapse_cells(ctx, a, runs[a], da["final_bpb"]),
                     **collapse_cells(ctx, b, runs[b], db["final_bpb"])}


@register_measure("best_diff")
def m_best_diff(ctx: Any, runs: dict[str, Any], a: str, b: str) -> tuple[float | None, dict]:
    """``L*(a) - L*(b)``: best-of-grid final validation bits/byte; details record both, their learning rates and the
    unigram bits/byte of the training split (the did-not-learn note, ``Claim.must_learn``)."""

    sa, ba, la, da = seed_grid(ctx, runs[a])
    sb, bb, lb, db = seed_grid(ctx, runs[b])
    level = unigram_bpb(ctx, open_config(runs[a][min(runs[a])]))
    return ba - bb, {f"best_{a}": ba, f"best_{b}": bb, f"best_lr_{a}": la, f"best_lr_{b}": lb, "unigram_bpb": level}


def last_lse(run_dir: Path) -> float | None:

    pts = [(s, v) for s, k, v in read_metrics(run_dir / METRICS_FILE) if k == "diag/output_lse"]
    return max(pts)[1] if pts else None


@register_measure("zloss")
def m_zloss(ctx: Any, runs: dict[str, Any]) -> tuple[float | None, dict]:
    """``|log Z|(Pre-LN) - |log Z|(Pre-LN + z-loss)`` at the grid's highest learning rate."""
    top = max(ctx.budget.grid_lrs)
    a, b = last_lse(runs["grid_pre"][top]), last_lse(runs["grid_pre_z"][top])
    if a is None or b is None:
        return None, {"reason": "no diag/output_lse recorded (diag.every = 0?)"}
    return abs(a) - abs(b), {"lse_pre": a, "lse_pre_z": b, "lr": top}
