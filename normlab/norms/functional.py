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


def scale_norm(x: torch.Tensor, g: torch.Tensor | float, eps: float) -> torch.Tensor:
    """ScaleNorm (Nguyen & Salazar 2019): ``g * x / max(||x||_2, eps)``; ``g`` a scalar (tensor ``[1]`` or float)."""
    return g * x / torch.linalg.vector_norm(x, dim=-1, keepdim=True).clamp_min(eps)


def dyt(x: torch.Tensor, alpha: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None) -> torch.Tensor:
    """Dynamic Tanh (Zhu et al. 2025): ``weight * tanh(alpha * x) + bias``; ``alpha`` a scalar ``[1]``."""
    y = torch.tanh(alpha * x)
    if weight is not None:
        y = y * weight
    return y + bias if bias is not None else y


def group_scaling(x: torch.Tensor, groups: int, eps: float = 1e-5) -> torch.Tensor:
    """PowerNorm's per-token group scaling (Shen et al. 2020): split the last dim into ``groups`` equal groups and
    divide each by ``sqrt(mean_group(x^2) + eps)``. ``[..., d] -> [..., d]``; no statistic crosses tokens."""
    shape = x.shape
    xg = x.reshape(*shape[:-1], groups, shape[-1] // groups)
    return (xg * torch.rsqrt(xg.pow(2).mean(-1, keepdim=True) + eps)).reshape(shape)


def token_mean(x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Per-channel mean over every token of ``x [..., d]`` -> ``[d]``; ``mask [...]`` (True = real token) restricts
    it to the real tokens."""
    flat = x.reshape(-1, x.shape[-1])
    if mask is None:
        return flat.mean(0)
    m = mask.reshape(-1, 1).to(flat.dtype)
    return (flat * m).sum(0) / m.sum().clamp_min(1.0)


def geometric_mean(t: torch.Tensor, dim: int = 0) -> torch.Tensor:
    """Geometric mean along ``dim`` computed as ``exp(mean(log t))`` (Unified Normalization's window smoothing)."""
    return torch.exp(torch.log(t).mean(dim))
