"""Fixed-scale norm: LayerNorm / RMSNorm whose per-token statistic can be replaced by one stored scalar.

Heimersheim 2024, "You can remove GPT2's LayerNorm by fine-tuning" (arXiv:2409.13710), and Baroni et al. 2025,
"Transformers Don't Need LayerNorm at Inference Time" (arXiv:2507.02559; repo submarat/removing-layer-norm):
each LayerNorm's per-token standard deviation is replaced by a fixed scalar (the average standard deviation
measured at that site), one site or group of sites at a time, fine-tuning in between (``normlab remove-norm``,
normlab/surgery/remove_norm.py).

    scale == 0 (live):   y = core(x) / sqrt(stat(x) + eps) * weight + bias      (exactly LayerNorm / RMSNorm)
    scale  > 0 (fixed):  y = core(x) / scale * weight + bias                    (affine in x: no statistic)

with ``core(x) = x - mean(x)`` and ``stat = var`` when ``center`` (LayerNorm), ``core(x) = x`` and
``stat = mean(x^2)`` otherwise (RMSNorm). The mean subtraction is a fixed linear projection (``I - 11^T/d``), not a
normalization. ``scale`` is a buffer ``[1]`` (saved with the weights, never trained; 0 at construction), so
which sites are removed is part of the model state, not of the config. Parameters: ``weight [dim]`` (ones),
``bias [dim]`` (zeros; default on when ``center``, off otherwise). Shapes: ``[..., dim] -> [..., dim]``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from normlab.norms import functional as NF
from normlab.norms.registry import register_norm


@register_norm("fixedscale")
class FixedScaleNorm(nn.Module):
    """LayerNorm (``center=True``) or RMSNorm (``center=False``) until its ``scale`` buffer is set > 0; then
    ``core(x) / scale * weight + bias`` (LN removal by fine-tuning, Heimersheim 2024; Baroni et al. 2025)."""

    paper = ("Heimersheim 2024, You can remove GPT2's LayerNorm by fine-tuning (arXiv:2409.13710); "
             "Baroni et al. 2025, Transformers Don't Need LayerNorm at Inference Time (arXiv:2507.02559)")
    description = "LayerNorm/RMSNorm whose per-token std is replaced by a stored scalar once removed (LN removal)"
    flops_per_element = 5  # as LayerNorm until removed (centred: sum, subtract; then a divide by the scalar)

    def __init__(self, dim: int, *, eps: float = 1e-5, affine: bool = True, bias: bool | None = None,
                 center: bool = True):
        super().__init__()
        self.dim, self.eps, self.center = dim, eps, bool(center)
        bias = self.center if bias is None else bias
        self.weight = nn.Parameter(torch.ones(dim)) if affine else None
        self.bias = nn.Parameter(torch.zeros(dim)) if (affine and bias) else None
        self.register_buffer("scale", torch.zeros(1))

    @property
    def fixed(self) -> bool:
        """Whether this site is removed (divides by the stored scalar, computes no statistic)."""
        return bool(self.scale.item() > 0)

    def statistic(self, x: torch.Tensor) -> torch.Tensor:
        """The per-token divisor a live norm uses: ``sqrt(var(x) + eps)`` or ``sqrt(mean(x^2) + eps)``, ``[..., 1]``."""
        x = x.double()
        if self.center:
            return torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + self.eps)
        return torch.sqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.fixed:
            if self.center:
                return F.layer_norm(x, (self.dim,), self.weight, self.bias, self.eps)
            y = NF.rms_norm(x, self.weight, self.eps)
            return y + self.bias if self.bias is not None else y
        y = x - x.mean(-1, keepdim=True) if self.center else x
        y = y / self.scale.to(y.dtype)
        if self.weight is not None:
            y = y * self.weight
        return y + self.bias if self.bias is not None else y

    def extra_repr(self) -> str:
        return (f"{self.dim}, eps={self.eps}, center={self.center}, affine={self.weight is not None}, "
                f"bias={self.bias is not None}, scale={float(self.scale.item()):.4g}")
