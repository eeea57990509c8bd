"""Attention kinds (``model.attention``) and position encodings (``model.positions``); docs/attention.md.

- ``softmax``  -- normlab.attention.softmax (SDPA; QK-norm, score softcap, ALiBi)
- ``softplus`` -- normlab.attention.softplus (LSSA, re-weighting LSSAR)
- ``linear``   -- normlab.attention.linear (LINA: relu kernel, causal division normalisation, conv, KV gate)
- ``nala``     -- normlab.attention.nala (NaLaFormer norm-aware kernel)

``build_attention(cfg, rope, in_width=..., out_width=...)`` is the one place that maps a ``ModelConfig`` to a module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import nn

from normlab.attention.base import AttentionState
from normlab.attention.linear import LinearAttention
from normlab.attention.nala import NaLaAttention
from normlab.attention.positions import RotaryEmbedding
from normlab.attention.softmax import CausalSelfAttention
from normlab.attention.softplus import SoftplusAttention

if TYPE_CHECKING:
    from normlab.model.config import ModelConfig

ATTENTIONS = ("softmax", "softplus", "linear", "nala")
LINEAR_KINDS = ("linear", "nala")  # no T x T score matrix; recurrent state for generation
# config keys that change a trained model's evaluation without touching its weights (``normlab eval --set``)
EVAL_TIME_KEYS = ("lssa_reweight", "lssa_power")


def build_attention(cfg: "ModelConfig", rope: RotaryEmbedding | None, *, in_width: int | None = None,
                    out_width: int | None = None) -> nn.Module:
    """The attention module of ``cfg.attention`` (validated config). ``in_width`` / ``out_width``: residual-stream
    width read and written (default ``cfg.width``; ``width - 1`` in the Pre-CRMSNorm model)."""
    common = dict(in_width=in_width, out_width=out_width, bias=cfg.bias, dropout=cfg.dropout, rope=rope)
    alibi = cfg.positions == "alibi"
    if cfg.attention == "softmax":
        return CausalSelfAttention(cfg.width, cfg.heads, qk_norm=cfg.qk_norm, norm_eps=cfg.norm_eps,
                                   qk_norm_scope=cfg.qk_norm_scope, softcap=cfg.attn_softcap, alibi=alibi, **common)
    if cfg.attention == "softplus":
        return SoftplusAttention(cfg.width, cfg.heads, alibi=alibi, reweight=cfg.lssa_reweight,
                                 power=cfg.lssa_power, **common)
    cls = LinearAttention if cfg.attention == "linear" else NaLaAttention
    return cls(cfg.width, cfg.heads, context=cfg.context, conv=cfg.linear_conv, conv_source=cfg.linear_conv_source,
               gate=cfg.linear_gate,
               chunk=cfg.linear_chunk, qk_norm=cfg.qk_norm, norm_eps=cfg.norm_eps, **common)


def set_eval_options(model: nn.Module, cfg: "ModelConfig") -> None:
    """Apply the evaluation-time keys of ``cfg`` (``EVAL_TIME_KEYS``) to the attention modules of a built model."""
    for m in model.modules():
        if isinstance(m, SoftplusAttention):
            m.reweight, m.power = cfg.lssa_reweight, cfg.lssa_power


__all__ = ["ATTENTIONS", "EVAL_TIME_KEYS", "LINEAR_KINDS", "AttentionState", "CausalSelfAttention",
           "LinearAttention", "NaLaAttention", "RotaryEmbedding", "SoftplusAttention", "build_attention",
           "set_eval_options"]
