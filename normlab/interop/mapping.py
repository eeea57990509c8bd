"""Tensor-by-tensor maps between a normlab GPT and the HF ``transformers`` families of ``normlab.interop.arch``.

``weight_map(cfg, arch)`` lists :class:`Entry` rows, one per HF tensor::

    hf[entry.hf] = transpose?(normlab[entry.nl][entry.rows]) * entry.mul + entry.add    (entry.nl set)
    hf[entry.hf] = full(entry.fill)                                                       (entry.nl None)

The inverse (import) is ``normlab[entry.nl][entry.rows] = transpose?((hf - add) / mul)``. Rows are permutations /
slices of normlab's fused ``qkv`` (``[q | k | v]``, heads contiguous), with each head's q / k coordinates reordered
from normlab's interleaved RoPE pairs to HF's half rotation (``arch.head_rows``). ``add`` converts norm gains
between stored forms (normlab ``unit_offset`` and Gemma's ``1 + w`` RMSNorm); ``fill`` writes what normlab leaves
out (a zero bias, a unit gain). ``hf_config(cfg, arch)`` is the matching ``transformers`` config dict.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from normlab.interop.arch import head_rows

if TYPE_CHECKING:
    from normlab.model.config import ModelConfig


@dataclass
class Entry:
    hf: str
    nl: str | None
    rows: torch.Tensor | None = None
    transpose: bool = False
    mul: float = 1.0
    add: float = 0.0
    fill: float | None = None


def mlp_hidden(cfg: "ModelConfig") -> int:
    """The MLP hidden size of ``cfg`` (as ``normlab.model.blocks.MLP`` computes it)."""
    if cfg.mlp_hidden is not None:
        return cfg.mlp_hidden
    h = int(cfg.mlp_ratio * cfg.width)
    return int(2 * h / 3) if cfg.activation == "swiglu" else h


HF_OFFSET = {"gemma2": 1.0}  # HF RMSNorm applies (offset + stored weight)

_NAMES = {  # per family: embeddings, layer prefix, final norm, head
    "gpt2": ("transformer.wte.weight", "transformer.h", "transformer.ln_f", "lm_head.weight"),
    "gpt_neox": ("gpt_neox.embed_in.weight", "gpt_neox.layers", "gpt_neox.final_layer_norm", "lm_head.weight"),
    "llama": ("model.embed_tokens.weight", "model.layers", "model.norm", "lm_head.weight"),
}
for _a in ("qwen3", "gemma2", "olmo2"):
    _NAMES[_a] = _NAMES["llama"]

# normlab norm site -> HF norm module name inside a layer
_SITES = {
    "gpt2": {"attn_in": "ln_1", "mlp_in": "ln_2"},
    "gpt_neox": {"attn_in": "input_layernorm", "mlp_in": "post_attention_layernorm"},
    "llama": {"attn_in": "input_layernorm", "mlp_in": "post_attention_layernorm"},
    "qwen3": {"attn_in": "input_layernorm", "mlp_in": "post_attention_layernorm"},
    "gemma2": {"attn_in": "input_layernorm", "attn_out": "post_attention_layernorm",
               "mlp_in": "pre_feedforward_layernorm", "mlp_out": "post_feedforward_layernorm"},
    "olmo2": {"attn_out": "post_attention_layernorm", "mlp_out": "post_feedforward_layernorm"},
}


def _norm(cfg: "ModelConfig", arch: str, group: str, hf: str, nl: str, state: dict) -> list[Entry]:
    """Gain (and LayerNorm bias) of one norm. normlab applies ``w + u`` (``u = 1`` with ``unit_offset``), HF
    ``g + o`` (``o = 1`` for Gemma 2): ``g = w + u - o``; a norm without gain (``affine: false``) is ``1 - o``."""
    u = 1.0 if cfg.norm_kwargs(group).get("unit_offset") else 0.0
    o = HF_OFFSET.get(arch, 0.0)
    out = [Entry(f"{hf}.weight", f"{nl}.weight", add=u - o) if f"{nl}.weight" in state
           else Entry(f"{hf}.weight", None, fill=1.0 - o)]
    if cfg.norm == "layernorm":  # GPT-2 / GPT-NeoX LayerNorms always have a bias
        out.append(Entry(f"{hf}.bias", f"{nl}.bias") if f"{nl}.bias" in state else Entry(f"{hf}.bias", None, fill=0.0))
    return out


def _linear(hf: str, nl: str, state: dict, *, rows=None, transpose=False, hf_bias: bool) -> list[Entry]:
    out = [Entry(f"{hf}.weight", f"{nl}.weight", rows=rows, transpose=transpose)]
    if hf_bias:
        out.append(Entry(f"{hf}.bias", f"{nl}.bias", rows=rows) if f"{nl}.bias" in state
                   else Entry(f"{hf}.bias", None, fill=0.0))
    return out


def weight_map(cfg: "ModelConfig", arch: str, state: dict[str, Any], embed_mul: float = 1.0) -> list[Entry]:
    """Entries for every HF tensor of ``arch`` (``state``: the normlab state dict, to see which optional tensors
    exist). ``embed_mul``: factor folded into an untied Gemma 2 embedding table (normlab scale / sqrt(width))."""
    emb, layers, final, head = _NAMES[arch]
    W, H, D = cfg.width, cfg.heads, cfg.head_dim
    rope = cfg.positions == "rope"
    out = [Entry(emb, "tok_emb.weight", mul=embed_mul)]
    if arch == "gpt2":
        out.append(Entry("transformer.wpe.weight", "pos_emb.weight"))
    b = cfg.bias
    for l in range(cfg.depth):
        p, n = f"{layers}.{l}", f"blocks.{l}"
        for site, hf_name in _SITES[arch].items():
            out += _norm(cfg, arch, site.split("_")[0], f"{p}.{hf_name}", f"{n}.{site}", state)
        q = head_rows(H, D, rope, 0)
        k = head_rows(H, D, rope, W)
        v = head_rows(H, D, False, 2 * W)
        if arch == "gpt2":
            out += _linear(f"{p}.attn.c_attn", f"{n}.attn.qkv", state, transpose=True, hf_bias=True)
            out += _linear(f"{p}.attn.c_proj", f"{n}.attn.proj", state, transpose=True, hf_bias=True)
            out += _linear(f"{p}.mlp.c_fc", f"{n}.mlp.fc", state, transpose=True, hf_bias=True)
            out += _linear(f"{p}.mlp.c_proj", f"{n}.mlp.proj", state, transpose=True, hf_bias=True)
            continue
        if arch == "gpt_neox":  # fused per head: [q_h | k_h | v_h] for h in heads
            rows = torch.cat([torch.cat([q[h * D:(h + 1) * D], k[h * D:(h + 1) * D], v[h * D:(h + 1) * D]])
                              for h in range(H)])
            out += _linear(f"{p}.attention.query_key_value", f"{n}.attn.qkv", state, rows=rows, hf_bias=b)
            out += _linear(f"{p}.attention.dense", f"{n}.attn.proj", state, hf_bias=b)
            out += _linear(f"{p}.mlp.dense_h_to_4h", f"{n}.mlp.fc", state, hf_bias=True)
            out += _linear(f"{p}.mlp.dense_4h_to_h", f"{n}.mlp.proj", state, hf_bias=True)
            continue
        a = f"{p}.self_attn"
        for name, rows in (("q_proj", q), ("k_proj", k), ("v_proj", v)):
            out += _linear(f"{a}.{name}", f"{n}.attn.qkv", state, rows=rows, hf_bias=b)
        out += _linear(f"{a}.o_proj", f"{n}.attn.proj", state, hf_bias=b)
        if arch == "qwen3":
            out += [Entry(f"{a}.q_norm.weight", f"{n}.attn.q_norm.weight", rows=head_rows(1, D, rope)),
                    Entry(f"{a}.k_norm.weight", f"{n}.attn.k_norm.weight", rows=head_rows(1, D, rope))]
        if arch == "olmo2":
            out += [Entry(f"{a}.q_norm.weight", f"{n}.attn.q_norm.weight", rows=head_rows(H, D, rope)),
                    Entry(f"{a}.k_norm.weight", f"{n}.attn.k_norm.weight", rows=head_rows(H, D, rope))]
        mb = b and arch == "llama"
        out += _linear(f"{p}.mlp.gate_proj", f"{n}.mlp.fc", state, hf_bias=mb)
        out += _linear(f"{p}.mlp.up_proj", f"{n}.mlp.gate", state, hf_bias=mb)
        out += _linear(f"{p}.mlp.down_proj", f"{n}.mlp.proj", state, hf_bias=mb)
    out += _norm(cfg, arch, "final", final, "final_norm", state)
    if not cfg.tie_embeddings:
        out.append(Entry(head, "lm_head.weight"))
    return out


def hf_config(cfg: "ModelConfig", arch: str) -> dict[str, Any]:
    """The ``transformers`` config (as keyword arguments of its ``*Config`` class) matching ``cfg``."""
    common = dict(vocab_size=cfg.vocab_size, tie_word_embeddings=cfg.tie_embeddings, bos_token_id=None,
                  eos_token_id=None, pad_token_id=None)
    rope = {"rope_type": "default", "rope_theta": float(cfg.rope_base)}
    if arch == "gpt2":
        return dict(common, n_positions=cfg.context, n_embd=cfg.width, n_layer=cfg.depth, n_head=cfg.heads,
                    n_inner=mlp_hidden(cfg), activation_function=_act(cfg), resid_pdrop=0.0, embd_pdrop=0.0,
                    attn_pdrop=0.0, layer_norm_epsilon=cfg.norm_eps)
    big = dict(common, hidden_size=cfg.width, num_hidden_layers=cfg.depth, num_attention_heads=cfg.heads,
               intermediate_size=mlp_hidden(cfg), max_position_embeddings=cfg.context, attention_dropout=0.0)
    if arch == "gpt_neox":
        return dict(big, hidden_act=_act(cfg), layer_norm_eps=cfg.norm_eps, use_parallel_residual=False,
                    rope_parameters=dict(rope, partial_rotary_factor=1.0), attention_bias=cfg.bias,
                    hidden_dropout=0.0)
    big.update(rms_norm_eps=cfg.norm_eps, rope_parameters=rope, num_key_value_heads=cfg.heads, attention_bias=cfg.bias)
    if arch == "llama":
        return dict(big, hidden_act="silu", mlp_bias=cfg.bias, head_dim=cfg.head_dim)
    if arch == "qwen3":
        return dict(big, hidden_act="silu", head_dim=cfg.head_dim, use_sliding_window=False,
                    layer_types=["full_attention"] * cfg.depth)
    if arch == "gemma2":
        return dict(big, hidden_activation="silu", head_dim=cfg.head_dim, query_pre_attn_scalar=cfg.head_dim,
                    sliding_window=cfg.context, layer_types=["full_attention"] * cfg.depth,
                    final_logit_softcapping=cfg.logit_softcap, attn_logit_softcapping=cfg.attn_softcap)
    if arch == "olmo2":
        return dict(big, hidden_act="silu")
    raise ValueError(arch)


def _act(cfg: "ModelConfig") -> str:
    return "gelu" if cfg.activation == "gelu" else "gelu_pytorch_tanh"


def gemma_embed_mul(cfg: "ModelConfig", scale: float | None) -> float:
    """Factor folded into Gemma 2's embedding table: normlab multiplies the embeddings by ``scale`` (None = 1),
    Gemma 2 by ``sqrt(width)``."""
    return (1.0 if scale is None else float(scale)) / math.sqrt(cfg.width)
