"""Per-token norms without batch statistics: ScaleNorm, DyT (Dynamic Tanh), Derf (Dynamic erf) and ``none`` (identity).

All act on the last dimension: input ``[..., dim]`` -> output ``[..., dim]``; train and eval compute the same thing.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from normlab.errors import NormlabError
from normlab.norms import functional as NF
from normlab.norms.registry import register_norm

# Zhu et al. 2025, "Transformers without Normalization", Section 7.2: the tuned LLaMA alpha0 (attention / other) by
# model width -- Table 11 (widths 1024 to 8192; depth has negligible influence) and Table 10 (LLaMA 13B, width
# 5120). The authors' LLaMA commands use the same values (github.com/jiachenzhu/DyT, other_tasks/LLaMA/README.md:
# 7B 0.8/0.2, 13B 0.6/0.15, 34B and 70B 0.2/0.05; tests/fixtures/dyt_reference.json).
DYT_ALPHA0_BY_WIDTH = ((1024, 1.0, 1.0), (2048, 1.0, 0.5), (4096, 0.8, 0.2), (5120, 0.6, 0.15), (8192, 0.2, 0.05))


def dyt_alpha0(width: int, group: str) -> float:
    """The paper's LLM alpha0 for a DyT at a site of ``group`` in a model of ``width``.

    The row of ``DYT_ALPHA0_BY_WIDTH`` whose width is nearest on a log scale: narrower than 1024 (the paper tabulates
    no narrower model) the 1024 row, 1.0 / 1.0; wider than 8192 the 8192 row. ``attn`` sites (the DyT in front of
    attention) take the attention value, the others (``mlp``, ``final``, ``embed``) the other value.
    """
    row = min(DYT_ALPHA0_BY_WIDTH, key=lambda r: abs(math.log(width / r[0])))
    return row[1] if group == "attn" else row[2]


@register_norm("scalenorm")
class ScaleNorm(nn.Module):
    """ScaleNorm: ``g * x / max(||x||_2, eps)`` with ONE learnable scalar ``g``.

    Paper: Nguyen & Salazar 2019, "Transformers without Tears: Improving the Normalization of Self-Attention",
    arXiv:1910.05895. The gain is the parameter ``weight`` of shape ``[1]``, initialised to ``sqrt(dim)`` (so the
    output starts with root-mean-square 1). ``eps`` clamps the norm from below (it is not added under a root).
    ``affine=False`` keeps ``g`` fixed at ``sqrt(dim)`` (``weight`` is None). ScaleNorm has no bias: ``bias=True``
    is an error. Shapes: ``[..., dim] -> [..., dim]``.
    """

    paper = "Nguyen & Salazar 2019, Transformers without Tears (arXiv:1910.05895)"
    description = "divide by the L2 norm, one learnable scalar gain (init sqrt(d))"
    flops_per_element = 3  # square, sum, divide (the scalar gain: the counter's one per element)

    def __init__(self, dim: int, *, eps: float = 1e-5, affine: bool = True, bias: bool = False):
        super().__init__()
        if bias:
            raise NormlabError("norm 'scalenorm' has no bias (one scalar gain only); set bias: false")
        self.dim, self.eps = dim, eps
        self.weight = nn.Parameter(torch.full((1,), math.sqrt(dim))) if affine else None
        self.bias = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g = self.weight if self.weight is not None else math.sqrt(self.dim)
        return NF.scale_norm(x, g, self.eps)

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps}, affine={self.weight is not None}"


@register_norm("dyt")
class DyT(nn.Module):
    """Dynamic Tanh: ``weight * tanh(alpha * x) + bias``, ``alpha`` one learnable scalar.

    Paper: Zhu, Chen, He, LeCun & Liu 2025, "Transformers without Normalization", arXiv:2503.10622 (code:
    github.com/jiachenzhu/DyT). Parameters: ``alpha [1]`` (init ``alpha_init``, default 0.5, the paper's value for
    non-LLM models, Section 7.1), ``weight [dim]`` (ones) and ``bias [dim]`` (zeros). The paper's LLM recipe drops
    the bias and uses a different alpha init per site, set by the model's width (Section 7.2, Tables 10-11); in a
    config, ``alpha_init: auto`` picks it for each site (``dyt_alpha0``), or the values are given by hand::

        model:
          norm: dyt
          norm_options: {bias: false, alpha_init: auto}
          # or: {bias: false, alpha_init@attn: 0.8, alpha_init@mlp: 0.2, alpha_init@final: 0.2}  (their 7B)

    (``normlab/configs/dyt.yaml`` has the 7B values). ``alpha`` is DyT's only parameter not named
    ``weight``/``bias``: it is the squashing scale, not an affine map, so it stays learnable with ``affine=False``
    (which removes ``weight`` and ``bias``). No statistics: every token is transformed on its own. ``eps`` is
    accepted for the shared constructor and unused. Shapes: ``[..., dim] -> [..., dim]``.
    """

    paper = "Zhu et al. 2025, Transformers without Normalization (arXiv:2503.10622)"
    description = "element-wise tanh(alpha * x) with a learnable scalar alpha, per-channel gain and bias"
    # the authors' LLaMA code puts a learnable scalar after the token embedding (model.embed_scale: auto)
    auto_embed_scale = "learnable"
    flops_per_element = 2  # alpha * x, tanh: no reduction
    extra_params = scalar_params = ("alpha",)  # the squashing scale: not an affine map, reported by diagnose
    convertible = False
    convertible_why = ("DyT computes tanh(alpha x) elementwise, with no per-token statistic to reproduce and no "
                       "per-channel affine to fold")

    def __init__(self, dim: int, *, eps: float = 1e-5, affine: bool = True, bias: bool = True,
                 alpha_init: float = 0.5):
        super().__init__()
        if alpha_init == "auto":
            raise NormlabError("norm 'dyt': alpha_init 'auto' depends on the site (attention or other): set it in "
                               "model.norm_options, where each site resolves it, or give a number")
        if isinstance(alpha_init, (bool, str)) or not isinstance(alpha_init, (int, float)):
            raise NormlabError(f"norm 'dyt': alpha_init must be a number or 'auto', got {alpha_init!r}")
        self.dim, self.eps, self.alpha_init = dim, eps, float(alpha_init)
        self.alpha = nn.Parameter(torch.full((1,), float(alpha_init)))
        self.weight = nn.Parameter(torch.ones(dim)) if affine else None
        self.bias = nn.Parameter(torch.zeros(dim)) if (affine and bias) else None

    @staticmethod
    def resolve_options(dim: int, group: str, options: dict[str, Any]) -> dict[str, Any]:
        """``options`` of a DyT at a site of ``group`` with ``alpha_init: auto`` replaced by ``dyt_alpha0(dim,
        group)``."""
        if options.get("alpha_init") == "auto":
            return {**options, "alpha_init": dyt_alpha0(dim, group)}
        return options

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return NF.dyt(x, self.alpha, self.weight, self.bias)

    def extra_repr(self) -> str:
        return (f"{self.dim}, alpha_init={self.alpha_init}, affine={self.weight is not None}, "
                f"bias={self.bias is not None}")


@register_norm("derf")
class Derf(nn.Module):
    """Dynamic erf: ``weight * erf(alpha * x + shift) + bias``, ``alpha`` and ``shift`` learnable scalars.

    Paper: Chen, Lu, Zhu, Sun & Liu 2025, "Stronger Normalization-Free Transformers", arXiv:2512.10938 (code:
    github.com/zlab-princeton/Derf, class ``Dynamic_erf``). DyT with ``tanh`` replaced by the Gaussian error function
    and a learnable shift inside it. Parameters: ``alpha [1]`` (init ``alpha_init``), ``shift [1]`` (init
    ``shift_init``, the authors' 0), ``weight [dim]`` (ones), ``bias [dim]`` (zeros). The default ``alpha_init``
    1.0 is the authors' language-model recipe (their nanoGPT patch, ``language model/model_derf.patch``: attention,
    FFN and final Derf all initialised to 1.0, and the embeddings multiplied by a learnable scalar, which
    ``model.embed_scale: auto`` gives here as for DyT); their vision, speech and DNA modules default to 0.5.
    Per-site values are given as for DyT (``alpha_init@attn``). ``affine=False`` removes ``weight`` and ``bias``;
    ``alpha`` and ``shift`` stay learnable. ``eps`` is accepted for the shared constructor and unused.
    Shapes: ``[..., dim] -> [..., dim]``.
    """

    paper = "Chen et al. 2025, Stronger Normalization-Free Transformers (arXiv:2512.10938)"
    description = "element-wise erf(alpha * x + s) with learnable scalars alpha and s, per-channel gain and bias"
    auto_embed_scale = "learnable"  # the authors' nanoGPT patch scales the embeddings by a learnable scalar
    flops_per_element = 3  # alpha * x, + shift, erf: no reduction
    extra_params = scalar_params = ("alpha", "shift")
    convertible = False
    convertible_why = ("Derf computes erf(alpha x + s) elementwise, with no per-token statistic to reproduce and no "
                       "per-channel affine to fold")

    def __init__(self, dim: int, *, eps: float = 1e-5, affine: bool = True, bias: bool = True,
                 alpha_init: float = 1.0, shift_init: float = 0.0):
        super().__init__()
        for key, v in (("alpha_init", alpha_init), ("shift_init", shift_init)):
            if isinstance(v, (bool, str)) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise NormlabError(f"norm 'derf': {key} must be a finite number, got {v!r}")
        self.dim, self.eps, self.alpha_init, self.shift_init = dim, eps, float(alpha_init), float(shift_init)
        self.alpha = nn.Parameter(torch.full((1,), float(alpha_init)))
        self.shift = nn.Parameter(torch.full((1,), float(shift_init)))
        self.weight = nn.Parameter(torch.ones(dim)) if affine else None
        self.bias = nn.Parameter(torch.zeros(dim)) if (affine and bias) else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return NF.derf(x, self.alpha, self.shift, self.weight, self.bias)

    def extra_repr(self) -> str:
        return (f"{self.dim}, alpha_init={self.alpha_init}, shift_init={self.shift_init}, "
                f"affine={self.weight is not None}, bias={self.bias is not None}")


@register_norm("none")
class NoNorm(nn.Module):
    """No normalization: the identity ``y = x``; no parameters (``affine``, ``bias`` and ``eps`` are accepted for
    the shared constructor and ignored; ``weight`` and ``bias`` are None).

    The baseline for "is a norm needed at all" and the norm of self-normalising networks (Klambauer et al. 2017,
    "Self-Normalizing Neural Networks", arXiv:1706.02515): those need SELU activations (scale 1.0507, alpha
    1.67326) and LeCun-normal init in the MLP/init code, chosen with ``model.activation`` -- not here.
    Shapes: ``[..., dim] -> [..., dim]``.
    """

    paper = "Klambauer et al. 2017, Self-Normalizing Neural Networks (arXiv:1706.02515): identity baseline"
    description = "identity (no normalization); pair with SELU activations for a self-normalising network"
    flops_per_element = 0

    def __init__(self, dim: int, *, eps: float = 1e-5, affine: bool = True, bias: bool = True):
        super().__init__()
        self.dim = dim
        self.weight = None
        self.bias = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def extra_repr(self) -> str:
        return f"{self.dim}"
