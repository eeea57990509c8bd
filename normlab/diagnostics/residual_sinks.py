"""Residual sinks (Qiu et al. 2026, "A Unified View of Attention and Residual Sinks: Outlier-Driven Rescaling is
Essential for Transformer Training", arXiv:2601.22966): a few *fixed hidden dimensions* of the residual stream with
persistently large activations across most tokens. With RMSNorm (or softmax, for attention sinks) such an outlier
sets the normaliser and so rescales every other component ("outlier-driven rescaling"); the paper shows that
clipping the outliers while keeping the normalization degrades the model.

Detection, per block output ``h [N, T, d]`` (a criterion stated here; the paper reads the sinks off activation
plots): let ``m = median |h|`` over all of the block's entries. Dimension ``j`` is a residual sink when
``|h[:, :, j]| > ratio * m`` on at least ``persist`` of the ``N T`` tokens (defaults ``ratio = 10``, ``persist =
0.5``: "most tokens"). A massive activation on a few tokens (Sun et al. 2024) is not persistent and is not one.
For each block: the sink dims, each one's persistence (share of tokens above the threshold), and their **share of
the RMS**: ``sum_{j in sinks} mean(h_j^2) / sum_j mean(h_j^2)``, the part of ``mean(h^2)`` -- the square of the
RMS an RMSNorm divides by -- that the sink dims carry.

Ablation (:func:`ablate_residual_sinks`, ``normlab diagnose --ablate-residual-sinks``): the loss on the sample when,
at every block's output, the sink dims of that block are clipped to the block's median scale,
``h[:, :, j] <- clamp(h[:, :, j], -m, m)``, against the unclipped loss; and, as a control, the same clipping of as
many non-sink dims (chosen with a fixed seed). Deviation, stated: the paper clips outliers *during training* and
compares trained models; this clips a trained model's stream at evaluation, which measures how much the model relies
on its sinks now, not how training would adapt without them.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from normlab.diagnostics.capture import eval_mode, hooks

RATIO = 10.0
PERSIST = 0.5


@torch.no_grad()
def residual_sinks(h: torch.Tensor, *, ratio: float = RATIO, persist: float = PERSIST) -> dict:
    """Sink dims of one residual stream ``h [..., d]``: ``{dims, persistence: [share per sink dim], rms_share,
    median_abs, threshold, width}`` (``dims`` sorted; ``persistence`` in the same order)."""
    x = h.detach().double().reshape(-1, h.shape[-1]).abs()
    m = float(x.median())
    thr = ratio * m
    frac = (x > thr).double().mean(0)  # [d]: share of tokens above the threshold, per dim
    dims = [int(j) for j in torch.nonzero(frac >= persist).flatten().tolist()]
    energy = x.pow(2).mean(0)
    total = float(energy.sum())
    share = float(energy[dims].sum()) / total if dims and total > 0 else 0.0
    return {"dims": dims, "persistence": [float(frac[j]) for j in dims], "rms_share": share, "median_abs": m,
            "threshold": thr, "width": int(h.shape[-1])}


def residual_sinks_by_block(block_outputs: Sequence[torch.Tensor], *, ratio: float = RATIO,
                            persist: float = PERSIST) -> dict:
    """:func:`residual_sinks` of every block output (``[N, T, d]`` each): ``{ratio, persist, blocks: [{block,
    ...}], dims: sorted union over blocks, max_rms_share}``."""
    blocks = [{"block": l, **residual_sinks(h, ratio=ratio, persist=persist)} for l, h in enumerate(block_outputs)]
    return {"ratio": ratio, "persist": persist, "blocks": blocks,
            "dims": sorted({j for b in blocks for j in b["dims"]}),
            "max_rms_share": max((b["rms_share"] for b in blocks), default=0.0)}


def _clip_hook(dims: list[int], scale: float):
    index = torch.tensor(dims, dtype=torch.long)

    def hook(_m: nn.Module, _inp: tuple, out: torch.Tensor) -> torch.Tensor:
        out = out.clone()
        idx = index.to(out.device)
        out[..., idx] = out[..., idx].clamp(-scale, scale)
        return out

    return hook


def _loss(model: nn.Module, idx: torch.Tensor, targets: torch.Tensor) -> float:
    logits = model(idx)
    return float(F.cross_entropy(logits.double().reshape(-1, logits.size(-1)), targets.reshape(-1)))


@torch.no_grad()
def clipped_loss(model: nn.Module, idx: torch.Tensor, targets: torch.Tensor,
                 per_block: Sequence[tuple[list[int], float]]) -> float:
    """Mean cross-entropy (nats/token, eval mode) with block ``l``'s output dims ``per_block[l][0]`` clamped to
    ``[-s, s]``, ``s = per_block[l][1]`` (forward hooks, removed afterwards)."""
    regs = [lambda blk=blk, d=d, s=s: blk.register_forward_hook(_clip_hook(d, s))
            for blk, (d, s) in zip(model.blocks, per_block) if d]
    with eval_mode(model), hooks(regs):
        return _loss(model, idx, targets)


@torch.no_grad()
def ablate_residual_sinks(model: nn.Module, idx: torch.Tensor, targets: torch.Tensor, sinks: dict, *,
                          seed: int = 0) -> dict:
    """The clipping ablation for the sinks ``sinks`` (:func:`residual_sinks_by_block` of this model's block
    outputs on ``idx``): ``{base_loss, clipped_loss, increase, control_loss, control_increase, clipped_dims,
    control_dims}`` (nats/token). With no sink anywhere, the losses are equal and the control clips nothing."""
    with eval_mode(model):
        base = _loss(model, idx, targets)
    per_block = [(b["dims"], b["median_abs"]) for b in sinks["blocks"]]
    clipped = clipped_loss(model, idx, targets, per_block)
    gen = torch.Generator().manual_seed(seed)
    control = []
    for b in sinks["blocks"]:
        rest = [j for j in range(b["width"]) if j not in b["dims"]]
        pick = [rest[int(i)] for i in torch.randperm(len(rest), generator=gen)[: len(b["dims"])]]
        control.append((sorted(pick), b["median_abs"]))
    ctrl = clipped_loss(model, idx, targets, control)
    return {"base_loss": base, "clipped_loss": clipped, "increase": clipped - base, "control_loss": ctrl,
            "control_increase": ctrl - base, "clipped_dims": [d for d, _ in per_block],
            "control_dims": [d for d, _ in control]}
