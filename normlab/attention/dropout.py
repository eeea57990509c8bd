"""Dropout that a stacked group can feed with each member's own masks (Srivastava et al. 2014, "Dropout: A Simple
Way to Prevent Neural Networks from Overfitting", JMLR 15): ``x * m / (1 - p)``, ``m ~ Bernoulli(1 - p)`` per
element, drawn from torch's global RNG.

Every dropout of the model goes through this module: :class:`Dropout` (embedding, residual-branch and MLP dropout,
``x [...]``), :func:`dropout` (attention probabilities on the explicit path, ``a [B, H, Tq, Tk]``) and :func:`sdpa`
(``F.scaled_dot_product_attention`` with ``dropout_p``). Outside a stacked step each is exactly the torch call it
wraps (``F.dropout``, ``F.scaled_dot_product_attention``): a run's numbers do not change.

A stacked group (``normlab.train.stacked``) runs its K members' forward once under ``torch.func.vmap``, where a
member cannot draw from its own RNG stream. On a CPU a dropout call draws its mask with one
``bernoulli_(1 - p)`` over the call's elements -- ``F.dropout`` computes ``x * empty_like(x).bernoulli_(1 - p)
.div_(1 - p)``, and SDPA runs its math kernel when ``dropout_p > 0``, which does the same on the probabilities
``[B, H, Tq, Tk]`` -- and for a contiguous tensor torch's CPU Bernoulli draws depend on the generator's state and
the element count only, not the dtype (tests/attention/test_dropout.py checks both against torch; a non-contiguous
input, filled in memory order by the default kernel, is refused when recorded). So the group

1. records the dropout calls of one forward (:func:`recorded`: shape, dtype and ``p`` of each, in call order),
2. draws each member's noise for every call with that member's own RNG state, in that order (:func:`draw_noise`:
   the masks its forward alone would draw, bit for bit),
3. hands them to the calls inside the vmapped forward (:func:`supplied`: call ``i`` gets noise ``i`` ``[*shape]``,
   the member's slice of ``[K, *shape]``). The attention-probability call then takes the explicit path
   ``softmax(q k^T / sqrt(d) + mask) * noise @ v``, equal to SDPA's math kernel to round-off.

On CUDA the fused kernels (``F.dropout``'s and SDPA's flash / memory-efficient ones) draw with Philox offsets that a
draw outside them does not reproduce, so ``normlab.train.stacked`` trains runs with dropout alone there.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class _Calls:
    """The active recording (``noise is None``: each call's ``(shape, dtype, p)`` is appended to ``sites``) or
    supply (``noise``: the tensors handed out in order, ``next`` the index of the next one)."""

    sites: list[tuple[tuple[int, ...], torch.dtype, float]] = field(default_factory=list)
    noise: list[torch.Tensor] | None = None
    next: int = 0

    def take(self, shape: torch.Size, dtype: torch.dtype, p: float, contiguous: bool = True) -> torch.Tensor | None:
        """Record a call (returns None) or hand out its noise (checked against the recorded call). A non-contiguous
        input is refused: torch's CPU Bernoulli kernel fills ``empty_like(x)`` in memory order, so its mask would not
        be the contiguous draw's."""
        if self.noise is None:
            if not contiguous:
                raise RuntimeError(f"dropout on a non-contiguous input of shape {tuple(shape)}: its mask cannot be "
                                   "drawn outside the call")
            self.sites.append((tuple(shape), dtype, p))
            return None
        i = self.next
        if i >= len(self.noise) or tuple(self.noise[i].shape) != tuple(shape):
            raise RuntimeError(f"dropout call {i} of shape {tuple(shape)} does not match the recorded calls "
                               f"({len(self.noise)} of them); the forward's dropout calls changed between steps")
        self.next = i + 1
        return self.noise[i]


_ACTIVE: list[_Calls] = []  # innermost last


@contextlib.contextmanager
def recorded() -> Iterator[list[tuple[tuple[int, ...], torch.dtype, float]]]:
    """Within: every dropout call in training mode with ``p > 0`` is noted ``(shape, dtype, p)`` in call order and
    drops nothing (the yielded list fills as the forward runs)."""
    calls = _Calls()
    _ACTIVE.append(calls)
    try:
        yield calls.sites
    finally:
        _ACTIVE.remove(calls)


@contextlib.contextmanager
def supplied(noise: list[torch.Tensor]) -> Iterator[None]:
    """Within: dropout call ``i`` (training mode, ``p > 0``) multiplies by ``noise[i]`` instead of drawing; the
    number of calls must be ``len(noise)``."""
    calls = _Calls(noise=list(noise))
    _ACTIVE.append(calls)
    try:
        yield
        if calls.next != len(calls.noise):
            raise RuntimeError(f"the forward made {calls.next} dropout calls, {len(calls.noise)} were recorded")
    finally:
        _ACTIVE.remove(calls)


def draw_noise(sites: list[tuple[tuple[int, ...], torch.dtype, float]], device: str | torch.device
               ) -> list[torch.Tensor]:
    """Each recorded call's noise ``m / (1 - p)`` (``[*shape]``, the call's dtype) from the global RNG, in call
    order: ``F.dropout``'s own draw (``empty_like(x).bernoulli_(1 - p).div_(1 - p)``)."""
    return [torch.empty(shape, dtype=dtype, device=device).bernoulli_(1 - p).div_(1 - p)
            for shape, dtype, p in sites]


def _active(p: float, training: bool) -> _Calls | None:
    return _ACTIVE[-1] if _ACTIVE and training and p > 0 else None


def dropout(x: torch.Tensor, p: float, training: bool, inplace: bool = False) -> torch.Tensor:
    """``F.dropout(x, p, training, inplace)``; under :func:`recorded` / :func:`supplied` the recorded or supplied
    noise. ``x [...] -> [...]``."""
    calls = _active(p, training)
    if calls is None:
        return F.dropout(x, p, training, inplace)
    noise = calls.take(x.shape, x.dtype, p, x.is_contiguous())
    return x if noise is None else x * noise


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, attn_mask: torch.Tensor | None = None,
         is_causal: bool = False, dropout_p: float = 0.0) -> torch.Tensor:
    """``F.scaled_dot_product_attention(q, k, v, attn_mask, dropout_p, is_causal)``; under :func:`supplied` with
    ``dropout_p > 0`` the explicit ``softmax(q k^T / sqrt(d) + mask) * noise @ v`` (the math kernel's computation,
    in fp32). ``q [B, H, Tq, d]``, ``k, v [B, H, Tk, d]`` -> ``[B, H, Tq, d]``; ``attn_mask`` boolean (True: may
    attend) or additive, broadcast to ``[B, H, Tq, Tk]``."""
    calls = _active(dropout_p, True)
    if calls is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal)
    shape = (*q.shape[:-1], k.shape[-2])
    noise = calls.take(torch.Size(shape), torch.float32, dropout_p)
    if noise is None:  # recording: the call's shape is noted; its output only needs the right shape
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal)
    device = q.device.type
    if torch.is_autocast_enabled(device):  # SDPA's inputs as autocast hands them over; its math in fp32, as SDPA's
        dtype = torch.get_autocast_dtype(device)
        q, k, v = (t.to(dtype) for t in (q, k, v))
        if attn_mask is not None and attn_mask.is_floating_point():  # autocast casts an additive mask too
            attn_mask = attn_mask.to(dtype)
        with torch.autocast(device, enabled=False):
            return _explicit(q, k, v, attn_mask, is_causal, noise)
    return _explicit(q, k, v, attn_mask, is_causal, noise)


def _explicit(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None, is_causal: bool,
              noise: torch.Tensor) -> torch.Tensor:
    """``softmax(q k^T / sqrt(d) + mask) * noise @ v`` in fp32, returned in ``v``'s dtype (``[B, H, Tq, d]``)."""
    shape = noise.shape
    s = (q.float() @ k.float().transpose(-2, -1)) / math.sqrt(q.shape[-1])
    if is_causal:
        allowed = torch.ones(shape[-2], shape[-1], dtype=torch.bool, device=q.device).tril()  # SDPA's: top-left
        s = s.masked_fill(~allowed, float("-inf"))
    elif attn_mask is not None:
        s = s.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool else s + attn_mask.float()
    a = torch.softmax(s, dim=-1) * noise
    return (a @ v.float()).to(v.dtype)


class Dropout(nn.Dropout):
    """``torch.nn.Dropout`` through :func:`dropout` (same module, same state dict). ``x [...] -> [...]``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training, self.inplace)
