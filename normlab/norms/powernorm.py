"""PowerNorm (Shen et al. 2020): group scaling, then a batch quadratic mean with a running estimate and an
approximate backward pass. Follows the authors' ``fairseq/modules/norms/mask_powernorm.py`` (sIncerass/powernorm).
"""

from __future__ import annotations

import torch

from normlab.errors import NormlabError
from normlab.norms import functional as NF
from normlab.norms.batchstat import (BatchStatNorm, global_count, global_sum0, global_token_mean, pick,
                                     pinned, sync_group)
from normlab.norms.registry import register_norm

GROUP_EPS = 1e-5  # the authors' GroupScaling1D eps, independent of the norm's eps


class PowerFunction(torch.autograd.Function):
    """Training-mode PowerNorm on ``z_in [N, C]`` (already group-scaled) with the approximate backward.

    Forward: ``z = z_in / sqrt(s + eps)`` with ``s = var`` (batch quadratic mean) during warm-up, else the running
    ``phi``; ``y = weight * z + bias``. Backward (the paper's Alg. 1, authors' ``PowerFunction.backward``)::

        g = dy * weight;  approx = g - (1 - alpha_bkw) * ema_gz * z;  ema_gz += mean_tokens(approx * z)
        dx = approx / sqrt(var + eps)       (batch var, also after warm-up)
        dweight = sum(dy * z);  dbias = sum(dy)

    ``ema_gz [C]`` is updated in place (the authors' ``ema_gz.add_``: an accumulated sum, despite its name).
    """

    @staticmethod
    def forward(ctx, z_in, weight, bias, scale, var, ema_gz, eps, alpha_bkw, n_global=None):
        z = z_in * torch.rsqrt(scale + eps)
        ctx.save_for_backward(z, var, weight, ema_gz)
        ctx.eps, ctx.alpha_bkw, ctx.has_bias = eps, alpha_bkw, bias is not None
        ctx.n_global = n_global  # tokens of the global batch (data-parallel: token means over all processes)
        y = z * weight if weight is not None else z.clone()
        return y + bias if bias is not None else y

    @staticmethod
    def backward(ctx, dy):
        z, var, weight, ema_gz = ctx.saved_tensors
        g = dy * weight if weight is not None else dy
        approx = g - (1.0 - ctx.alpha_bkw) * ema_gz * z
        with torch.no_grad():
            gz = (approx * z).mean(0) if ctx.n_global is None else global_sum0(approx * z) / ctx.n_global
            ema_gz.add_(gz.to(ema_gz.dtype))
        dx = approx * torch.rsqrt(var + ctx.eps)
        dw = (dy * z).sum(0) if weight is not None else None
        db = dy.sum(0) if ctx.has_bias else None
        return dx, dw, db, None, None, None, None, None, None


