"""The model's output probability map (``model.output``): softmax (the default) or StableMax.

StableMax (Prieto, Barsbey, Mediano & Birdal 2025, "Grokking at the Edge of Numerical Stability", ICLR 2025,
arXiv:2501.04697; repo LucasPrietoAl/grokking-at-the-edge-of-numerical-stability) replaces ``exp`` in the softmax
by a function that grows linearly for positive inputs and decays like ``1/|x|`` for negative ones:

    s(x) = x + 1          for x >= 0
    s(x) = 1 / (1 - x)    for x <  0
    StableMax(x)_i = s(x_i) / sum_j s(x_j)

``s`` is positive, continuous and continuously differentiable at 0 (``s(0) = 1``, ``s'(0) = 1``), so the probability
of a class never rounds to exactly 1 (and its gradient never to exactly 0) until its logit is ~``V / eps_fp32``
above the others -- the Softmax Collapse the paper describes for ``exp``.

normlab applies StableMax *inside the model*: ``GPT.run`` returns ``log StableMax(z)`` (:func:`log_stablemax`) as
its logits. Because those are normalised log-probabilities, ``softmax(log StableMax(z)) = StableMax(z)``, so the
cross-entropy of training, evaluation (bits/byte), calibration and sampling all read the StableMax distribution
without knowing about it. (The paper computes the StableMax cross-entropy in float64 in its code; here it is
float32, with ``log s`` computed as ``log1p`` of each branch, which is exact to float32 rounding.)
"""

from __future__ import annotations

import torch

OUTPUTS = ("softmax", "stablemax")


def stablemax_s(x: torch.Tensor) -> torch.Tensor:
    """``s(x)`` elementwise (any shape): ``x + 1`` for ``x >= 0``, ``1 / (1 - x)`` for ``x < 0``."""
    return torch.where(x >= 0, x.clamp_min(0) + 1, 1 / (1 - x.clamp_max(0)))


def log_stablemax_s(x: torch.Tensor) -> torch.Tensor:
    """``log s(x)`` (any shape): ``log1p(x)`` for ``x >= 0``, ``-log1p(-x)`` for ``x < 0``. Each branch sees a
    clamped input, so the branch not taken never produces a NaN gradient."""
    return torch.where(x >= 0, torch.log1p(x.clamp_min(0)), -torch.log1p((-x).clamp_min(0)))


def stablemax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """``StableMax(x)`` along ``dim``: ``s(x_i) / sum_j s(x_j)`` (same shape as ``x``; rows sum to 1)."""
    s = stablemax_s(x)
    return s / s.sum(dim=dim, keepdim=True)


def log_stablemax(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """``log StableMax(x)`` along ``dim`` (``[..., V] -> [..., V]``): ``log s(x_i) - log sum_j s(x_j)``, the sum
    taken as a ``logsumexp`` of ``log s`` (no overflow for huge logits)."""
    ls = log_stablemax_s(x)
    return ls - torch.logsumexp(ls, dim=dim, keepdim=True)


def apply_output(logits: torch.Tensor, output: str) -> torch.Tensor:
    """The model's final logits for ``model.output``: unchanged for ``softmax``, ``log StableMax`` (computed in
    at least float32) for ``stablemax``."""
    if output == "softmax":
        return logits
    if output == "stablemax":
        low = logits.dtype in (torch.float16, torch.bfloat16)
        return log_stablemax(logits.float() if low else logits).to(logits.dtype)
    raise ValueError(f"output must be one of {OUTPUTS}, got {output!r}")
