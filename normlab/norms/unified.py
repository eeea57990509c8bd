"""Unified Normalization (Yang et al. 2022): windowed, geometric-mean-smoothed batch quadratic mean with gradient
compensation. Follows the authors' ``UN1d`` / ``UN2dFunction`` (hikvision-research/Unified-Normalization,
``neural_machine_translation/fairseq/modules/unified_normalization/unified_normalization.py``).
"""

from __future__ import annotations

import torch

from normlab.errors import NormlabError
from normlab.norms import functional as NF
from normlab.norms.batchstat import (BatchStatNorm, global_count, global_sum0, global_token_mean, pick, pinned,
                                     put_row, sync_group)
from normlab.norms.registry import register_norm

RATIO_MIN, RATIO_MAX = 1.0 / 5.0, 5.0  # gradient-compensation ratio clamp
COMPENSATION_AFTER = 1000  # r == 1 during the first max(1000, warmup) steps (authors' constant)


class UNFunction(torch.autograd.Function):
    """Training-mode UN on ``x [N, C]`` given the statistic ``var [C]`` and the compensation ratio ``r [C]``.

    Forward: ``z = x / sqrt(var + eps)``; ``y = weight * z + bias``. Backward (authors' ``UN2dFunction``)::

        g = dy * weight * r;  gz = mean_tokens(g * z);  buffer_gz[slot] = gz   (ema_gz if the batch was skipped)
        mean_gz = gz during the first `window` forwards / warm-up / a skipped batch, else mean(buffer_gz)
        ema_gz = momentum * ema_gz + (1 - momentum) * mean_gz
        dx = (g - ema_gz * z) / sqrt(var + eps)      (g - mean_gz * z for a skipped batch)
        dweight = sum(dy * r * z);  dbias = sum(dy)
    """

    @staticmethod
    def forward(ctx, x, weight, bias, var, r, ema_gz, buffer_gz, eps, momentum, slot, use_window, skip,
                n_global=None):
        z = x * torch.rsqrt(var + eps)
        ctx.n_global = n_global  # tokens of the global batch (data-parallel: token means over all processes)
        ctx.save_for_backward(z, var, r, weight, ema_gz, buffer_gz)
        ctx.eps, ctx.momentum, ctx.slot, ctx.use_window, ctx.skip = eps, momentum, slot, use_window, skip
        ctx.has_bias = bias is not None
        y = z * weight if weight is not None else z.clone()
        return y + bias if bias is not None else y

    @staticmethod
    def backward(ctx, dy):
        z, var, r, weight, ema_gz, buffer_gz = ctx.saved_tensors
        g = (dy * weight if weight is not None else dy) * r
        gz = (g * z).mean(0) if ctx.n_global is None else global_sum0(g * z) / ctx.n_global
        with torch.no_grad():
            put_row(buffer_gz, ctx.slot, pick(ctx.skip, ema_gz, gz))
            mean_gz = pick(ctx.use_window, buffer_gz.mean(0).to(gz.dtype), gz)
            ema_gz.copy_(ctx.momentum * ema_gz + (1.0 - ctx.momentum) * mean_gz.to(ema_gz.dtype))
        approx = g - pick(ctx.skip, mean_gz, ema_gz) * z
        dx = approx * torch.rsqrt(var + ctx.eps)
        dw = (dy * r * z).sum(0) if weight is not None else None
        db = dy.sum(0) if ctx.has_bias else None
        return dx, dw, db, None, None, None, None, None, None, None, None, None, None


