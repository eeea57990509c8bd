"""The one training step of normlab: forward, loss and backward over a step's micro-batches, for a run alone
(``normlab.train.loop``), a member of a stacked group stepping alone and a stacked group stepping together
(``normlab.train.stacked``), and the stackability trial. Each caller is a *strategy* that supplies one micro-batch
at a time -- its inputs on the device, its forward, each member's targets, and what wraps the pass (DDP's
``no_sync``, a member's own RNG stream, a compile fallback) -- and this module does the rest, the same way for all::

    logits = forward(x)                              [B, T, V] (one run)  or  [K, B, T, V] (a group of K members)
    loss_k, parts_k = lm_loss(logits_k.float(), y_k) for each member k
    (sum_k loss_k * weight / grad_accum).backward()  member k's parameters get the gradient of its own loss alone

and over the micro-batches each member's summed cross-entropy (``ce`` x ``weight``) and mean extra loss terms
(z-loss, LogitNorm; x ``weight / grad_accum``) as 0-dim float64 tensors on the device, read by the caller at a read
point. ``weight``: the factor on the mean loss (a data-parallel rank's share of the global batch, else 1.0).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from normlab.train.losses import lm_loss
from normlab.train.precision import autocast, nondeterministic_op_error

Parts = dict[str, torch.Tensor]
StepLosses = tuple[Any, dict[str, Any]]  # (summed cross-entropy, mean extra terms): 0-dim float64 device tensors


def compile_failure(e: BaseException) -> bool:
    """Whether ``e``, raised by the first call of a ``torch.compile``d forward (or the backward AOTAutograd compiles
    when it first runs), is a failure to compile that running eager avoids: any Exception but an out-of-memory error
    and an operation without a deterministic kernel (eager would fail the same way)."""
    return (isinstance(e, Exception) and not isinstance(e, torch.OutOfMemoryError)
            and nondeterministic_op_error(e) is None)


def forward_loss(model: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, y: torch.Tensor, tc: Any,
                 device: str) -> tuple[torch.Tensor, Parts]:
    """A run's forward under its autocast and its ``lm_loss`` (fp32) against ``y``: the function a compiled run
    alone compiles whole (``torch.compile(forward_loss)``: model and loss in one graph, the logits never leave it)."""
    with autocast(device, tc.precision):
        logits = model(x)
    return lm_loss(logits.float(), y, z_loss=tc.z_loss, logitnorm_tau=tc.logitnorm_tau)


def micro_backward(forward: Callable[[], torch.Tensor] | None, ys: list[torch.Tensor | None], tc: Any, device: str,
                   *, weight: float = 1.0, observe: Callable[[torch.Tensor, torch.Tensor], None] | None = None,
                   fused: Callable[[], tuple[torch.Tensor, Parts]] | None = None) -> list[Parts | None]:
    """One micro-batch: ``forward()`` under the run's autocast (``tc.precision``) gives the logits of one run
    (``[B, T, V]``, ``ys`` of one ``[B, T]``) or of a stacked group (``[K, B, T, V]``, ``ys`` of K; None for a
    masked slot, which gets no loss); each member's ``lm_loss`` (fp32), ``observe(logits, y)`` of a run's
    diagnostics (None: nothing observes), and one backward of the sum of the members' losses x
    ``weight / tc.grad_accum``. ``fused``: instead of ``forward``, one run's loss and parts at once (a compiled
    :func:`forward_loss`). Returns each member's ``lm_loss`` parts (None for a masked slot)."""
    if fused is not None:
        losses = [fused()]
    else:
        with autocast(device, tc.precision):
            logits = forward()
        losses = []
        for k, y in enumerate(ys):
            if y is None:
                losses.append(None)
                continue
            member = logits if len(ys) == 1 and logits.dim() == y.dim() + 1 else logits[k]
            losses.append(lm_loss(member.float(), y, z_loss=tc.z_loss, logitnorm_tau=tc.logitnorm_tau))
            if observe is not None:
                observe(member, y)  # diag: Softmax Collapse counts (diagnostic steps only)
    total: Any = None
    for lp in losses:
        if lp is not None:
            term = lp[0] * weight / tc.grad_accum
            total = term if total is None else total + term
    total.backward()
    return [lp[1] if lp is not None else None for lp in losses]


def add_parts(sums: list[StepLosses], parts: list[Parts], weight: float, grad_accum: int) -> list[StepLosses]:
    """``sums`` (one entry per member) with one micro-batch's ``parts`` added: ``ce x weight`` to the summed
    cross-entropy, each extra term ``x weight / grad_accum`` to its mean."""
    out = []
    for (loss_sum, extra), p in zip(sums, parts):
        p = dict(p)
        loss_sum = loss_sum + p.pop("ce").double() * weight
        extra = dict(extra)
        for key, v in p.items():
            extra[key] = extra.get(key, 0.0) + v.double() * weight / grad_accum
        out.append((loss_sum, extra))
    return out


def forward_backward(micro: Callable[[int], list[Parts]], members: int, grad_accum: int, weight: float = 1.0
                     ) -> list[StepLosses]:
    """The step: ``micro(i)`` for ``i`` in ``range(grad_accum)`` (the strategy's micro-batch ``i`` through
    :func:`micro_backward`), each member's losses summed over them (:func:`add_parts`)."""
    sums: list[StepLosses] = [(0.0, {}) for _ in range(members)]
    for i in range(grad_accum):
        sums = add_parts(sums, micro(i), weight, grad_accum)
    return sums
