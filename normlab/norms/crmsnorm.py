"""CRMSNorm: RMSNorm of a zero-mean vector stored in all but its last coordinate.

Paper: Jiang et al. 2023, "Pre-RMSNorm and Pre-CRMSNorm Transformers: Equivalent and Efficient Pre-LN
Transformers", arXiv:2305.14858 (repo ZixuanJiang/pre-rmsnorm-transformer).

A zero-mean d-vector ``z`` is fully determined by its first ``d-1`` coordinates ``x`` (``z_d = -sum(x)``), so

    sum(z^2) = sum(x^2) + sum(x)^2        and   RMSNorm(z)[:d-1] = x * rsqrt((sum(x^2) + sum(x)^2) / d + eps)

A Pre-CRMSNorm model stores its residual stream that way (``normlab.model.crms.CRMSGPT``, chosen by
``compressed_stream``): every
residual writer keeps ``d-1`` output coordinates and every reader's weight becomes ``W[:, :-1] - W[:, -1:]``.
"""

from __future__ import annotations

import torch

from normlab.norms.modules import _AffineNorm
from normlab.norms.registry import register_norm


def crms_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    """``x [..., s] -> [..., s]``: ``x * rsqrt((sum(x^2) + sum(x)^2) / (s + 1) + eps)``; fp16/bf16 computed in fp32."""
    xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    ms = (xf.pow(2).sum(-1, keepdim=True) + xf.sum(-1, keepdim=True).pow(2)) / (x.shape[-1] + 1)
    return (xf * torch.rsqrt(ms + eps)).to(x.dtype)


@register_norm("crmsnorm")
class CRMSNorm(_AffineNorm):
    """Compressed RMSNorm: ``x * rsqrt((sum(x^2) + sum(x)^2) / d + eps) * weight (+ bias)``, ``d = dim + 1``.

    ``dim`` is the number of *stored* coordinates (``d - 1``); the input is the zero-mean d-vector
    ``[x, -sum(x)]``. Shapes: ``[..., dim] -> [..., dim]``. Parameters ``weight`` / ``bias`` are ``[dim]``; a
    converted model uses ``affine=False`` (its gains are folded into the next linear).
    With ``model.norm: crmsnorm`` the whole residual stream is stored in ``width - 1`` coordinates.
    """

    flops_per_element = 4  # square, sum, sum (for sum(x)^2), multiply by rsqrt
    compressed_stream = True  # normlab.model.build_model builds the (width - 1)-coordinate model for it
    paper = "Jiang et al. 2023, Pre-RMSNorm and Pre-CRMSNorm Transformers (arXiv:2305.14858)"
    description = ("RMSNorm of a zero-mean d-vector stored in d-1 coordinates; model.norm=crmsnorm stores the "
                   "residual stream in width-1 coordinates (exact Pre-LN equivalent, see normlab convert)")

    def __init__(self, dim: int, *, eps: float = 1e-5, affine: bool = True, bias: bool = False):
        super().__init__(dim, eps=eps, affine=affine, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = crms_norm(x, self.eps)
        if self.weight is not None:
            y = y * self.weight
        return y + self.bias if self.bias is not None else y
