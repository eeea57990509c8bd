"""Batch-statistic norms: the shared base (counters, step detection, masks) and BatchNorm over tokens.

PowerNorm (``powernorm.py``) and Unified Normalization (``unified.py``) build on :class:`BatchStatNorm`.

What every batch-statistic norm here guarantees:

- **Training** normalises with statistics taken over every (non-padding) token of the batch, ``B*T`` of them.
  That mixes positions and sequences: a token's output depends on later tokens and on other sequences of the
  batch. This is the published method; the causal-LM loss still trains, but train-mode outputs are not causal.
- **Evaluation** (``module.eval()``) uses running statistics only: a fixed per-channel affine map, so outputs are
  causal and a sequence's output does not depend on the rest of the batch.
- Running statistics and counters change only in training mode; all of them are persistent buffers (saved by
  ``state_dict``/safetensors), counters are int64, so a resumed run continues bit-exactly.
- **Gradient accumulation**: every training forward is one batch for the statistics (running averages, ring
  buffers) -- as in torch's BatchNorm. Warm-up lengths count *optimizer steps* (``step`` buffer): a training
  forward starts a new step when the norm's ``weight.grad`` is None (the state after ``optimizer.zero_grad()``,
  torch's default ``set_to_none=True``, which normlab's loop uses) or when ``weight`` was changed in place since
  the previous forward (a non-fused optimizer's update, which also covers ``zero_grad(set_to_none=False)``).
  The 2nd..k-th micro-batches of a step, which accumulate into an existing gradient of an unchanged weight,
  do not advance ``step``. Without a weight (``affine=False``) every training forward counts as a step.
- ``forward(x, mask=None)``: optional ``mask`` of shape ``x.shape[:-1]`` (True = real token, False = padding)
  restricts the batch statistics to real tokens. normlab's LMs have no padding and never pass one.
- **Data-parallel training** (``normlab.train.distributed``): after :func:`set_sync_group` every statistic over the
  batch's tokens -- forward (mean, variance, quadratic mean) and the token means inside PowerNorm's and Unified
  Norm's backward -- is taken over the *global* batch of all processes by all-reducing sums and counts, as
  ``torch.nn.SyncBatchNorm`` (Ioffe & Szegedy's statistics over the whole mini-batch). The function the model
  computes is then the same whatever the number of processes. Without a group (one process) nothing changes.
- **torch.compile**: a compiled training forward reads nothing on the host and is not recompiled as the counters grow:
  they stay 0-dim device tensors and the choices that depend on them (warm-up, window, ring-buffer slot) are tensor
  operations (:func:`pick`, :func:`put_row`); eager forwards keep Python ints (bit for bit the numbers of before).
  Compiled, a step is new when ``weight.grad`` is None or the weight's values changed since the previous compiled
  forward (:meth:`BatchStatNorm._advance_on_device`); values the custom backward passes read go through
  :func:`pinned`.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from normlab.norms import functional as NF
from normlab.norms.modules import _AffineNorm
from normlab.norms.registry import register_norm

_SYNC_GROUP = None  # torch.distributed process group for global batch statistics (None: this process's batch)


def set_sync_group(group) -> None:
    """Take batch statistics over every process of ``group`` (a ``torch.distributed`` process group), or over this
    process's batch only (``None``, the default). Called by ``normlab.train.distributed``."""
    global _SYNC_GROUP
    _SYNC_GROUP = group


def sync_group():
    """The current process group of the batch statistics, or None."""
    return _SYNC_GROUP


def _all_sum(t: torch.Tensor) -> torch.Tensor:
    """Sum of ``t`` over the sync group (in place, no autograd)."""
    dist.all_reduce(t, group=_SYNC_GROUP)
    return t


