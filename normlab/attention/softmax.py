"""Causal softmax self-attention (``model.attention: softmax``).

Vaswani et al. 2017, "Attention Is All You Need": ``softmax(q k^T / sqrt(d_head) + causal mask) v``, through
``torch.nn.functional.scaled_dot_product_attention`` (SDPA) whenever the scores need no elementwise change.

Options:

- ``qk_norm`` (Qwen3 style; Dehghani et al. 2023 "Scaling Vision Transformers to 22B Parameters", Wortsman et al.
  2023 "Small-scale proxies for large-scale Transformer training instabilities"): RMSNorm over ``head_dim`` with a
  learnable gain (``q_norm``, ``k_norm``, shared by the heads), applied to q and k before RoPE. Bounds the logits,
  so attention cannot saturate by weight growth. SDPA path. ``qk_norm_scope='width'`` (OLMo 2, OLMo et al. 2024):
  one RMSNorm over all heads' concatenated q (and one over k), gains ``[width]``, instead of one per head.
- ``softcap`` ``c`` (Gemma 2, Gemma Team 2024, ``c = 50``): scores ``s = c * tanh(s / c)`` before the mask and
  softmax. An elementwise change of the scores, so it takes the explicit (non-SDPA) path.
- ``alibi`` (Press et al. 2022): adds ``-m_h (i - j)`` to the scores; SDPA with an additive float mask (or the
  explicit path together with a softcap, after the cap as in the score pipeline ``cap -> bias -> mask``).

- ``ngpt`` (nGPT, Loshchilov et al. 2025, arXiv:2410.01131, eq. 15-16; set by ``model.residual: ngpt``): after RoPE,
  ``q <- s_qk * q / ||q||``, ``k <- s_qk * k / ||k||`` per head, and the softmax scale ``sqrt(head_dim)`` instead of
  ``1 / sqrt(head_dim)`` (applied by multiplying q by ``head_dim``, so SDPA keeps its scale). ``s_qk`` is the
  parameter ``sqk [width]`` (per head ``[heads, head_dim]``), stored as the authors do: initialised to
  ``1/sqrt(width)`` and used as ``sqk * sqrt(width)`` (1 at init).

Instability probe: ``logit_probe`` (None by default) is called as ``logit_probe(q, k)`` with the queries and keys
that enter the scores (after QK-norm and RoPE; ``[B, H, Tq, hd]``, ``[B, H, Tk, hd]``); the training diagnostics
set it on diagnostic steps to record the largest pre-softmax logit (attention logit growth, Wortsman et al. 2023).

Incremental decoding: KV cache (``AttentionState.tensors['k'|'v']``, ``[B, H, t, head_dim]``, keys stored after
QK-norm and RoPE); new queries sit at positions ``state.pos ..``.
"""

from __future__ import annotations

import math

import torch

from normlab.attention.base import AttentionBase, AttentionState, append_kv, causal_mask
from normlab.attention.dropout import dropout, sdpa
from normlab.attention.positions import RotaryEmbedding, alibi_bias, alibi_slopes
from normlab.attention.registry import register_attention
from normlab.errors import NormlabError, unknown
from normlab.norms.modules import RMSNorm
from normlab.validate import POS as POSITIVE

QK_NORM_SCOPES = ("head", "width")  # model.qk_norm_scope: one RMSNorm per head's head_dim / over all heads' q, k


