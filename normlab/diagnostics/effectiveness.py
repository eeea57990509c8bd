"""Layer effectiveness: how much each block changes the residual stream, and what skipping it costs.

Sun et al. 2025, "The Curse of Depth in Large Language Models" (arXiv:2502.05795), following Gromov et al. 2024,
"The Unreasonable Ineffectiveness of the Deeper Layers" (arXiv:2403.17887): the angular distance between a
block's input ``x`` and output ``y`` is ``arccos(cos(x, y)) / pi`` in ``[0, 1]`` (0 = same direction: the block
only rescales, or is the identity), computed per token and averaged over all tokens of the sample (float64).
The skip cost is the validation loss increase when the block is replaced by the identity (its output replaced
by its input; everything else unchanged): ``loss(skip l) - loss(full)`` in nats/token.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from normlab.diagnostics.capture import eval_mode, hooks


def angular_distance(x: torch.Tensor, y: torch.Tensor) -> float:
    """Mean over tokens of ``arccos(cos(x_t, y_t)) / pi``; ``x, y [..., d]``. Zero vectors count as distance 0.5
    only when exactly one of the pair is zero; two zero vectors count as 0."""
    a, b = x.detach().double(), y.detach().double()
    dot = (a * b).sum(-1)
    na, nb = a.norm(dim=-1), b.norm(dim=-1)
    cos = torch.where((na > 0) & (nb > 0), dot / (na * nb).clamp_min(1e-300), torch.where(na == nb, 1.0, 0.0))
    return float((torch.arccos(cos.clamp(-1.0, 1.0)) / math.pi).mean())


def angular_distances(hidden: Sequence[torch.Tensor]) -> list[float]:
    """Per block ``l``: angular distance between ``hidden[l]`` (its input) and ``hidden[l + 1]`` (its output)."""
    return [angular_distance(hidden[l], hidden[l + 1]) for l in range(len(hidden) - 1)]


def _loss(model: nn.Module, idx: torch.Tensor, targets: torch.Tensor) -> float:
    logits = model(idx)
    return float(F.cross_entropy(logits.double().reshape(-1, logits.size(-1)), targets.reshape(-1)))


@torch.no_grad()
def skip_losses(model: nn.Module, idx: torch.Tensor, targets: torch.Tensor) -> dict:
    """``{base_loss, skip_loss: [L], skip_loss_increase: [L]}``: mean cross-entropy (nats/token) of the sample in
    eval mode, and with each block in turn replaced by the identity (a forward hook returning the block input;
    removed afterwards)."""
    with eval_mode(model):
        base = _loss(model, idx, targets)
        skipped = []
        for blk in model.blocks:
            with hooks([lambda blk=blk: blk.register_forward_hook(lambda _m, inp, _out: inp[0])]):
                skipped.append(_loss(model, idx, targets))
    return {"base_loss": base, "skip_loss": skipped, "skip_loss_increase": [s - base for s in skipped]}