def global_token_mean(x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """``NF.token_mean`` over the global batch (no gradient): per-channel mean of ``x [..., d]`` over every
    (real) token of every process of the sync group -> ``[d]``."""
    if _SYNC_GROUP is None:
        return NF.token_mean(x, mask)
    flat = x.reshape(-1, x.shape[-1])
    if mask is None:
        s, n = flat.sum(0), flat.new_full((1,), flat.shape[0])
    else:
        m = mask.reshape(-1, 1).to(flat.dtype)
        s, n = (flat * m).sum(0), m.sum().reshape(1)
    both = _all_sum(torch.cat([s, n]))
    return both[:-1] / both[-1].clamp_min(1.0)


def pick(cond: bool | torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a if cond else b`` for a Python ``bool`` (eager: one of the two tensors itself); ``torch.where(cond, a, b)``
    for a 0-dim bool tensor (a choice that depends on a counter under ``torch.compile``, made on the device)."""
    if isinstance(cond, torch.Tensor):
        return torch.where(cond, a, b)
    return a if cond else b


def put_row(buf: torch.Tensor, slot: int | torch.Tensor, row: torch.Tensor) -> None:
    """``buf[slot] = row`` for a ring buffer ``buf [window, dim]`` and ``row [dim]``: ``slot`` a Python int (eager) or
    a 0-dim int64 tensor (under ``torch.compile``: ``index_copy_``, no host read of the index)."""
    if isinstance(slot, torch.Tensor):
        buf.index_copy_(0, slot.reshape(1), row.to(buf.dtype).unsqueeze(0))
    else:
        buf[slot].copy_(row.to(buf.dtype))


@torch.library.custom_op("normlab::batchstat_pin", mutates_args=())
def _pin(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    return [t.clone() for t in tensors]


@_pin.register_fake
def _pin_fake(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    return [torch.empty_like(t) for t in tensors]


def pinned(*values):
    """``values`` as they are in eager mode; under ``torch.compile`` copies of the tensors among them (other values
    as they are) that the compiled backward reads as computed in this forward.

    A batch-statistic norm's forward reads buffers it then updates in place (PowerNorm's ``phi``, Unified Norm's
    ``running_var``, ring buffer and counters), and its custom backward uses values computed from those reads (the
    scale ``z`` was divided by, the compensation ratio, the slot, the warm-up choices). AOTAutograd's min-cut
    partitioner (torch 2.13) may recompute such a value in the backward from the buffer instead of saving it -- after
    the update, so from the new contents: the compiled gradients were wrong (measured: PowerNorm after its warm-up,
    ``dx`` off by about 1e-3 of its size). A custom operator is never recomputed, so its outputs are saved."""
    if not torch.compiler.is_compiling():
        return values
    idx = [i for i, v in enumerate(values) if isinstance(v, torch.Tensor)]
    copies = iter(_pin([values[i] for i in idx]))
    return tuple(next(copies) if isinstance(v, torch.Tensor) else v for v in values)


def global_count(n: int, ref: torch.Tensor) -> float | torch.Tensor:
    """Number of tokens ``n`` summed over the sync group (``n`` itself without one): a 0-dim float64 tensor on
    ``ref``'s device, never read on the host (a GPU keeps running). Dividing a float32 ``[d]`` tensor by it
    divides in float32, as by the Python float it was before (a 0-dim tensor does not promote a dimensioned one;
    a count below 2^24 is exact in both)."""
    if _SYNC_GROUP is None:
        return float(n)
    return _all_sum(ref.new_full((1,), float(n), dtype=torch.float64)).reshape(())


def global_sum0(t: torch.Tensor) -> torch.Tensor:
    """``t.sum(0)`` summed over the sync group (no autograd; used inside custom backward passes)."""
    s = t.sum(0)
    return _all_sum(s) if _SYNC_GROUP is not None else s


class BatchStatNorm(_AffineNorm):
    """Base: per-channel ``weight [dim]`` (ones), ``bias [dim]`` (zeros) from ``_AffineNorm``, plus int64 counters
    ``num_batches`` (training forwards) and ``step`` (optimizer steps, detected as described in the module
    docstring)."""

    def __init__(self, dim: int, *, eps: float = 1e-5, affine: bool = True, bias: bool = True):
        super().__init__(dim, eps=eps, affine=affine, bias=bias)
        self.register_buffer("num_batches", torch.zeros((), dtype=torch.long))
        self.register_buffer("step", torch.zeros((), dtype=torch.long))
        self._seen_version: int | None = None  # weight._version at the last training forward (not state)
        self._counts: tuple | None = None  # host copies of the counters (not state): see _advance
        # the weight at the last compiled forward (not state; NaN: the first forward is a new step); see _apply
        self._seen_weight = None if self.weight is None else torch.full_like(self.weight.detach(), float("nan"))

    def _advance(self) -> tuple[int, int] | tuple[torch.Tensor, torch.Tensor]:
        """Count one training forward; returns ``(num_batches, step)`` after counting (both 1-based): Python ints in
        eager mode, the 0-dim int64 buffers themselves under ``torch.compile`` (see :meth:`_advance_on_device`).

        The counters are buffers (on the model's device, saved with it), but the eager warm-up and ring-buffer logic
        needs them as Python ints: this keeps host copies beside them, counted with them, so a forward reads nothing
        from the device (one read per norm per forward before: a wait for the GPU). The copies are re-read from the
        buffers whenever those were replaced or changed outside this method (``load_state_dict``, ``.to()``, a
        test's ``fill_``, a compiled forward: the buffer's identity or its in-place version counter differs from the
        ones recorded)."""
        if torch.compiler.is_compiling():
            return self._advance_on_device()
        new_step = True
        w = self.weight
        if w is not None:
            version = w._version
            new_step = w.grad is None or version != self._seen_version
            self._seen_version = version
        nb, st = self.num_batches, self.step
        with torch.no_grad():
            nb.add_(1)
            if new_step:
                st.add_(1)
        c = self._counts
        if c is not None and c[2] is nb and c[3] is st and c[4] == nb._version - 1 and c[5] == st._version - new_step:
            n, s = c[0] + 1, c[1] + new_step
        else:  # first forward, or the buffers were loaded, moved or set: read them once
            n, s = int(nb), int(st)
        self._counts = (n, s, nb, st, nb._version, st._version)
        return n, s

    def _advance_on_device(self) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`_advance` under ``torch.compile``: the counters stay device tensors and the caller's warm-up and
        ring-buffer choices become tensor operations (:func:`pick`, :func:`put_row`), so the compiled forward reads
        nothing on the host, has no graph break and is not recompiled as the counts grow (a Python int would be
        guarded on). A new optimizer step is detected as in eager mode from ``weight.grad is None`` (a guard: one
        compiled variant for each case), and otherwise from the weight's *values*: a compiled graph has no version
        counter, so the weight is compared with a copy taken at the previous compiled forward (``_seen_weight``, not
        state) -- a change in place that leaves every value as it was (an update of exactly zero) is not a new step
        here. A model that alternates eager and compiled forwards should do so at optimizer steps, with
        ``zero_grad(set_to_none=True)`` as normlab's loop does (each mode keeps its own record of the weight)."""
        w, seen = self.weight, self._seen_weight
        nb, st = self.num_batches, self.step
        with torch.no_grad():
            nb.add_(1)
            same = (w is not None and seen is not None
                    and (seen.shape, seen.dtype, seen.device) == (w.shape, w.dtype, w.device))
            if w is None or w.grad is None or not same:  # not same: the weight was replaced (assign=True)
                st.add_(1)
            else:
                st.add_((w != seen).any())
            if same:
                seen.copy_(w)
            elif w is not None:
                self._seen_weight = w.detach().clone()
        return nb, st

    def _apply(self, fn, recurse=True):
        """``nn.Module._apply`` (``.to()``, ``.double()``, ``.cuda()``), which also moves / casts ``_seen_weight``: a
        plain attribute (not a buffer: not state, not in ``named_buffers``) kept beside the weight, so that the
        compiled forward finds it where the weight is and is not compiled a second time for a new one."""
        super()._apply(fn, recurse)
        if self._seen_weight is not None:
            self._seen_weight = fn(self._seen_weight)
        return self

    def _affine(self, z: torch.Tensor) -> torch.Tensor:
        if self.weight is not None:
            z = z * self.weight
        return z + self.bias if self.bias is not None else z

    # --- eval-mode folding protocol (used by ``normlab convert --to folded``) ---
    _var_buffer = "running_var"  # per-channel second-moment / variance buffer used at eval
    _mean_buffer: str | None = None  # per-channel mean buffer subtracted at eval (BatchNorm only)

    @torch.no_grad()
    def eval_affine(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(scale [dim], shift [dim])`` with ``norm(x) == core(x) * scale + shift`` in eval mode
        (core: identity, or PowerNorm's group scaling)."""
        var = getattr(self, self._var_buffer)
        s = torch.rsqrt(var + self.eps)
        w = self.weight if self.weight is not None else torch.ones_like(s)
        b = self.bias if self.bias is not None else torch.zeros_like(s)
        mean = getattr(self, self._mean_buffer) if self._mean_buffer else torch.zeros_like(s)
        return s * w, b - mean * s * w

    @torch.no_grad()
    def reset_eval_affine_(self) -> None:
        """Make the eval-mode norm compute just its core (after its affine was folded elsewhere)."""
        getattr(self, self._var_buffer).fill_(1.0 - self.eps)
        if self._mean_buffer:
            getattr(self, self._mean_buffer).zero_()
        if self.weight is not None:
            self.weight.fill_(1.0)
        if self.bias is not None:
            self.bias.zero_()


@register_norm("batchnorm")
class BatchNorm(BatchStatNorm):
    """BatchNorm over tokens: ``(x - mean) / sqrt(var + eps) * weight + bias`` with per-channel statistics over all
    ``B*T`` (non-padding) tokens in training and the running statistics in evaluation.

    Paper: Ioffe & Szegedy 2015, "Batch Normalization", arXiv:1502.03167 -- applied to ``[B*T, dim]`` as in
    ``torch.nn.BatchNorm1d``: biased variance to normalise, unbiased variance for ``running_var``,
    ``running = (1 - momentum) * running + momentum * batch`` (``momentum`` default 0.1, torch's convention).
    Buffers ``running_mean [dim]`` (zeros), ``running_var [dim]`` (ones). The naive baseline that PowerNorm and
    Unified Normalization improve on. Train: batch statistics mix positions and sequences (see module docstring).
    Shapes: ``[..., dim] -> [..., dim]``.
    """

    paper = "Ioffe & Szegedy 2015, Batch Normalization (arXiv:1502.03167), statistics over all tokens"
    description = "subtract the batch mean, divide by the batch std over all tokens; running stats at eval"

    _mean_buffer = "running_mean"
    flops_per_element = 5  # as LayerNorm, the statistics taken over tokens instead of channels

    def __init__(self, dim: int, *, eps: float = 1e-5, affine: bool = True, bias: bool = True,
                 momentum: float = 0.1):
        super().__init__(dim, eps=eps, affine=affine, bias=bias)
        self.momentum = float(momentum)
        self.register_buffer("running_mean", torch.zeros(dim))
        self.register_buffer("running_var", torch.ones(dim))

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        if not self.training:
            return F.batch_norm(x.reshape(-1, self.dim), self.running_mean, self.running_var, self.weight,
                                self.bias, False, 0.0, self.eps).reshape(x.shape)
        self._advance()
        if _SYNC_GROUP is not None:
            return self._forward_sync(x, mask)
        if mask is None:
            return F.batch_norm(x.reshape(-1, self.dim), self.running_mean, self.running_var, self.weight,
                                self.bias, True, self.momentum, self.eps).reshape(x.shape)
        mean = NF.token_mean(x, mask)
        var = NF.token_mean((x - mean) ** 2, mask)
        with torch.no_grad():
            n = mask.sum().clamp_min(2).to(var.dtype)
            self.running_mean.lerp_(mean.detach().to(self.running_mean.dtype), self.momentum)
            self.running_var.lerp_((var.detach() * n / (n - 1)).to(self.running_var.dtype), self.momentum)
        return self._affine((x - mean) * torch.rsqrt(var + self.eps))

    def _forward_sync(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """Training forward with statistics over the global batch: sums and counts go through the differentiable
        ``torch.distributed.nn.all_reduce`` (its backward all-reduces the gradients, as SyncBatchNorm's does)."""
        from torch.distributed.nn.functional import all_reduce

        flat = x.reshape(-1, self.dim)
        m = (torch.ones(flat.shape[0], 1, dtype=flat.dtype, device=flat.device) if mask is None
             else mask.reshape(-1, 1).to(flat.dtype))
        n = all_reduce(m.sum().reshape(1).detach(), group=_SYNC_GROUP)
        mean = all_reduce((flat * m).sum(0), group=_SYNC_GROUP) / n
        var = all_reduce((((flat - mean) ** 2) * m).sum(0), group=_SYNC_GROUP) / n
        with torch.no_grad():
            nn_ = n.clamp_min(2)
            self.running_mean.lerp_(mean.detach().to(self.running_mean.dtype), self.momentum)
            self.running_var.lerp_((var.detach() * nn_ / (nn_ - 1)).to(self.running_var.dtype), self.momentum)
        return self._affine((flat - mean) * torch.rsqrt(var + self.eps)).reshape(x.shape)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", momentum={self.momentum}"
