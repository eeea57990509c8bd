"""Norm-aware linear attention, NaLaFormer (``model.attention: nala``).

Meng et al. 2025, "Norm x Direction: Restoring the Missing Query Norm in Vision Linear Attention" (NaLaFormer;
repo ZacharyMeng/NaLaFormer, ``NaLaformer/NALA.py``, class ``NormAwareLinearAttn``). Per head, with ``q, k
[head_dim]``:

    k <- k^3                                                        (elementwise cube)
    q+ = relu(q), q- = relu(-q);  k+ = relu(k), k- = relu(-k)       (sign split: non-negative features)
    q+- <- q+- / ||q||                                              (direction part of the query)
    p = 3 (0.5 + tanh(||q||));  q+- <- (q+-)^p                      (query-norm-aware power: a larger query norm
                                                                     gives a spikier attention distribution)
    phi_q = [q+, q-],  phi_k = [k+, k-]                             (2 head_dim features; phi_q . phi_k =
                                                                     q+.k+ + q-.k-, the cosine-style inhibition
                                                                     of opposite-sign pairs)

then the causal division normalisation of normlab.attention.linear on ``(phi_q, phi_k, v)`` and, as in the authors'
module, ``LayerNorm(out) * silu(gate(x))`` before the output projection (``gate``: ``Linear(in_width, width)``; the
authors fuse it into one ``qkvg`` projection). As in their code the features are not offset by an epsilon.

Positions: with RoPE the authors rotate the features (each half ``q+`` / ``q-`` with the head_dim rotation) in the
numerator only; the denominator uses the unrotated features, so it stays positive. ALiBi is refused, and so is
``qk_norm``: it would fix ``||q||``, the very signal the kernel reads. The LINA options (``linear_conv``,
``linear_conv_source``, ``linear_gate``) apply here too; NaLaFormer's own conv is the authors' ``lepe`` branch on the
values (``linear_conv_source: value``, the default), made causal and 1-D.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from normlab.attention.linear import LinearAttention
from normlab.attention.registry import register_attention

NORM_EPS = 1e-6  # guards the division by ||q|| (the authors divide by the raw norm)


def nala_features(q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``phi_q, phi_k [..., 2 hd]`` from ``q, k [..., hd]`` (NaLaFormer's norm-aware kernel, no positions)."""
    k = k ** 3
    qn = q.norm(dim=-1, keepdim=True)
    p = 3.0 * (0.5 + torch.tanh(qn))
    qd = qn.clamp_min(NORM_EPS)
    phi_q = torch.cat([(F.relu(q) / qd) ** p, (F.relu(-q) / qd) ** p], dim=-1)
    phi_k = torch.cat([F.relu(k), F.relu(-k)], dim=-1)
    return phi_q, phi_k


@register_attention("nala")
class NaLaAttention(LinearAttention):
    """NaLaFormer attention. ``x [B, T, in_width] -> [B, T, out_width]``.

    Parameters: ``qkv``, ``gate`` (``Linear(in_width, width)``), ``out_norm`` (``nn.LayerNorm(width)``), ``proj``,
    plus the LINA options of :class:`LinearAttention`.
    """

    paper = ("Meng et al. 2025, Norm x Direction: Restoring the Missing Query Norm in Vision Linear Attention "
             "(NaLaFormer; repo ZacharyMeng/NaLaFormer)")
    description = "norm-aware kernel (query norm sets the feature sharpness), gated LayerNorm output"
    qk_norm_refusal = "nala's kernel reads the query norm ||q||, which qk_norm would fix; leave qk_norm off"

    feature_dim = 2  # phi = [x+, x-]: 2 head_dim features per head

    def __init__(self, width: int, heads: int, *, in_width: int | None = None, bias: bool = False, **kw):
        super().__init__(width, heads, in_width=in_width, bias=bias, **kw)
        self.gate = nn.Linear(self.in_width, width, bias=bias)
        self.out_norm = nn.LayerNorm(width)

    def features(self, q: torch.Tensor, k: torch.Tensor, offset: int):
        phi_q, phi_k = nala_features(q, k)
        if self.rope is None:
            return phi_q, phi_k, phi_q, phi_k
        return self._rotate_halves(phi_q, offset), self._rotate_halves(phi_k, offset), phi_q, phi_k

    def _rotate_halves(self, f: torch.Tensor, offset: int) -> torch.Tensor:
        """RoPE on each ``head_dim`` half of ``f [B, H, T, 2 hd]``."""
        B, H, T, D = f.shape
        halves = f.view(B, H, T, 2, D // 2).transpose(2, 3)  # [B, H, 2, T, hd]
        return self.rope.rotate(halves, offset).transpose(2, 3).reshape(B, H, T, D)

    def finish(self, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return self.out_norm(y) * F.silu(self.gate(x))
