"""Pure functions behind the norm modules. ``x``: ``[..., d]``; statistics over the last dimension."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def layer_norm(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float) -> torch.Tensor:
    """LayerNorm (Ba et al. 2016): ``(x - mean) / sqrt(var + eps) * weight + bias`` (biased variance)."""
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)


class _RMSNormFn(torch.autograd.Function):
    """RMSNorm with a hand-written backward that reuses the fused LayerNorm backward kernel.

    ``F.rms_norm`` on the CPU build we target is a chain of eager ops whose autograd graph costs 3-7x the fused
    ``F.layer_norm`` (docs/benchmarks.md). Here the forward is one reduction (``vecdot(x, x)``) and two pointwise
    passes; the backward calls ``native_layer_norm_backward`` with ``mean = 0`` and the RMS ``rstd``, whose
    ``x_hat = x * rstd`` and ``dw = sum(g * x_hat)`` are exactly RMSNorm's, and adds back the one term LayerNorm has
    and RMSNorm has not: LayerNorm's ``dx = rstd * (gw - mean(gw) - x_hat * mean(gw * x_hat))`` with ``gw = g * w``,
    RMSNorm's drops ``- mean(gw)``, so ``dx_rms = dx_ln + rstd * (g @ w) / d`` (a matrix-vector product).
    Shapes: ``x [..., d]``, ``weight [d]`` or None -> ``[..., d]``. Checked by gradcheck against ``F.rms_norm``.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
        d = x.shape[-1]
        rstd = torch.linalg.vecdot(x, x).unsqueeze_(-1).mul_(1.0 / d).add_(eps).rsqrt_()
        y = torch.mul(x, rstd)
        if weight is not None:
            y.mul_(weight)
        ctx.save_for_backward(x, rstd, weight)
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g: torch.Tensor):
        x, rstd, weight = ctx.saved_tensors
        d = x.shape[-1]
        g = g.contiguous()
        need_w = weight is not None and ctx.needs_input_grad[1]
        dx, dw, _ = torch.ops.aten.native_layer_norm_backward(
            g, x, [d], torch.zeros_like(rstd), rstd, weight, None, [True, need_w, False])
        gw_mean = (g @ weight if weight is not None else g.sum(-1)).unsqueeze_(-1).mul_(1.0 / d)
        dx.addcmul_(rstd, gw_mean)
        return dx, (dw if need_w else None), None


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """RMSNorm (Zhang & Sennrich 2019): ``x / sqrt(mean(x^2) + eps) * weight``. ``[..., d] -> [..., d]``.

    Contiguous float32/float64 CPU inputs take ``_RMSNormFn`` (the fastest correct path we measured,
    docs/benchmarks.md; it supports one backward, not double backward); other dtypes and devices, and inputs
    batched by ``torch.func.vmap`` (a stacked group's forward, normlab.train.stacked: the Function has no vmap rule),
    use ``F.rms_norm``."""
    if (x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64) and x.is_contiguous()
            and (weight is None or weight.dtype == x.dtype) and not torch._C._functorch.is_batchedtensor(x)):
        return _RMSNormFn.apply(x, weight, eps)
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


def derf(x: torch.Tensor, alpha: torch.Tensor, shift: torch.Tensor, weight: torch.Tensor | None,
         bias: torch.Tensor | None) -> torch.Tensor:
    """Dynamic erf (Chen et al. 2025): ``weight * erf(alpha * x + shift) + bias``; ``alpha``, ``shift`` scalars
    ``[1]``. ``[..., d] -> [..., d]``."""
    y = torch.erf(alpha * x + shift)
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
