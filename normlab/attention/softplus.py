"""Softplus attention with l1 normalisation (LSSA) and its re-weighting (LSSAR) (``model.attention: softplus``).

Gao, Spratling & Gionfrida 2025, "Softplus Attention with Re-weighting Boosts Length Extrapolation in Large
Language Models" (arXiv:2501.13428; code: github.com/iminfine/freeatten, as given in arXiv v2). For a query at
(0-based) position ``i`` with ``N_i = i + 1`` visible keys:

    q^ = q / ||q||,  k^ = k / ||k||                      (l2 over head_dim)
    S_ij = log(d_head) * log(N_i) * q^_i . k^_j           (the length-scaled cosine; + ALiBi bias if on)
    A_ij = softplus(S_ij) for j <= i, 0 otherwise;  A_ij /= sum_j A_ij        (l1 row normalisation)

Re-weighting (``reweight=True``, LSSAR; no fine-tuning, so it is switched at evaluation time, see
docs/attention.md):

    A'_ij = relu(N_i * A_ij - o_i)^p,  o_i = 0 for the first 3 rows (N_i <= 3), 1 otherwise;  A'_ij /= sum_j A'_ij

``N_i * A_ij`` compares a weight with the uniform weight ``1 / N_i``: above-uniform weights survive and are
sharpened by the power ``p`` (default 15), below-uniform ones vanish. Computed as ``(r / max_j r)^p`` before the
renormalisation (the same ratio; ``(N - 1)^15`` would overflow float32 for ``N`` in the thousands). A row with no
above-uniform weight (exactly uniform) keeps ``A``.

(check) The authors' repository (iminfine/freeatten; "freeattn" in earlier normlab text was a misspelling) could not
be fetched from the reference index, so these formulas are checked against the paper's description, not their
code: ``N`` is, per row, the number of attended tokens and the offset matrix is all ones except its first 3 rows,
which are 0. tests/attention/test_softplus.py holds closed-form cases (cosines 0 or 1, the offset rows, N = 4096 at
p = 15).

Positions: RoPE rotates q and k before the l2 normalisation (a rotation keeps the norm); ALiBi adds its bias to
``S`` after the length scaling; learned / none need nothing here. ``qk_norm`` and ``attn_softcap`` are refused by
``ModelConfig.validate`` (q and k are l2-normalised already, and the scores are bounded by ``log(d) log(N_i)``).
Incremental decoding: KV cache as in softmax attention.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from normlab.attention.base import AttentionBase, AttentionState, append_kv, causal_mask
from normlab.attention.dropout import dropout
from normlab.attention.positions import RotaryEmbedding, alibi_bias, alibi_slopes
from normlab.attention.registry import register_attention
from normlab.validate import POS as POSITIVE

REWEIGHT_PLAIN_ROWS = 3  # rows with N_i <= 3 use offset 0 in the re-weighting


def lssa_weights(q: torch.Tensor, k: torch.Tensor, *, offset: int = 0,
                 bias: torch.Tensor | None = None) -> torch.Tensor:
    """LSSA attention weights ``[B, H, Tq, Tk]`` (rows sum to 1 over the visible keys).

    ``q [B, H, Tq, hd]`` are positions ``offset .. offset+Tq-1``; ``k [B, H, Tk, hd]`` positions ``0 .. Tk-1`` with
    ``Tk = offset + Tq``. ``bias`` (``[H, Tq, Tk]``, e.g. ALiBi) is added to the scaled scores.
    """
    t_q, t_k = q.shape[-2], k.shape[-2]
    n = torch.arange(offset + 1, offset + t_q + 1, device=q.device, dtype=q.dtype)  # N_i = i + 1
    scale = math.log(q.shape[-1]) * torch.log(n)[:, None]  # [Tq, 1]
    s = scale * (F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-2, -1))
    if bias is not None:
        s = s + bias
    a = F.softplus(s).masked_fill(~causal_mask(t_q, t_k, q.device), 0.0)
    return a / a.sum(dim=-1, keepdim=True)


def lssar_reweight(a: torch.Tensor, offset: int = 0, power: float = 15.0) -> torch.Tensor:
    """LSSAR: ``relu(N_i A_ij - o_i)^p`` renormalised per row (``o_i = 0`` for ``N_i <= 3``, else 1).

    ``a [..., Tq, Tk]``: l1-normalised causal weights of the queries at positions ``offset .. offset+Tq-1``.
    """
    t_q = a.shape[-2]
    n = torch.arange(offset + 1, offset + t_q + 1, device=a.device, dtype=a.dtype)[:, None]  # [Tq, 1]
    o = (n > REWEIGHT_PLAIN_ROWS).to(a.dtype)
    r = F.relu(n * a - o)
    m = r.amax(dim=-1, keepdim=True)
    w = (r / m.clamp_min(torch.finfo(a.dtype).tiny)) ** power
    w = w / w.sum(dim=-1, keepdim=True)
    return torch.where(m > 0, w, a)


@register_attention("softplus")
class SoftplusAttention(AttentionBase):
    """LSSA / LSSAR attention. ``x [B, T, in_width] -> [B, T, out_width]``; parameters ``qkv``, ``proj``.

    ``reweight`` and ``power`` are plain attributes (no parameters): they may be changed on a trained model.
    """

    paper = ("Gao, Spratling & Gionfrida 2025, Softplus Attention with Re-weighting Boosts Length Extrapolation in "
             "Large Language Models (arXiv:2501.13428; repo iminfine/freeatten)")
    description = "l1-normalised softplus scores with a length scale (LSSA), optional re-weighting (LSSAR)"
    options = {k: (d, "model.lssa_reweight / model.lssa_power re-weight softplus attention, not '{att}'")
               for k, d in (("lssa_reweight", False), ("lssa_power", 15.0))}
    ranges = {"lssa_power": POSITIVE}
    qk_norm_refusal = "softplus attention l2-normalises q and k already; leave qk_norm off"
    eval_keys = ("lssa_reweight", "lssa_power")  # plain attributes: switched on a trained model (apply_eval_options)

    @classmethod
    def from_config(cls, cfg, rope: RotaryEmbedding | None, **common) -> "SoftplusAttention":
        return cls(cfg.width, cfg.heads, alibi=cfg.positions == "alibi", reweight=cfg.lssa_reweight,
                   power=cfg.lssa_power, rope=rope, **common)

    def apply_eval_options(self, cfg) -> None:
        """Apply the evaluation-time keys (``eval_keys``) of ``cfg``."""
        self.reweight, self.power = cfg.lssa_reweight, cfg.lssa_power

    def attention_probs(self, x: torch.Tensor) -> torch.Tensor:
        """The module's own l1-normalised weights ``[B, H, T, T]`` (float64) of input ``x [B, T, in_width]``
        (LSSA, or LSSAR when re-weighting is on): rows sum to 1 like softmax probabilities (attention sinks)."""
        q, k, _ = self.split_heads(x)
        if self.rope is not None:
            q, k = self.rope(q, k)
        return self.weights(q.double(), k.double(), 0)

    def __init__(self, width: int, heads: int, *, in_width: int | None = None, out_width: int | None = None,
                 bias: bool = False, dropout: float = 0.0, rope: RotaryEmbedding | None = None,
                 alibi: bool = False, reweight: bool = False, power: float = 15.0):
        super().__init__(width, heads, in_width=in_width, out_width=out_width, bias=bias, dropout=dropout)
        self.rope = rope
        self.reweight, self.power = reweight, power
        self.register_buffer("alibi_slopes", alibi_slopes(heads).float() if alibi else None, persistent=False)

    def forward(self, x: torch.Tensor, state: AttentionState | None = None) -> torch.Tensor:
        q, k, v = self.split_heads(x)
        offset = state.pos if state is not None else 0
        if self.rope is not None:
            q, k = self.rope(q, k, offset)
        k, v = append_kv(state, k, v)
        a = self.weights(q, k, offset)
        if state is not None:
            state.pos += x.shape[1]
        y = dropout(a, self.dropout, self.training and self.dropout > 0) @ v
        return self.out(self.merge_heads(y))

    def mixing_flops(self, t_q: int, t_k: int) -> dict[str, float]:
        """Forward FLOPs of one sequence's token mixing (all heads): ``matmul`` ``2 * 2 * t_q * t_k * width`` (scores
        and ``A v``, the full matrix); ``elementwise``: the q / k L2 normalisation (3 per element), per score the
        scale, softplus (2), mask, sum and divide (6; re-weighting adds 4), RoPE (3 per q / k element)."""
        per_score = 6 + (4 if self.reweight else 0) + (1 if self.alibi_slopes is not None else 0)
        per_qk = 3 + (3 if self.rope is not None else 0)
        return {"matmul": 4.0 * t_q * t_k * self.width,
                "elementwise": float(per_score * self.heads * t_q * t_k + per_qk * (t_q + t_k) * self.width)}

    def weights(self, q: torch.Tensor, k: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """Attention weights ``[B, H, Tq, Tk]`` (LSSA, then LSSAR when ``reweight``)."""
        bias = None
        if self.alibi_slopes is not None:
            bias = alibi_bias(self.alibi_slopes, q.shape[-2], k.shape[-2], offset=offset).to(q.dtype)
        a = lssa_weights(q, k, offset=offset, bias=bias)
        return lssar_reweight(a, offset, self.power) if self.reweight else a