@register_attention("softmax")
class CausalSelfAttention(AttentionBase):
    """Multi-head causal softmax attention. ``x [B, T, in_width] -> [B, T, out_width]``.

    Parameters: ``qkv`` (``in_width -> 3 width``), ``proj`` (``width -> out_width``), and with ``qk_norm`` the gains
    ``q_norm.weight`` / ``k_norm.weight`` (``[head_dim]``, or ``[width]`` with ``qk_norm_scope='width'``; ones).
    """

    paper = "Vaswani et al. 2017, Attention Is All You Need (arXiv:1706.03762)"
    description = "causal softmax attention (SDPA); QK-norm, score softcap (Gemma 2), ALiBi"
    options = {
        "attn_softcap": (None, "model.attn_softcap caps pre-softmax scores: softmax attention only, not '{att}'"),
        "qk_norm_scope": ("head", "model.qk_norm_scope 'width' needs model.qk_norm: true and model.attention: softmax"),
    }
    ranges = {"attn_softcap": POSITIVE}  # or null (no cap)
    convertible = exportable = True  # fused qkv / proj: normlab convert folds into them, HF families map them

    @classmethod
    def check_keys(cls, cfg) -> None:
        if cfg.qk_norm_scope not in QK_NORM_SCOPES:
            raise unknown("model.qk_norm_scope", cfg.qk_norm_scope, QK_NORM_SCOPES)

    @classmethod
    def check_config(cls, cfg) -> None:
        if cfg.qk_norm_scope != "head" and not cfg.qk_norm:
            raise NormlabError("model.qk_norm_scope 'width' needs model.qk_norm: true and model.attention: softmax")

    @classmethod
    def from_config(cls, cfg, rope: RotaryEmbedding | None, **common) -> "CausalSelfAttention":
        return cls(cfg.width, cfg.heads, qk_norm=cfg.qk_norm, norm_eps=cfg.norm_eps, qk_norm_scope=cfg.qk_norm_scope,
                   softcap=cfg.attn_softcap, alibi=cfg.positions == "alibi", rope=rope, ngpt=cfg.normalized, **common)

    def __init__(self, width: int, heads: int, *, in_width: int | None = None, out_width: int | None = None,
                 bias: bool = False, dropout: float = 0.0, rope: RotaryEmbedding | None = None,
                 qk_norm: bool = False, norm_eps: float = 1e-6, softcap: float | None = None, alibi: bool = False,
                 qk_norm_scope: str = "head", ngpt: bool = False):
        super().__init__(width, heads, in_width=in_width, out_width=out_width, bias=bias, dropout=dropout)
        self.rope = rope
        self.softcap = softcap
        self.qk_norm_scope = qk_norm_scope
        if qk_norm:
            dim = width if qk_norm_scope == "width" else self.head_dim
            self.q_norm = RMSNorm(dim, eps=norm_eps)
            self.k_norm = RMSNorm(dim, eps=norm_eps)
        else:
            self.q_norm = self.k_norm = None
        self.sqk_base = 1.0 / math.sqrt(width)
        self.sqk = torch.nn.Parameter(torch.full((width,), self.sqk_base)) if ngpt else None
        self.register_buffer("alibi_slopes", alibi_slopes(heads).float() if alibi else None, persistent=False)
        self.logit_probe = None

    def project(self, x: torch.Tensor, offset: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``x [B, T, in_width] -> q, k, v [B, H, T, head_dim]`` with QK-norm and RoPE (positions from ``offset``)."""
        if self.rope is not None and self.q_norm is None:  # q and k rotated together, in the projection's layout
            B, T, _ = x.shape
            return self.hypersphere(*self.rope.rotate_split(self.qkv(x).view(B, T, 3, self.heads, self.head_dim),
                                                            offset))
        q, k, v = self.split_heads(x)
        if self.q_norm is not None and self.qk_norm_scope == "width":  # [B, H, T, hd] -> [B, T, width] and back
            B, H, T, D = q.shape
            q = self.q_norm(self.merge_heads(q)).view(B, T, H, D).transpose(1, 2)
            k = self.k_norm(self.merge_heads(k)).view(B, T, H, D).transpose(1, 2)
        elif self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.rope is not None:
            q, k = self.rope(q, k, offset)
        return self.hypersphere(q, k, v)

    def hypersphere(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """nGPT's scaled q/k (``ngpt``; else unchanged): ``s_qk * q / ||q|| * head_dim`` and ``s_qk * k / ||k||``,
        ``[B, H, T, hd]``."""
        if self.sqk is None:
            return q, k, v
        s = (self.sqk * (1.0 / self.sqk_base)).view(self.heads, 1, self.head_dim)
        q = s * (q / q.norm(p=2, dim=-1, keepdim=True)) * self.head_dim  # SDPA's 1/sqrt(hd) -> sqrt(hd)
        return q, s * (k / k.norm(p=2, dim=-1, keepdim=True)), v

    def forward(self, x: torch.Tensor, state: AttentionState | None = None) -> torch.Tensor:
        q, k, v = self.project(x, state.pos if state is not None else 0)
        k, v = append_kv(state, k, v)
        y = self.attend(q, k, v)
        if state is not None:
            state.pos += x.shape[1]
        return self.out(self.merge_heads(y))

    def attention_probs(self, x: torch.Tensor) -> torch.Tensor:
        """Causal attention probabilities ``[B, H, T, T]`` (float64) of input ``x [B, T, in_width]``:
        ``softmax(cap(q k^T / sqrt(head_dim)) + alibi + causal mask)`` with this module's QK-norm, RoPE, softcap
        and ALiBi (diagnostics: attention sinks)."""
        q, k, _ = self.project(x)
        T = x.shape[1]
        s = (q.double() @ k.double().transpose(-2, -1)) / math.sqrt(self.head_dim)
        if self.softcap is not None:
            s = self.softcap * torch.tanh(s / self.softcap)
        if self.alibi_slopes is not None:
            s = s + alibi_bias(self.alibi_slopes.double(), T, T)
        return torch.softmax(s.masked_fill(~causal_mask(T, T, x.device), float("-inf")), dim=-1)

    def mixing_flops(self, t_q: int, t_k: int) -> dict[str, float]:
        """Forward FLOPs of one sequence's token mixing (all heads; projections and QK-norm modules excluded):
        ``matmul``: scores ``q k^T`` and ``A v``, ``2 * 2 * t_q * t_k * width``, the full ``t_q x t_k`` matrix as the
        dense kernels compute it (a causal FlashAttention skips about half); ``elementwise``: per score the scale,
        mask, max, subtract, exp, sum and divide (7; a softcap adds 3, ALiBi 1), and RoPE on q and k (3 per
        element)."""
        per_score = 7 + (3 if self.softcap is not None else 0) + (1 if self.alibi_slopes is not None else 0)
        rope = 3 * (t_q + t_k) * self.width if self.rope is not None else 0
        ngpt = 10 * t_q * self.width if self.sqk is not None else 0  # q, k: square, sum, divide, gain, (q) scale
        return {"matmul": 4.0 * t_q * t_k * self.width,
                "elementwise": float(per_score * self.heads * t_q * t_k + rope + ngpt)}

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """``q [B, H, Tq, hd]`` (the last ``Tq`` positions), ``k, v [B, H, Tk, hd]`` -> ``[B, H, Tq, hd]``."""
        t_q, t_k = q.shape[-2], k.shape[-2]
        if self.logit_probe is not None:
            self.logit_probe(q, k)
        p = self.dropout if self.training else 0.0
        if self.softcap is None and self.alibi_slopes is None and t_q == t_k:
            return sdpa(q, k, v, is_causal=True, dropout_p=p)
        allowed = causal_mask(t_q, t_k, q.device)
        bias = None
        if self.alibi_slopes is not None:
            bias = alibi_bias(self.alibi_slopes, t_q, t_k, offset=t_k - t_q).to(q.dtype)
        if self.softcap is None:  # SDPA with a boolean or additive float mask
            mask = allowed if bias is None else bias.masked_fill(~allowed, float("-inf"))
            return sdpa(q, k, v, attn_mask=mask, dropout_p=p)
        s = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
        s = self.softcap * torch.tanh(s / self.softcap)
        if bias is not None:
            s = s + bias
        a = torch.softmax(s.masked_fill(~allowed, float("-inf")), dim=-1)
        return dropout(a, p, p > 0) @ v