@register_norm("powernorm")
class PowerNorm(BatchStatNorm):
    """PowerNorm: ``y = weight * GS(x) / sqrt(s + eps) + bias``, no mean subtraction.

    Paper: Shen, Yao, Gholami, Mahoney & Keutzer 2020, "PowerNorm: Rethinking Batch Normalization in
    Transformers", ICML 2020, arXiv:2003.07845 (code: github.com/sIncerass/powernorm, ``mask_powernorm.py``).

    - ``GS`` (group scaling, per token): split ``dim`` into ``groups`` groups and divide each by
      ``sqrt(mean_group(x^2) + 1e-5)`` (the 1e-5 is fixed, as in the authors' code). ``groups`` defaults to 1
      (the whole vector, as the authors' module default); the paper's transformer setting uses the number of
      attention heads -- set ``norm_options: {groups: <heads>}``. ``dim`` must divide evenly.
    - Train (after GS): ``var [dim] = mean over all B*T (non-padding) tokens of x^2``. At optimizer step ``t``
      (1-based, ``step`` buffer) ``s = var`` while ``t <= warmup``, else ``s = phi`` (the running value before
      this batch's update). ``phi`` update, per training forward ``n`` (``num_batches``): while ``t < warmup``
      first the cumulative mean ``phi = phi (n-1)/n + var/n``; then always ``phi = alpha_fwd phi + (1-alpha_fwd)
      var`` (both exactly as the authors' code: during warm-up the EMA is applied after the cumulative mean).
      Under ``torch.compile`` ``n`` and ``t`` are device tensors and both choices are ``torch.where`` (same values).
    - Backward: the approximate gradient of :class:`PowerFunction` (buffer ``ema_gz [dim]``, zeros); the batch
      ``var`` is treated as a constant, gradients flow through GS by ordinary autograd.
    - Eval: ``weight * GS(x) / sqrt(phi + eps) + bias`` -- a fixed per-channel map, causal.

    Options: ``groups`` (1), ``warmup`` (0 optimizer steps; normlab's training loop passes
    ``train.warmup_steps`` unless set, the paper ties it to the LR warm-up), ``alpha_fwd`` (0.9), ``alpha_bkw``
    (0.9). Buffers: ``phi [dim]`` (ones), ``ema_gz [dim]``, counters. Train-mode outputs mix positions and
    sequences (batch statistics, the published method); see ``normlab.norms.batchstat`` for counting and masks.
    Shapes: ``[..., dim] -> [..., dim]``; ``mask [...]`` optional (True = real token; used for ``var`` only, as
    the authors' ``mask_x``; the backward means run over all positions, as theirs).
    """

    needs_warmup = True  # its "warmup" option defaults to train.warmup_steps (apply_norm_defaults)
    paper = "Shen et al. 2020, PowerNorm: Rethinking Batch Normalization in Transformers (arXiv:2003.07845)"
    description = "group scaling, then divide by the batch quadratic mean (running after warm-up), approximate backward"

    _var_buffer = "phi"
    flops_per_element = 6  # group scaling (square, sum, multiply), square and sum for the batch moment, multiply

    def __init__(self, dim: int, *, eps: float = 1e-5, affine: bool = True, bias: bool = True,
                 groups: int = 1, warmup: int = 0, alpha_fwd: float = 0.9, alpha_bkw: float = 0.9):
        super().__init__(dim, eps=eps, affine=affine, bias=bias)
        if groups < 1 or dim % groups:
            raise NormlabError(f"norm 'powernorm' option groups ({groups}) must be >= 1 and divide the width ({dim})")
        if warmup < 0:
            raise NormlabError(f"norm 'powernorm' option warmup must be >= 0, got {warmup}")
        self.groups, self.warmup = int(groups), int(warmup)
        self.alpha_fwd, self.alpha_bkw = float(alpha_fwd), float(alpha_bkw)
        self.register_buffer("phi", torch.ones(dim))
        self.register_buffer("ema_gz", torch.zeros(dim))

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        xs = NF.group_scaling(x, self.groups, GROUP_EPS)
        if not self.training:
            return self._affine(xs * torch.rsqrt(self.phi.to(xs.dtype) + self.eps))
        n, t = self._advance()  # Python ints, or 0-dim device tensors under torch.compile (then pick: torch.where)
        flat = xs.reshape(-1, self.dim)
        with torch.no_grad():
            var = global_token_mean(flat.detach().pow(2), None if mask is None else mask.reshape(-1))
            (scale,) = pinned(pick(t <= self.warmup, var, self.phi.to(var.dtype).clone()))  # phi before its update
            phi = self.phi
            if isinstance(t, torch.Tensor) or t < self.warmup:
                nf = n.to(phi.dtype) if isinstance(n, torch.Tensor) else n
                phi.copy_(pick(t < self.warmup, phi * ((nf - 1) / nf) + var.to(phi.dtype) / nf, phi))
            phi.copy_(self.alpha_fwd * phi + (1.0 - self.alpha_fwd) * var.to(phi.dtype))
        n_global = global_count(flat.shape[0], flat) if sync_group() is not None else None
        y = PowerFunction.apply(flat, self.weight, self.bias, scale, var, self.ema_gz, self.eps, self.alpha_bkw,
                                n_global)
        return y.reshape(x.shape)

    def extra_repr(self) -> str:
        return (super().extra_repr() + f", groups={self.groups}, warmup={self.warmup}, "
                f"alpha_fwd={self.alpha_fwd}, alpha_bkw={self.alpha_bkw}")
