"""Which Hugging Face ``transformers`` architecture a normlab model config maps onto exactly (docs/interop.md).

``hf_arch(cfg)`` returns one of ``ARCHS`` or raises a one-line NormlabError naming the first choice that has no
exact counterpart and what would export. The families and the normlab choices each one reproduces exactly:

- ``gpt2``     (Radford et al. 2019): Pre-LN LayerNorm, learned positions, GELU MLP (exact ``gelu`` or
  ``gelu_tanh`` = GPT-2's ``gelu_new``). Missing biases are written as zeros (GPT-2 always has them).
- ``gpt_neox`` (Black et al. 2022): Pre-LN LayerNorm, RoPE over the whole head, GELU MLP, sequential residual
  (``use_parallel_residual: false``).
- ``llama``    (Touvron et al. 2023): Pre-RMSNorm, RoPE, SwiGLU, no QK-norm.
- ``qwen3``    (Qwen team 2025): Llama plus per-head QK-norm (``qk_norm: true``, ``qk_norm_scope: head``).
- ``gemma2``   (Gemma Team 2024): Peri ("sandwich") RMSNorm with no embedding norm, RoPE, gated MLP, embeddings
  scaled by ``sqrt(width)``; the attention-score and final-logit soft-caps map onto Gemma 2's.
- ``olmo2``    (OLMo et al. 2024): output-norm placement, RMSNorm, RoPE, SwiGLU, QK-norm over the full width
  (``qk_norm_scope: width``).

RoPE: normlab rotates interleaved pairs ``(x[2i], x[2i+1])``, transformers rotates halves ``(x[i], x[i+d/2])``;
the same rotation after permuting each head's q / k rows by ``rope_perm`` (a relabelling of coordinates, so
``q . k`` is unchanged). Everything here is a permutation, a transpose, a slice or a ``w - 1`` offset: exact.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from normlab.attention import attention_names, get_attention_class
from normlab.errors import NormlabError
from normlab.model.placements import embed_norm_on, final_norm_on

if TYPE_CHECKING:
    from normlab.model.config import ModelConfig

ARCHS = ("gpt2", "gpt_neox", "llama", "qwen3", "gemma2", "olmo2")
EXPORTABLE = ("GPT-2 (pre, layernorm, learned, gelu|gelu_tanh); GPT-NeoX (pre, layernorm, rope, gelu|gelu_tanh); "
              "Llama (pre, rmsnorm, rope, swiglu); Qwen3 (Llama + qk_norm scope head); Gemma 2 (peri, rmsnorm, rope, "
              "swiglu, embed_norm false, embed_scale fixed); OLMo 2 (output, rmsnorm, rope, swiglu, "
              "qk_norm scope width)")


def _refuse(choice: str) -> NormlabError:
    return NormlabError(f"cannot export to HF exactly: {choice}; exportable: {EXPORTABLE}")


def hf_arch(cfg: "ModelConfig") -> str:
    """The HF architecture (``model_type``) ``cfg`` maps onto exactly, else a one-line NormlabError."""
    c = cfg
    if c.norm not in ("layernorm", "rmsnorm"):
        raise _refuse(f"model.norm '{c.norm}' has no HF counterpart (layernorm or rmsnorm would export)")
    if not get_attention_class(c.attention).exportable:
        ok = " or ".join(k for k in attention_names() if get_attention_class(k).exportable)
        raise _refuse(f"model.attention '{c.attention}' ({ok} would export)")
    if c.placement not in ("pre", "peri", "output"):
        raise _refuse(f"model.placement '{c.placement}' (pre, peri or output would export)")
    if c.layernorm_scaling:
        raise _refuse("model.layernorm_scaling: true (LayerNorm Scaling has no HF counterpart)")
    if c.residual != "add":
        raise _refuse(f"model.residual '{c.residual}' (the exported families have one plain residual stream: add "
                      "would export)")
    if c.residual_scale != "none":
        raise _refuse(f"model.residual_scale '{c.residual_scale}' (none would export)")
    if not final_norm_on(c):
        raise _refuse("model.final_norm: false (every HF family has a final norm)")
    if c.output != "softmax":
        raise _refuse(f"model.output '{c.output}' (HF models end in a softmax; softmax would export)")
    if c.head_bias:
        raise _refuse("model.head_bias: true (HF LM heads have no bias)")
    if c.positions not in ("rope", "learned"):
        raise _refuse(f"model.positions '{c.positions}' (rope, or learned for GPT-2, would export)")
    if c.norm == "rmsnorm" and any(c.norm_kwargs(g).get("bias") for g in ("attn", "mlp", "final", "embed")):
        raise _refuse("model.norm_options bias: true on rmsnorm (HF RMSNorms have no bias)")
    bad_opts = {k.partition("@")[0] for k in c.norm_options} - {"bias", "affine", "unit_offset"}
    if bad_opts:
        raise _refuse(f"model.norm_options {sorted(bad_opts)}")
    if embed_norm_on(c):
        raise _refuse("model.embed_norm: true (no HF family normalises the embeddings; set model.embed_norm: false)")
    if c.placement == "pre":
        arch = _pre_arch(c)
    elif c.placement == "peri":
        arch = _gemma2(c)
    else:
        arch = _olmo2(c)
    if arch != "gemma2":
        if c.embed_scale_kind != "none":
            raise _refuse(f"model.embed_scale '{c.embed_scale}' (only Gemma 2 scales embeddings; none would export)")
        if c.logit_softcap is not None or c.attn_softcap is not None:
            raise _refuse("model.logit_softcap / model.attn_softcap (only Gemma 2 soft-caps; null would export)")
    return arch


def _pre_arch(c: "ModelConfig") -> str:
    if c.norm == "layernorm":
        if c.activation not in ("gelu", "gelu_tanh"):
            raise _refuse(f"model.activation '{c.activation}' with Pre-LayerNorm (gelu or gelu_tanh would export "
                          "as GPT-2 / GPT-NeoX; swiglu needs rmsnorm for Llama)")
        if c.qk_norm:
            raise _refuse("model.qk_norm: true with Pre-LayerNorm (GPT-2 and GPT-NeoX have no QK-norm)")
        return "gpt2" if c.positions == "learned" else "gpt_neox"
    if c.positions != "rope":
        raise _refuse("model.positions 'learned' with Pre-RMSNorm (rope would export as Llama)")
    if c.activation != "swiglu":
        raise _refuse(f"model.activation '{c.activation}' with Pre-RMSNorm (swiglu would export as Llama)")
    if c.qk_norm:
        if c.qk_norm_scope != "head":
            raise _refuse("model.qk_norm_scope 'width' with Pre-RMSNorm (scope head would export as Qwen3)")
        if c.bias:
            raise _refuse("model.bias: true with QK-norm (Qwen3's MLP has no bias)")
        return "qwen3"
    return "llama"


def _rms_rope_swiglu(c: "ModelConfig", family: str) -> None:
    if c.norm != "rmsnorm":
        raise _refuse(f"model.norm '{c.norm}' with placement '{c.placement}' ({family} uses rmsnorm)")
    if c.positions != "rope":
        raise _refuse(f"model.positions '{c.positions}' ({family} uses rope)")
    if c.activation != "swiglu":
        raise _refuse(f"model.activation '{c.activation}' ({family}'s MLP is gated: swiglu would export)")
    if c.bias:
        raise _refuse(f"model.bias: true ({family}'s MLP has no bias)")


def _gemma2(c: "ModelConfig") -> str:
    _rms_rope_swiglu(c, "Gemma 2")
    if c.qk_norm:
        raise _refuse("model.qk_norm: true with placement peri (Gemma 2 has no QK-norm)")
    if c.tie_embeddings and c.embed_scale_kind == "none":
        raise _refuse("model.embed_scale 'none' with tied embeddings and placement peri (Gemma 2 scales the "
                      "embeddings by sqrt(width): embed_scale fixed would export)")
    return "gemma2"  # a scale other than sqrt(width) folds into an untied table; tied, it is checked at export


def _olmo2(c: "ModelConfig") -> str:
    _rms_rope_swiglu(c, "OLMo 2")
    if not c.qk_norm or c.qk_norm_scope != "width":
        raise _refuse("placement output without model.qk_norm: true and model.qk_norm_scope: width "
                      "(OLMo 2 always normalises q and k over the full width)")
    return "olmo2"


def rope_perm(head_dim: int) -> torch.Tensor:
    """Index ``[head_dim]``: HF half-rotation coordinate ``j`` holds normlab interleaved coordinate ``perm[j]``
    (``0, 2, 4, ..., 1, 3, 5, ...``)."""
    return torch.cat([torch.arange(0, head_dim, 2), torch.arange(1, head_dim, 2)])


def head_rows(heads: int, head_dim: int, rope: bool, offset: int = 0) -> torch.Tensor:
    """Rows of one of q / k / v (starting at ``offset`` in normlab's fused ``qkv``) in HF order: heads in turn,
    each head's coordinates permuted to the half-rotation layout when ``rope``."""
    inner = rope_perm(head_dim) if rope else torch.arange(head_dim)
    return torch.cat([offset + h * head_dim + inner for h in range(heads)])
