"""Hidden-state norm modules. One constructor shape: ``(dim, *, eps, affine, bias, **options)``.

All act on the last dimension: input ``[..., dim]`` -> output ``[..., dim]``.
"""

from __future__ import annotations

import torch
from torch import nn

from normlab.norms import functional as NF
from normlab.norms.registry import register_norm


class _AffineNorm(nn.Module):
    """Base: optional per-channel ``weight`` (ones) and ``bias`` (zeros) of shape ``[dim]``."""

    paper = ""
    description = ""

    def __init__(self, dim: int, *, eps: float = 1e-5, affine: bool = True, bias: bool = True):
        super().__init__()
        self.dim, self.eps = dim, eps
        self.weight = nn.Parameter(torch.ones(dim)) if affine else None
        self.bias = nn.Parameter(torch.zeros(dim)) if (affine and bias) else None

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps}, affine={self.weight is not None}, bias={self.bias is not None}"


@register_norm("layernorm")
class LayerNorm(_AffineNorm):
    """LayerNorm: ``(x - mean(x)) / sqrt(var(x) + eps) * weight + bias``.

    Paper: Ba, Kiros & Hinton 2016, "Layer Normalization", arXiv:1607.06450.
    Shapes: ``[..., dim] -> [..., dim]``.
    """

    paper = "Ba et al. 2016, Layer Normalization (arXiv:1607.06450)"
    description = "subtract the mean, divide by the standard deviation, per-channel gain and bias"
    flops_per_element = 5  # sum for the mean, subtract, square, sum, multiply by rsqrt

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return NF.layer_norm(x, self.weight, self.bias, self.eps)


@register_norm("rmsnorm")
class RMSNorm(_AffineNorm):
    """RMSNorm: ``x / sqrt(mean(x^2) + eps) * weight`` (no centring, no bias by default).

    ``unit_offset=True`` stores the gain as ``w`` (init 0) and applies ``(1 + w)`` (Gemma style).
    Paper: Zhang & Sennrich 2019, "Root Mean Square Layer Normalization", arXiv:1910.07467.
    Shapes: ``[..., dim] -> [..., dim]``.
    """

    paper = "Zhang & Sennrich 2019, Root Mean Square Layer Normalization (arXiv:1910.07467)"
    description = "divide by the root mean square, per-channel gain (optionally stored as 1 + w)"
    flops_per_element = 3  # square, sum, multiply by rsqrt (no mean subtraction)

    def __init__(self, dim: int, *, eps: float = 1e-5, affine: bool = True, bias: bool = False,
                 unit_offset: bool = False):
        super().__init__(dim, eps=eps, affine=affine, bias=bias)
        self.unit_offset = unit_offset
        if unit_offset and self.weight is not None:
            nn.init.zeros_(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        if w is not None and self.unit_offset:
            w = 1.0 + w
        y = NF.rms_norm(x, w, self.eps)
        return y + self.bias if self.bias is not None else y
