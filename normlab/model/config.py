"""Typed, validated model configuration (litgpt style: strings name choices, validated when built)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from normlab.errors import NormlabError, unknown
from normlab.model.outputs import OUTPUTS
from normlab.validate import check_config, check_param_total

ACTIVATIONS = ("gelu", "gelu_tanh", "swiglu", "selu")
POSITIONS = ("rope", "learned", "alibi", "none")
NORM_GROUPS = ("attn", "mlp", "final", "embed")
RESIDUAL_SCALES = ("none", "fixed", "learnable")
EMBED_SCALES = ("auto", "none", "fixed", "learnable")


@dataclass
class ModelConfig:
    """Decoder-only GPT shape and normalization choices.

    ``vocab_size`` is normally filled in from the tokenizer; ``context`` is the training sequence length.
    ``mlp_hidden`` (None = derived from ``mlp_ratio``) sets the MLP hidden size directly.
    Placement keys (docs/placements.md): ``placement`` (pre, post, peri, output, mix), ``final_norm`` and
    ``embed_norm`` (None = the placement's default), ``mix_alpha`` (Mix-LN share of Post-LN blocks),
    ``layernorm_scaling`` (Curse of Depth, ``1/sqrt(l)`` on input-norm outputs), ``residual_scale``
    (``none``, ``fixed`` = ``1/sqrt(2L)``, ``learnable`` = one scalar per branch initialised to 0).
    ``embed_scale`` multiplies the token embeddings: ``none``, ``fixed`` (``sqrt(width)``), ``learnable`` (one
    scalar initialised to ``sqrt(width)``, after the DyT authors' LLaMA recipe) or ``auto`` (what the norm class
    asks for: ``learnable`` from ``1 / init_std`` for ``norm: dyt``, else ``none``); ``embed_scale_init`` sets the
    (initial) value.

    Attention keys (docs/attention.md): ``attention`` (a registered kind, default softmax;
    ``normlab attention`` lists them), ``positions`` (rope, learned, alibi, none), ``qk_norm`` (softmax, linear)
    and ``qk_norm_scope`` (``head``: one RMSNorm over each
    head's ``head_dim``, Qwen3 style; ``width``: one over all heads' concatenated q / k, OLMo 2 style; softmax only),
    ``attn_softcap`` (softmax), ``lssa_reweight`` /
    ``lssa_power`` (softplus; evaluation-time switchable), ``linear_conv`` / ``linear_conv_source`` (``value``:
    NaLaFormer's causal depthwise conv of the values; ``input``: LINA's, of the attention input) / ``linear_gate`` /
    ``linear_chunk`` (linear, nala). Pairs without a meaning are refused by ``validate``.

    ``output``: the output probability map, ``softmax`` or ``stablemax`` (Prieto et al. 2025; the model then
    returns ``log StableMax(logits)``, normlab.model.outputs), after ``logit_softcap`` when both are set.
    """

    vocab_size: int = 256
    context: int = 128
    width: int = 128
    depth: int = 4
    heads: int = 4
    mlp_ratio: float = 4.0
    mlp_hidden: int | None = None
    activation: str = "gelu"
    positions: str = "rope"
    attention: str = "softmax"
    qk_norm: bool = False
    qk_norm_scope: str = "head"
    attn_softcap: float | None = None
    lssa_reweight: bool = False
    lssa_power: float = 15.0
    linear_conv: int = 0
    linear_conv_source: str = "value"
    linear_gate: str = "none"
    linear_chunk: int = 64
    rope_base: float = 10000.0
    dropout: float = 0.0
    tie_embeddings: bool = True
    bias: bool = False
    norm: str = "layernorm"
    norm_eps: float = 1e-5
    norm_options: dict[str, Any] = field(default_factory=dict)
    placement: str = "pre"
    final_norm: bool | None = None
    embed_norm: bool | None = None
    mix_alpha: float = 0.25
    layernorm_scaling: bool = False
    residual_scale: str = "none"
    embed_scale: str = "auto"
    embed_scale_init: float | None = None
    head_bias: bool = False
    logit_softcap: float | None = None
    output: str = "softmax"
    init_std: float = 0.02

    def validate(self) -> "ModelConfig":
        """Check cross-field constraints; raise a one-line NormlabError naming the field."""
        from normlab.model.placements import PLACEMENTS
        from normlab.norms import get_norm_class

        check_config(self, "model.")  # numeric ranges: normlab.validate.RANGES (attention options: their kinds)
        if self.width % self.heads:
            raise NormlabError(
                f"model.width ({self.width}) must be divisible by model.heads ({self.heads})"
            )
        if self.positions == "rope" and (self.width // self.heads) % 2:
            raise NormlabError(f"model.positions 'rope' needs an even head dim, got {self.width // self.heads}")
        if self.activation not in ACTIVATIONS:
            raise unknown("model.activation", self.activation, ACTIVATIONS)
        if self.positions not in POSITIONS:
            raise unknown("model.positions", self.positions, POSITIONS)
        if self.placement not in PLACEMENTS:
            raise unknown("model.placement", self.placement, PLACEMENTS)
        if self.output not in OUTPUTS:  # normlab.model.outputs: softmax or StableMax (Prieto et al. 2025)
            raise unknown("model.output", self.output, OUTPUTS)
        check_param_total(self)  # every size within its range can still multiply to terabytes
        self._validate_attention()
        self._validate_placement()
        get_norm_class(self.norm)
        from normlab.norms import build_norm

        for group in NORM_GROUPS:  # unknown or invalid norm options fail here, not mid-build
            build_norm(self.norm, self.width, eps=self.norm_eps, **self.norm_kwargs(group))
        return self

    def _validate_attention(self) -> None:
        """Attention kind, its options and the position encoding: refuse pairs without a meaning (one line). Every
        rule is declared by the registered kinds (normlab.attention.registry: each kind's options, check_keys and
        check_config), so a new kind brings its own."""
        from normlab.attention import check_attention_config

        check_attention_config(self)

    def _validate_placement(self) -> None:
        from normlab.model.placements import IN_SITES, OUT_SITES, sites_used

        if self.residual_scale not in RESIDUAL_SCALES:
            raise unknown("model.residual_scale", self.residual_scale, RESIDUAL_SCALES)
        if self.embed_scale not in EMBED_SCALES:
            raise unknown("model.embed_scale", self.embed_scale, EMBED_SCALES)
        used = sites_used(self)
        if self.layernorm_scaling and not used & set(IN_SITES):
            raise NormlabError(
                f"model.layernorm_scaling scales input-norm outputs, but placement '{self.placement}' has no input "
                "norms (use pre, peri or mix)"
            )
        if used & set(OUT_SITES):
            for group in ("attn", "mlp"):  # Peri-LN: the output-norm gain must stay learnable (Kim et al. 2025)
                if self.norm_kwargs(group).get("affine") is False:
                    raise NormlabError(
                        f"model.norm_options: placement '{self.placement}' needs a learnable output-norm gain; "
                        "affine=false may only apply to the final and embed groups (affine@final, affine@embed)"
                    )

    def norm_kwargs(self, group: str) -> dict[str, Any]:
        """Options for a norm at a site of ``group`` (``attn``, ``mlp``, ``final``, ``embed``).

        ``norm_options`` keys apply to every site; ``key@group`` keys apply to one group and win, e.g.
        ``{alpha_init: 0.5, alpha_init@attn: 0.8}`` (DyT's per-site alpha init). Values the norm class resolves
        from the width and the group are filled in (``normlab.norms.registry.resolve_norm_options``: DyT's
        ``alpha_init: auto``).
        """
        out = {k: v for k, v in self.norm_options.items() if "@" not in k}
        for k, v in self.norm_options.items():
            if "@" in k:
                name, _, grp = k.partition("@")
                if grp not in NORM_GROUPS:
                    raise NormlabError(f"model.norm_options key '{k}': group must be one of {', '.join(NORM_GROUPS)}")
                if grp == group:
                    out[name] = v
        from normlab.norms.registry import resolve_norm_options

        return resolve_norm_options(self.norm, self.width, group, out)  # e.g. DyT's alpha_init: auto

    @property
    def embed_scale_kind(self) -> str:
        """``embed_scale`` with ``auto`` resolved by the norm class (``auto_embed_scale``: ``learnable`` for DyT,
        whose authors scale the LLaMA token embeddings by a learnable scalar; ``none`` for the others)."""
        if self.embed_scale == "auto":
            from normlab.norms.registry import auto_embed_scale

            return auto_embed_scale(self.norm)
        return self.embed_scale

    @property
    def head_dim(self) -> int:
        return self.width // self.heads