@register_norm("unified")
class UnifiedNorm(BatchStatNorm):
    """Unified Normalization: ``y = weight * x / sqrt(v + eps) + bias``, no mean subtraction, with ``v`` a smoothed
    per-channel quadratic mean of recent batches.

    Paper: Yang, Wang, Xiao, Lin & Pu 2022, "Unified Normalization for Accelerating and Stabilizing Transformers",
    ACM MM 2022, arXiv:2208.01313 (code: github.com/hikvision-research/Unified-Normalization, ``UN1d``).

    Train, per training forward ``n`` (``num_batches``) at optimizer step ``t`` (``step``), both 1-based:

    - ``x2 [dim] = mean over all B*T (non-padding) tokens of x^2`` goes into slot ``n % window`` of the ring buffer
      ``buffer_x2 [window, dim]``.
    - Outlier filtration (option, off by default; the authors advise off for language): when ``t >= warmup`` and
      the buffer is full, if any channel's ``arithmetic - geometric mean`` of the buffer exceeds ``window *
      var(sqrt(buffer))`` (the scalar unbiased variance over the buffer before this batch), the slot gets
      ``running_var`` instead and the batch is "skipped" (``skip_counter`` += 1; statistics below use ``x2``).
      ``window=1`` always counts as skipped (plain batch statistics), as in the authors' code.
    - ``v = x2`` while ``n <= window`` or ``t < warmup`` or skipped, else the geometric mean of the buffer
      ``exp(mean(log buffer_x2))`` (fluctuation smoothing). ``running_var = momentum * running_var + (1 -
      momentum) * v`` (``momentum`` 0.9, the authors' convention: weight on the old value).
    - Gradient compensation ratio ``r = sqrt(v + eps) / sqrt(running_var + eps)`` (before this update), clamped
      to ``[1/5, 5]``, and exactly 1 while ``t <= max(1000, warmup)`` or skipped; backward of :class:`UNFunction`
      with ``ema_gz [dim]`` and the ring buffer ``buffer_gz [window, dim]``.
    - Under ``torch.compile`` ``n`` and ``t`` are device tensors: the slot is a tensor index (``index_copy_``) and
      every choice above (window, skip, ratio) a ``torch.where`` over the same values; nothing is read on the host.
      Eager, the counters are Python ints and the outlier test's skip a device bool: nothing is read either.

    Eval: ``weight * x / sqrt(running_var + eps) + bias`` -- a fixed per-channel affine that folds into the next
    linear, causal. Options: ``window`` (4), ``warmup`` (4000 optimizer steps in the paper; normlab's training loop
    passes ``train.warmup_steps`` unless set), ``outlier_filtration`` (False), ``momentum`` (0.9). The authors'
    separate forward/backward windows (a tuple) are one ``window`` here. Deviation: filtration also waits for a
    full buffer (the authors' code can compare against an all-zero buffer when ``warmup < window``). Train-mode
    outputs mix positions and sequences (the published method); see ``normlab.norms.batchstat`` for counting and
    masks (``mask`` restricts ``x2`` only; backward means run over all positions, as the authors').
    Shapes: ``[..., dim] -> [..., dim]``.
    """

    needs_warmup = True  # its "warmup" option defaults to train.warmup_steps (apply_norm_defaults)
    flops_per_element = 3  # square and sum for the batch moment, multiply by rsqrt (window: per channel, not counted)
    paper = "Yang et al. 2022, Unified Normalization for Accelerating and Stabilizing Transformers (arXiv:2208.01313)"
    description = ("divide by a windowed geometric mean of batch quadratic means; gradient compensation; "
                   "fixed affine at eval")

    def __init__(self, dim: int, *, eps: float = 1e-5, affine: bool = True, bias: bool = True, window: int = 4,
                 warmup: int = 4000, outlier_filtration: bool = False, momentum: float = 0.9):
        super().__init__(dim, eps=eps, affine=affine, bias=bias)
        if window < 1:
            raise NormlabError(f"norm 'unified' option window must be >= 1, got {window}")
        if warmup < 0:
            raise NormlabError(f"norm 'unified' option warmup must be >= 0, got {warmup}")
        if not 0.0 <= momentum < 1.0:
            raise NormlabError(f"norm 'unified' option momentum must be in [0, 1), got {momentum}")
        self.window, self.warmup = int(window), int(warmup)
        self.outlier_filtration, self.momentum = bool(outlier_filtration), float(momentum)
        self.register_buffer("running_var", torch.ones(dim))
        self.register_buffer("ema_gz", torch.zeros(dim))
        self.register_buffer("buffer_x2", torch.zeros(self.window, dim))
        self.register_buffer("buffer_gz", torch.zeros(self.window, dim))
        self.register_buffer("skip_counter", torch.zeros((), dtype=torch.long))

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        if not self.training:
            return self._affine(x * torch.rsqrt(self.running_var.to(x.dtype) + self.eps))
        n, t = self._advance()  # Python ints, or 0-dim device tensors under torch.compile (then pick: torch.where)
        flat = x.reshape(-1, self.dim)
        slot = n % self.window
        on_device = isinstance(n, torch.Tensor)
        with torch.no_grad():
            x2 = global_token_mean(flat.detach().pow(2), None if mask is None else mask.reshape(-1))
            buf = self.buffer_x2
            skip = self.window <= 1
            check = self.outlier_filtration and not skip and (on_device or (t >= self.warmup and n > self.window))
            recorded_var = torch.var(torch.sqrt(buf)) if check else None  # before this batch enters
            put_row(buf, slot, x2)
            if check:
                diff = buf.mean(0) - NF.geometric_mean(buf, 0)
                outlier = (diff > recorded_var * self.window).any()
                # a device bool, never read on the host (eager: the counters' conditions hold, ``check`` said so)
                skip = outlier & (t >= self.warmup) & (n > self.window)
                put_row(buf, slot, pick(skip, self.running_var, x2.to(buf.dtype)))
                self.skip_counter.add_(skip)
            kept = skip.logical_not() if isinstance(skip, torch.Tensor) else not skip
            use_window = (n > self.window) & (t >= self.warmup) & kept
            var = pick(use_window, NF.geometric_mean(buf, 0).to(x2.dtype), x2)
            rv = self.running_var.to(var.dtype)
            r = torch.sqrt(var + self.eps) / torch.sqrt(rv + self.eps)
            r = pick((t <= max(COMPENSATION_AFTER, self.warmup)) | skip, torch.ones_like(r),
                     r.clamp(RATIO_MIN, RATIO_MAX))
            self.running_var.copy_(self.momentum * self.running_var + (1.0 - self.momentum) * var.to(rv.dtype))
        var, r, slot, use_window, skip = pinned(var, r, slot, use_window, skip)  # as of now, for the backward
        n_global = global_count(flat.shape[0], flat) if sync_group() is not None else None
        y = UNFunction.apply(flat, self.weight, self.bias, var, r, self.ema_gz, self.buffer_gz, self.eps,
                             self.momentum, slot, use_window, skip, n_global)
        return y.reshape(x.shape)

    def extra_repr(self) -> str:
        return (super().extra_repr() + f", window={self.window}, warmup={self.warmup}, "
                f"outlier_filtration={self.outlier_filtration}, momentum={self.momentum}")
