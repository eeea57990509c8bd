"""Position encodings: RoPE (Su et al. 2021, "RoFormer", arXiv:2104.09864), ALiBi slopes and biases (Press et al.
2022), and the helpers shared by the attention kinds. Learned absolute positions live in ``GPT`` (an embedding
table added to the token embeddings); ``none`` (NoPE) adds nothing."""

from __future__ import annotations

import math

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
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self._build(context)

    def _build(self, length: int) -> None:
        t = torch.arange(length, dtype=torch.float64, device=self.inv_freq.device)
        freqs = torch.outer(t, self.inv_freq.double())  # [T, hd/2]
        # float64 tables (cast to the input's dtype when used: float32 models see the same rounded values as a
        # float32 table, float64 models the exact ones); a rebuilt table keeps a dtype set by ``.to()``
        dtype = self.cos.dtype if hasattr(self, "cos") else torch.float64
        self.register_buffer("cos", freqs.cos().to(dtype), persistent=False)
        self.register_buffer("sin", freqs.sin().to(dtype), persistent=False)
        self._pair_tables: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    def rotate(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """Rotate ``x [..., T, head_dim]`` as positions ``offset .. offset+T-1`` (the table grows on demand).

        Computed as ``x * cos2 + swap(x) * sin2`` with per-dtype tables ``cos2 = [c0, c0, c1, c1, ...]``,
        ``sin2 = [-s0, s0, -s1, s1, ...]`` ``[T, head_dim]`` (cached) and ``swap`` exchanging each pair: the same
        products and sums as ``_rotate`` (``a - b == a + (-b)`` exactly), so bit-identical, in 4 kernels instead
        of 7 and without casting the float64 tables on every call; forward and backward in one autograd node
        (``_PairRotation``)."""
        T = x.shape[-2]
        if offset + T > self.cos.shape[0]:
            self._build(max(offset + T, 2 * self.cos.shape[0]))
        key = (x.dtype, x.device, self.cos.shape[0], self.cos.dtype, self.cos.device)
        if key not in self._pair_tables:
            cos, sin = self.cos.to(x.dtype), self.sin.to(x.dtype)
            self._pair_tables = {key: (cos.repeat_interleave(2, -1), torch.stack((-sin, sin), -1).flatten(-2))}
        cos2, sin2 = self._pair_tables[key]
        return _PairRotation.apply(x, cos2[offset : offset + T], sin2[offset : offset + T])

    def forward(self, q: torch.Tensor, k: torch.Tensor, offset: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        return self.rotate(q, offset), self.rotate(k, offset)


def _swap_pairs(x: torch.Tensor) -> torch.Tensor:
    """``[x0, x1, x2, x3, ...] -> [x1, x0, x3, x2, ...]`` over the last dim (a copy: ``stack`` of the two strided
    halves, about 1.6x faster on CPU than ``flip`` of a ``[..., hd/2, 2]`` view)."""
    return torch.stack((x[..., 1::2], x[..., 0::2]), -1).flatten(-2)


class _PairRotation(torch.autograd.Function):
    """``y = x * cos2 + swap(x) * sin2`` with the hand-written backward ``dx = g * cos2 + swap(g * sin2)`` (swap is
    its own transpose). These are the products and the one sum autograd's backward of the same expression computes
    (float addition is commutative), so output and gradient are bit-identical to it; one node instead of the
    swap's views and copies. ``x [..., T, hd]`` (any strides), ``cos2, sin2 [T, hd]`` constants (no gradient)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, cos2: torch.Tensor, sin2: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(cos2, sin2)
        return x * cos2 + _swap_pairs(x) * sin2

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        cos2, sin2 = ctx.saved_tensors
        return g * cos2 + _swap_pairs(g * sin2), None, None


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate interleaved pairs: ``[x0, x1] -> [x0 cos - x1 sin, x0 sin + x1 cos]``. x: ``[..., T, hd]``."""
    x0, x1 = x[..., 0::2], x[..., 1::2]
    out = torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1)
    return out.flatten(-2)


# ALiBi: Press et al. 2022, "Train Short, Test Long: Attention with Linear Biases Enables Input Length
# Extrapolation" (arXiv:2108.12409; repo ofirpress/attention_with_linear_biases). NoPE (``positions: none``):
# no position signal at all; a causal decoder still infers positions from the mask (Haviv et al. 2022,
# "Transformer Language Models without Positional Encodings Still Learn Positional Information";
# Kazemnejad et al. 2023, "The Impact of Positional Encoding on Length Generalization in Transformers").


def alibi_slopes(heads: int) -> torch.Tensor:
    """Per-head ALiBi slopes ``m_h`` (float64 ``[heads]``), Press et al. 2022.

    For ``n`` a power of two: the geometric sequence ``2^(-8/n), 2^(-16/n), ..., 2^(-8)`` (start = ratio =
    ``2^(-8/n)``). Otherwise, as in the authors' code: the slopes of the closest power of two ``p < n``, then every
    other slope of ``2p`` for the remaining ``n - p`` heads.
    """

    def power_of_two(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    if heads < 1:
        raise ValueError(f"heads must be >= 1, got {heads}")
    if heads & (heads - 1) == 0:
        return torch.tensor(power_of_two(heads), dtype=torch.float64)
    p = 2 ** math.floor(math.log2(heads))
    return torch.tensor(power_of_two(p) + power_of_two(2 * p)[0::2][: heads - p], dtype=torch.float64)


def alibi_bias(slopes: torch.Tensor, t_q: int, t_k: int, offset: int = 0) -> torch.Tensor:
    """ALiBi score bias ``-m_h * (i - j)`` for queries at positions ``offset .. offset+t_q-1`` and keys
    ``0 .. t_k-1``: ``[heads, t_q, t_k]`` (dtype and device of ``slopes``).

    Future keys (``j > i``) get a positive bias here; the causal mask removes them. Added to the scores before the
    softmax (or softplus), so a key ``d`` tokens back is down-weighted by ``exp(-m_h d)`` in softmax attention.
    The authors' code adds ``m_h * j`` instead, which equals ``-m_h (i - j)`` up to a per-row constant that softmax
    ignores; the true distance is used here because softplus attention is not shift-invariant.
    """
    i = torch.arange(offset, offset + t_q, device=slopes.device, dtype=slopes.dtype)
    j = torch.arange(t_k, device=slopes.device, dtype=slopes.dtype)
    return -slopes[:, None, None] * (i[:, None] - j[None, :])
