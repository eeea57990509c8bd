"""Position encodings. RoPE: Su et al. 2021, "RoFormer" (arXiv:2104.09864)."""

from __future__ import annotations

import torch
from torch import nn


class RotaryEmbedding(nn.Module):
    """Rotary position embedding over ``head_dim`` (pairs ``(x[2i], x[2i+1])`` rotated by ``pos * base^(-2i/d)``).

    ``forward(q, k, offset)``: q, k ``[B, H, T, head_dim]`` -> rotated q, k, positions ``offset .. offset+T-1``.
    Non-persistent buffers: the tables are rebuilt from the config, never stored in checkpoints.
    """

    def __init__(self, head_dim: int, context: int, base: float = 10000.0):
        super().__init__()
        self.head_dim, self.base = head_dim, base
        inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
        self.register_buffer("inv_freq", inv_freq.float(), persistent=False)
        self._build(context)

    def _build(self, length: int) -> None:
        t = torch.arange(length, dtype=torch.float64)
        freqs = torch.outer(t, self.inv_freq.double())  # [T, hd/2]
        self.register_buffer("cos", freqs.cos().float(), persistent=False)
        self.register_buffer("sin", freqs.sin().float(), persistent=False)

    def forward(self, q: torch.Tensor, k: torch.Tensor, offset: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        T = q.shape[-2]
        if offset + T > self.cos.shape[0]:
            self._build(offset + T)
        cos = self.cos[offset : offset + T].to(q.dtype)
        sin = self.sin[offset : offset + T].to(q.dtype)
        return _rotate(q, cos, sin), _rotate(k, cos, sin)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate interleaved pairs: ``[x0, x1] -> [x0 cos - x1 sin, x0 sin + x1 cos]``. x: ``[..., T, hd]``."""
    x0, x1 = x[..., 0::2], x[..., 1::2]
    out = torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1)
    return out.flatten(-2)
