"""Where norms sit in a block, as data (x-transformers idea, without one flag per norm).

A block has six optional norm sites around its two sublayers ``F`` (attention, MLP)::

    h = F(in_norm(x)); h = out_norm(h); x = post_norm(x + h)

- ``pre``    (Pre-LN, Xiong et al. 2020):   ``x = x + F(Norm(x))``; final norm before the LM head.
- ``post``   (original Transformer, Vaswani et al. 2017): ``x = Norm(x + F(x))``; no final norm.
- ``peri``   (Peri-LN, Kim et al. 2025; = Gemma 2 "sandwich"): ``x = x + Norm_out(F(Norm_in(x)))``; final norm and
  an embedding norm by default. The output-norm gain stays learnable (``ModelConfig.validate`` refuses
  ``affine: false`` for it).
- ``output`` (OLMo 2, OLMo et al. 2024): ``x = x + Norm(F(x))``, output norm only; final norm.
- ``deepnorm`` (DeepNet, Wang et al. 2022, arXiv:2203.00555; code microsoft/torchscale): Post-LN with the skip
  up-weighted, ``x = Norm(alpha * x + F(x))``, and the branch weights that write values (attention value and output
  projections, every MLP matrix) initialised ``beta`` times smaller. For a decoder-only model of ``N = depth``
  blocks (the paper's Table 1; torchscale's ``decoder_layers``): ``alpha = (2N)^(1/4)``, ``beta = (8N)^(-1/4)``
  (``deepnorm_alpha`` / ``deepnorm_beta``); no final norm (as Post-LN).
- ``mix``    (Mix-LN, Li et al. 2024; repo pixeli99/MixLN): the first ``floor(mix_alpha * L)`` blocks are Post-LN,
  the rest Pre-LN; final norm by default. As in the authors' code (``NORM_TYPE=post_pre``, ``POST_NUM`` Post-LN
  layers), the first Pre-LN block reads the post-normalised stream directly (no extra norm at the transition) and
  the model's final norm is applied whatever the split.

A placement maps the block index ``l`` (0-based), depth ``L`` and ``mix_alpha`` to the set of sites that hold a
norm; absent sites are ``nn.Identity``. ``skip(L)`` is the factor on the residual (skip) path, 1 except DeepNorm;
``init_gain(L)`` (None: none) multiplies the init std of the value-writing weights and replaces the GPT-2
``1/sqrt(2L)`` residual-writer scale (DeepNorm's ``beta``). ``final_norm`` / ``embed_norm`` are the placement's
defaults for the two model-level norms (``model.final_norm`` / ``model.embed_norm`` override them; ``None`` = default).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

SITES = ("attn_in", "attn_out", "attn_post", "mlp_in", "mlp_out", "mlp_post")
IN_SITES = ("attn_in", "mlp_in")
OUT_SITES = ("attn_out", "mlp_out")

_PRE = frozenset({"attn_in", "mlp_in"})
_POST = frozenset({"attn_post", "mlp_post"})
_PERI = frozenset({"attn_in", "attn_out", "mlp_in", "mlp_out"})
_OUTPUT = frozenset({"attn_out", "mlp_out"})


def mix_post_blocks(depth: int, alpha: float) -> int:
    """Number of leading Post-LN blocks in Mix-LN: ``floor(alpha * L)`` (0.25 * 12 = 3, 0.25 * 24 = 6).

    A tolerance of 1e-9 absorbs binary rounding (``0.29 * 100`` is ``28.999...`` in floating point, meant as 29).
    """
    return math.floor(alpha * depth + 1e-9)


def deepnorm_alpha(depth: int) -> float:
    """DeepNorm's skip weight for a decoder-only model of ``depth`` blocks: ``(2N)^(1/4)`` (Wang et al. 2022,
    Table 1; torchscale ``DecoderLayer.alpha``)."""
    return (2.0 * depth) ** 0.25


def deepnorm_beta(depth: int) -> float:
    """DeepNorm's init gain for a decoder-only model of ``depth`` blocks: ``(8N)^(-1/4)`` (Wang et al. 2022, Table 1;
    torchscale divides the FFN, value and output projection weights by ``(8N)^(1/4)``)."""
    return (8.0 * depth) ** -0.25


@dataclass(frozen=True)
class Placement:
    """``sites(l, L, mix_alpha)`` -> norm sites present in block ``l`` (0-based); model-level norm defaults;
    ``skip(L)`` the residual-path factor; ``init_gain(L)`` the value-writer init gain (None: GPT-2's scheme)."""

    name: str
    sites: Callable[[int, int, float], frozenset[str]]
    final_norm: bool
    embed_norm: bool
    paper: str
    skip: Callable[[int], float] = lambda L: 1.0
    init_gain: Callable[[int], float] | None = None


PLACEMENTS: dict[str, Placement] = {
    "pre": Placement(
        "pre", lambda l, L, a: _PRE, True, False,
        "Xiong et al. 2020, On Layer Normalization in the Transformer Architecture",
    ),
    "post": Placement(
        "post", lambda l, L, a: _POST, False, False,
        "Vaswani et al. 2017, Attention Is All You Need",
    ),
    "peri": Placement(
        "peri", lambda l, L, a: _PERI, True, True,
        "Kim et al. 2025, Peri-LN: Revisiting Normalization Layer in the Transformer Architecture",
    ),
    "output": Placement(
        "output", lambda l, L, a: _OUTPUT, True, False,
        "OLMo et al. 2024, 2 OLMo 2 Furious (output-norm-only blocks)",
    ),
    "deepnorm": Placement(
        "deepnorm", lambda l, L, a: _POST, False, False,
        "Wang et al. 2022, DeepNet: Scaling Transformers to 1,000 Layers (arXiv:2203.00555)",
        skip=deepnorm_alpha, init_gain=deepnorm_beta,
    ),
    "mix": Placement(
        "mix", lambda l, L, a: _POST if l < mix_post_blocks(L, a) else _PRE, True, False,
        "Li et al. 2024, Mix-LN: Unleashing the Power of Deeper Layers by Combining Pre-LN and Post-LN",
    ),
}


# ``cfg`` below is a ModelConfig; typed ``Any`` so this table does not import model.config, which imports it
def block_sites(cfg: Any, l: int) -> frozenset[str]:
    """Norm sites of block ``l`` (0-based) for ``cfg``."""
    return PLACEMENTS[cfg.placement].sites(l, cfg.depth, cfg.mix_alpha)


def final_norm_on(cfg: Any) -> bool:
    """Whether the model has a final norm before the LM head (``model.final_norm``, else the placement default)."""
    return PLACEMENTS[cfg.placement].final_norm if cfg.final_norm is None else cfg.final_norm


def embed_norm_on(cfg: Any) -> bool:
    """Whether the embeddings are normalised before block 0 (``model.embed_norm``, else the placement default)."""
    return PLACEMENTS[cfg.placement].embed_norm if cfg.embed_norm is None else cfg.embed_norm


def sites_used(cfg: Any) -> frozenset[str]:
    """Union of the norm sites over all blocks (e.g. to ask whether a model has input or output norms)."""
    return frozenset().union(*(block_sites(cfg, l) for l in range(cfg.depth)))


def layernorm_scale(cfg: Any, l: int) -> float:
    """LayerNorm Scaling factor for block ``l`` (0-based): ``1/sqrt(l+1)`` when on and the block has input norms.

    Sun et al. 2025, "The Curse of Depth in Large Language Models" (repo lmsdss/LayerNorm-Scaling): each
    input-norm output of the block at depth ``l' = l + 1`` is multiplied by ``1/sqrt(l')``; residual, embedding
    and final norms are untouched.
    """
    if not cfg.layernorm_scaling or not (block_sites(cfg, l) & set(IN_SITES)):
        return 1.0
    return 1.0 / math.sqrt(l + 1)


def skip_scale(cfg: Any) -> float:
    """Factor on the residual (skip) path of every block: DeepNorm's ``alpha``, else 1."""
    return PLACEMENTS[cfg.placement].skip(cfg.depth)


def init_gain(cfg: Any) -> float | None:
    """DeepNorm's ``beta`` for the value-writing weights (None for the other placements: GPT-2's init)."""
    gain = PLACEMENTS[cfg.placement].init_gain
    return None if gain is None else gain(cfg.depth)


def residual_scale(cfg: Any) -> float | None:
    """Branch-output multiplier: 1 (``none``), ``1/sqrt(2L)`` (``fixed``), or None (``learnable``, init 0)."""
    if cfg.residual_scale == "fixed":
        return 1.0 / math.sqrt(2 * cfg.depth)
    return None if cfg.residual_scale == "learnable" else 1.0
