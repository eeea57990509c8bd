"""Causal softmax self-attention through ``torch.nn.functional.scaled_dot_product_attention``.

Vaswani et al. 2017, "Attention Is All You Need": ``softmax(q k^T / sqrt(d_head) + causal mask) v``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from normlab.attention.positions import RotaryEmbedding


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention. ``x [B, T, d] -> [B, T, d]``.

    Parameters: ``qkv`` (``d -> 3d``), ``proj`` (``d -> d``, a residual-stream writer).
    """

    def __init__(self, width: int, heads: int, *, bias: bool, dropout: float, rope: RotaryEmbedding | None):
        super().__init__()
        self.heads, self.head_dim = heads, width // heads
        self.qkv = nn.Linear(width, 3 * width, bias=bias)
        self.proj = nn.Linear(width, width, bias=bias)
        self.dropout = dropout
        self.resid_drop = nn.Dropout(dropout)
        self.rope = rope

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        if self.rope is not None:
            q, k = self.rope(q, k)
        y = F.scaled_dot_product_attention(
            q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0
        )
        y = y.transpose(1, 2).reshape(B, T, C)
        return self.resid_drop(self.proj(y))
