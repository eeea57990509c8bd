"""Pure functions behind the norm modules. ``x``: ``[..., d]``; statistics over the last dimension."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def layer_norm(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float) -> torch.Tensor:
    """LayerNorm (Ba et al. 2016): ``(x - mean) / sqrt(var + eps) * weight + bias`` (biased variance)."""
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """RMSNorm (Zhang & Sennrich 2019): ``x / sqrt(mean(x^2) + eps) * weight``."""
    return F.rms_norm(x, (x.shape[-1],), weight, eps)
