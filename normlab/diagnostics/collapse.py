"""Softmax Collapse (Prieto et al. 2025, "Grokking at the Edge of Numerical Stability", ICLR 2025,
arXiv:2501.04697, Section 3): once the target's logit is far enough above the others, the float32 softmax rounds
its probability to exactly 1, the cross-entropy of that position to exactly 0 and the gradient of the target
logit, ``p_y - 1``, to exactly 0: the position stops contributing to learning (the paper counts the samples whose
loss is exactly 0). With ``exp`` this happens at a margin of about ``log(2^24) + log(V - 1)`` ~ 17 + log V nats;
in float64 only at ~37 + log V.

Two fractions, recorded on diagnostic steps (``diag.every``) next to Wortsman et al.'s instability signals:

- ``diag/softmax_collapse``: the fraction of positions (non-ignored targets) whose float32 softmax gives the
  target probability exactly 1, i.e. whose gradient with respect to the target logit is exactly 0;
- ``diag/logits_beyond_exp``: the fraction of logits ``z_v`` with ``exp(z_v - max z)`` == 0 in float32
  (``z_v - max z`` below ``log`` of the smallest float32 subnormal, -103.28): beyond the range of float32 ``exp``,
  so they receive an exactly-zero gradient.

For a model with ``model.output: stablemax`` the logits are ``log StableMax`` and the softmax reads the StableMax
probabilities, so both fractions are those of StableMax.
"""

from __future__ import annotations

import math

import torch

# log of the smallest positive float32 (subnormal 2^-149): exp of anything below it rounds to 0
FP32_EXP_FLOOR = math.log(2.0 ** -149)


def softmax_collapse(logits: torch.Tensor, targets: torch.Tensor, *, dtype: torch.dtype = torch.float32,
                     ignore_index: int = -100) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """Counts of Softmax Collapse in ``dtype``.

    ``logits [..., V]``, ``targets [...]`` (int64; ``ignore_index`` positions left out). Returns 0-dim tensors
    ``(collapsed positions, logits beyond exp range)`` and the ints ``(positions, logits)`` they are out of. A
    position is collapsed when ``softmax(logits.to(dtype))[target] == 1`` exactly (the gradient of its
    cross-entropy with respect to the target logit, ``p_y - 1``, is exactly 0). A logit is beyond the exp range
    when ``exp(z_v - max z)`` underflows to exactly 0 in ``dtype``.
    """
    V = logits.shape[-1]
    z = logits.detach().reshape(-1, V).to(dtype)
    y = targets.reshape(-1)
    keep = y != ignore_index
    z, y = z[keep], y[keep]
    if z.shape[0] == 0:
        zero = torch.zeros((), dtype=torch.int64, device=logits.device)
        return zero, zero, 0, 0
    p_y = torch.softmax(z, dim=-1).gather(1, y[:, None]).squeeze(1)
    collapsed = (p_y == 1).sum()
    beyond = (torch.exp(z - z.amax(dim=-1, keepdim=True)) == 0).sum()
    return collapsed, beyond, int(z.shape[0]), int(z.numel())


def collapse_fractions(logits: torch.Tensor, targets: torch.Tensor, *,
                       dtype: torch.dtype = torch.float32) -> dict[str, float]:
    """``{"softmax_collapse": fraction of positions, "logits_beyond_exp": fraction of logits}`` in ``dtype``."""
    c, b, n, m = softmax_collapse(logits, targets, dtype=dtype)
    return {"softmax_collapse": float(c) / max(n, 1), "logits_beyond_exp": float(b) / max(m, 1)}
