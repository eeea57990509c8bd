"""TransNormer's NormAttention (``model.attention: transnormer``).

Qin et al. 2022, "The Devil in Linear Transformer" (EMNLP 2022, arXiv:2210.10340; TransNormer): kernel-based
linear attention's division normaliser ``phi(q_i) . sum_j phi(k_j)`` can be unbounded and makes gradients
unbounded; NormAttention drops it and normalises the attention output instead::

    O = SRMSNorm( causal(phi(Q) phi(K)^T) V ),    out_i = sum_{j<=i} (phi(q_i) . phi(k_j)) v_j

per head (``q, k, v [B, H, T, head_dim]``), causal by prefix sums (chunked: :func:`norm_linear_chunked`, O(T)
memory), heads merged to ``[B, T, width]``, then **SRMSNorm** -- the "simple RMSNorm" of TransNormerLLM (Qin et al.
2023, repo OpenNLPLab/TransnormerLLM, ``SimpleRMSNorm``): ``y * rsqrt(mean(y^2) + eps)`` over the whole width,
no gain and no bias (``eps`` = ``model.norm_eps``) -- and the output projection.

Kernel ``phi(x) = 1 + elu(x)`` (positive, the kernel of the TransNormer paper's NormAttention; TransNormerLLM's
Lightning Attention uses ``silu`` with a decay instead). Deviations, stated: no output gate (TransNormerLLM gates
the normalised output with ``silu(U x)``) and no decay; TransNormer's diagonal (block-local softmax) attention in
the lower layers is not built -- every block uses NormAttention, so this kind measures NormAttention itself.

Positions: RoPE rotates q and k before the kernel (as ``linear``); learned / none need nothing; ALiBi is refused (no
score matrix). ``qk_norm`` is refused (the kernel's positivity, not the logit scale, is what the paper controls).
Incremental decoding state: ``S [B, H, head_dim, head_dim]``, the sum of ``phi(k_j) v_j^T``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from normlab.attention.base import AttentionBase, AttentionState
from normlab.attention.linear import chunked_matmul_flops
from normlab.attention.positions import RotaryEmbedding
from normlab.attention.registry import register_attention


def elu_kernel(x: torch.Tensor) -> torch.Tensor:
    """``phi(x) = 1 + elu(x)`` (positive features; any shape)."""
    return 1.0 + F.elu(x)


def srmsnorm(y: torch.Tensor, eps: float) -> torch.Tensor:
    """SRMSNorm (TransNormerLLM's ``SimpleRMSNorm``): ``y * rsqrt(mean(y^2, -1) + eps)``, no gain. ``[..., d]``."""
    return y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + eps)


def norm_linear_chunked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, chunk: int = 64,
                        state: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal ``out_i = sum_{j<=i} (q_i . k_j) v_j`` (no denominator) in chunks of ``chunk`` tokens.

    ``q, k [B, H, T, dk]``, ``v [B, H, T, dv]`` (features already applied); ``state`` ``S0 [B, H, dk, dv]`` continues
    earlier tokens. Returns ``(out [B, H, T, dv], S [B, H, dk, dv])``. Inside a chunk the masked ``C x C`` product is
    exact; the state before each chunk is an exclusive prefix sum over chunks (one strictly-lower-triangular
    matmul), as ``normlab.attention.linear.linear_attention_chunked``.
    """
    B, H, T, dk = q.shape
    dv = v.shape[-1]
    C = max(1, min(chunk, T))
    n = -(-T // C)
    if n * C != T:
        pad = (0, 0, 0, n * C - T)
        q, k, v = (F.pad(t, pad) for t in (q, k, v))
    qc, kc, vc = q.reshape(B, H, n, C, dk), k.reshape(B, H, n, C, dk), v.reshape(B, H, n, C, dv)
    before = torch.ones(n, n, dtype=q.dtype, device=q.device).tril(-1)
    mask = torch.ones(C, C, dtype=q.dtype, device=q.device).tril()
    kv = kc.transpose(-2, -1) @ vc  # [B, H, n, dk, dv]
    S = (before @ kv.reshape(B, H, n, dk * dv)).view(B, H, n, dk, dv)
    if state is not None:
        S = S + state.unsqueeze(2)
    out = qc @ S + ((qc @ kc.transpose(-2, -1)) * mask) @ vc
    return out.reshape(B, H, n * C, dv)[:, :, :T], S[:, :, -1] + kv[:, :, -1]


@register_attention("transnormer")
class TransNormerAttention(AttentionBase):
    """NormAttention. ``x [B, T, in_width] -> [B, T, out_width]``. Parameters: ``qkv``, ``proj`` (SRMSNorm has
    none)."""

    paper = ("Qin et al. 2022, The Devil in Linear Transformer (TransNormer, arXiv:2210.10340); SRMSNorm from "
             "TransNormerLLM (Qin et al. 2023, repo OpenNLPLab/TransnormerLLM)")
    description = "NormAttention: 1+elu kernel linear attention without the denominator, SRMSNorm on the output"
    score_matrix = False  # a running state, no T x T matrix
    qk_norm_refusal = "TransNormer's NormAttention normalises its output, not q and k (set qk_norm: false)"

    @classmethod
    def from_config(cls, cfg, rope: RotaryEmbedding | None, **common) -> TransNormerAttention:
        return cls(cfg.width, cfg.heads, rope=rope, chunk=cfg.linear_chunk, norm_eps=cfg.norm_eps, **common)

    def __init__(self, width: int, heads: int, *, in_width: int | None = None, out_width: int | None = None,
                 bias: bool = False, dropout: float = 0.0, rope: RotaryEmbedding | None = None, chunk: int = 64,
                 norm_eps: float = 1e-5):
        super().__init__(width, heads, in_width=in_width, out_width=out_width, bias=bias, dropout=dropout)
        self.rope, self.chunk, self.norm_eps = rope, chunk, norm_eps

    def mixing_flops(self, t_q: int, t_k: int) -> dict[str, float]:
        """Forward FLOPs of one full-sequence token mixing (all heads): ``matmul`` from
        ``normlab.attention.linear.chunked_matmul_flops`` without a denominator; ``elementwise``: ``1 + elu`` on q
        and k (2 per element), SRMSNorm on the output (3 per element), RoPE (3 per q / k element)."""
        mm = self.heads * chunked_matmul_flops(t_q, self.chunk, self.head_dim, self.head_dim, denominator=False)
        rope = 3 * 2 * t_q * self.width if self.rope is not None else 0
        return {"matmul": mm, "elementwise": float(2 * 2 * t_q * self.width + 3 * t_q * self.width + rope)}

    def forward(self, x: torch.Tensor, state: AttentionState | None = None) -> torch.Tensor:
        offset = state.pos if state is not None else 0
        q, k, v = self.split_heads(x)
        if self.rope is not None:
            q, k = self.rope(q, k, offset)
        work = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype  # prefix sums in >= fp32
        qf, kf, vf = elu_kernel(q.to(work)), elu_kernel(k.to(work)), v.to(work)
        prev = state.tensors.get("S") if state is not None else None
        y, S = norm_linear_chunked(qf, kf, vf, chunk=self.chunk, state=prev)
        if state is not None:
            state.tensors["S"] = S
            state.pos += x.shape[1]
        y = srmsnorm(self.merge_heads(y), self.norm_eps).to(q.dtype)
        return self.out(y)
