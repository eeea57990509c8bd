"""Pieces shared by every attention kind: the input / output projections, head split, causal masks with a decoding
offset, and the per-layer incremental-decoding state.

Every attention module maps ``x [B, T, in_width] -> [B, T, out_width]`` with ``heads`` heads of ``head_dim =
width / heads``. ``in_width`` / ``out_width`` default to ``width``; the Pre-CRMSNorm model (normlab.model.crms)
reads and writes a residual stream stored in ``width - 1`` coordinates and passes ``width - 1`` for both, so no
attention kind needs a compressed-stream copy of its forward.

Parameter names shared by all kinds: ``qkv`` (``in_width -> 3 width``, layout ``[q | k | v]`` with heads contiguous
inside each) and ``proj`` (``width -> out_width``, the residual-stream writer).

Incremental decoding: ``forward(x, state)`` with an :class:`AttentionState` treats ``x`` as the ``T`` tokens that
follow the ``state.pos`` tokens already seen, reads and extends the state (KV cache or recurrent state) in place,
and advances ``state.pos``. ``forward(x)`` (no state) is the ordinary full-sequence causal forward.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from normlab.attention.dropout import Dropout


@dataclass
class AttentionState:
    """Decoding state of one attention layer: ``pos`` tokens seen, named tensors (KV cache or recurrent state).

    ``copy()`` is shallow: tensors are never modified in place (the attention replaces them), so a copied state
    and its original evolve independently.
    """

    pos: int = 0
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)

    def copy(self) -> "AttentionState":
        return AttentionState(self.pos, dict(self.tensors))


class AttentionBase(nn.Module):
    """``qkv`` and ``proj`` projections, head split/merge and residual dropout (no attention of its own)."""

    def __init__(self, width: int, heads: int, *, in_width: int | None = None, out_width: int | None = None,
                 bias: bool = False, dropout: float = 0.0):
        super().__init__()
        if width % heads:
            raise ValueError(f"width {width} must be divisible by heads {heads}")
        self.width, self.heads, self.head_dim = width, heads, width // heads
        self.in_width = width if in_width is None else in_width
        self.out_width = width if out_width is None else out_width
        self.qkv = nn.Linear(self.in_width, 3 * width, bias=bias)
        self.proj = nn.Linear(width, self.out_width, bias=bias)
        self.dropout = dropout
        self.resid_drop = Dropout(dropout)

    def split_heads(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``x [B, T, in_width] -> q, k, v`` each ``[B, H, T, head_dim]``."""
        B, T, _ = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        return q, k, v

    def merge_heads(self, y: torch.Tensor) -> torch.Tensor:
        """``y [B, H, T, head_dim] -> [B, T, width]``."""
        B, H, T, D = y.shape
        return y.transpose(1, 2).reshape(B, T, H * D)

    def out(self, y: torch.Tensor) -> torch.Tensor:
        """Output projection and residual dropout: ``[B, T, width] -> [B, T, out_width]``."""
        return self.resid_drop(self.proj(y))


def causal_mask(t_q: int, t_k: int, device: torch.device | None = None) -> torch.Tensor:
    """Boolean ``[t_q, t_k]``, True where query ``i`` may attend key ``j``: the ``t_q`` queries are the LAST ``t_q``
    positions of the ``t_k`` keys (query ``i`` sits at position ``t_k - t_q + i``), so ``j <= t_k - t_q + i``."""
    i = torch.arange(t_q, device=device)[:, None]
    j = torch.arange(t_k, device=device)[None, :]
    return j <= i + (t_k - t_q)


def append_kv(state: AttentionState | None, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """KV cache: ``k, v [B, H, T, hd]`` of the new tokens -> all keys and values so far (cache updated)."""
    if state is None:
        return k, v
    if "k" in state.tensors:
        k = torch.cat([state.tensors["k"], k], dim=2)
        v = torch.cat([state.tensors["v"], v], dim=2)
    state.tensors["k"], state.tensors["v"] = k, v
    return k, v
