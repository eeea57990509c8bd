"""Typed, validated model configuration (litgpt style: strings name choices, validated when built). Each key is
declared once, with its help, range or choices and other tools' names for it (``normlab.validate.setting``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from normlab.attention import attention_names, check_attention_config
from normlab.attention.linear import CONV_SOURCES, GATES
from normlab.attention.softmax import QK_NORM_SCOPES
from normlab.errors import NormlabError
from normlab.model.outputs import OUTPUTS
from normlab.model.placements import IN_SITES, OUT_SITES, PLACEMENTS, sites_used, skip_scale
from normlab.model.streams import get_connection_class, residual_names
from normlab.norms import build_norm, get_norm_class, norm_names
from normlab.norms.registry import auto_embed_scale, resolve_norm_options
from normlab.validate import POS, UNIT_OPEN_HI, I, R, check_param_total, check_section, setting

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
    Placement keys (docs/placements.md): ``placement`` (pre, post, peri, output, mix, deepnorm), ``final_norm`` and
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

    vocab_size: int = setting(256, "number of token ids (filled in from the tokenizer)", range=I(1, 2**24))
    context: int = setting(128, "training sequence length in tokens", range=I(1, 2**20),
                           aliases=("block_size", "max_position_embeddings", "n_positions", "n_ctx", "seq_len",
                                    "seq_length", "max_seq_len", "context_length"))
    width: int = setting(128, "residual stream width d_model", range=I(1, 2**16),
                         aliases=("n_embd", "hidden_size", "d_model", "dim", "embed_dim", "n_embed"))
    depth: int = setting(4, "number of transformer blocks", range=I(1, 4096),
                         aliases=("n_layer", "n_layers", "num_layers", "num_hidden_layers", "layers"))
    heads: int = setting(4, "attention heads (width must be divisible by heads)", range=I(1, 2**16),
                         aliases=("n_head", "n_heads", "num_heads", "num_attention_heads"))
    mlp_ratio: float = setting(4.0, "MLP hidden size as a multiple of width (times 2/3 for swiglu)",
                               range=R(0, 64, lo_open=True), aliases=("intermediate_size", "d_ff", "ffn_dim"),
                               alias_note="normlab takes the ratio {alias} / width")
    mlp_hidden: int | None = setting(None, "MLP hidden size directly (null: derived from mlp_ratio)",
                                     range=I(1, 2**24))
    activation: str = setting("gelu", "MLP activation", choices=ACTIVATIONS,
                              aliases=("hidden_act", "activation_function"))
    positions: str = setting("rope", "position encoding: rope, learned table, alibi bias or none", choices=POSITIONS)
    attention: str = setting("softmax", "attention kind (normlab attention lists them; docs/attention.md)",
                             choices=attention_names)
    qk_norm: bool = setting(False, "RMSNorm on queries and keys before the scores (softmax, linear)")
    qk_norm_scope: str = setting("head", "qk_norm over each head's head_dim (head, Qwen3) or over all heads' q, k "
                                 "(width, OLMo 2)", choices=QK_NORM_SCOPES, owner="attention")
    attn_softcap: float | None = setting(None, "softmax score cap c: s = c * tanh(s / c) (null: no cap)",
                                         owner="attention", aliases=("attn_logit_softcapping",))
    lssa_reweight: bool = setting(False, "softplus attention's LSSAR re-weighting (switchable at evaluation time)")
    lssa_power: float = setting(15.0, "exponent of the LSSAR re-weighting (softplus attention)", owner="attention")
    linear_conv: int = setting(0, "kernel size of the causal depthwise convolution (linear, nala; 0: none)",
                               owner="attention")
    linear_conv_source: str = setting("value", "what the convolution runs over: value (NaLaFormer) or input (LINA)",
                                      choices=CONV_SOURCES, owner="attention")
    linear_gate: str = setting("none", "KV gate of linear attention: none, static (per head and position) or "
                               "sigmoid", choices=GATES, owner="attention")
    linear_chunk: int = setting(64, "chunk length of linear attention's prefix sums (speed only; same outputs)",
                                owner="attention")
    rope_base: float = setting(10000.0, "RoPE frequency base theta", range=POS,
                               aliases=("rope_theta", "rotary_emb_base"))
    dropout: float = setting(0.0, "dropout probability on attention and residual branches", range=UNIT_OPEN_HI,
                             aliases=("resid_pdrop", "embd_pdrop", "attn_pdrop", "hidden_dropout",
                                      "attention_dropout"), alias_note="one dropout rate for all sites")
    tie_embeddings: bool = setting(True, "share the token embedding with the LM head",
                                   aliases=("tie_word_embeddings",))
    bias: bool = setting(False, "biases in the linear layers")
    norm: str = setting("layernorm", "the normalization layer (normlab norms lists them; docs/norms.md)",
                        choices=norm_names, owner="norms", aliases=("norm_type", "normalization"))
    norm_eps: float = setting(1e-5, "epsilon added inside the norm's statistic", range=POS,
                              aliases=("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "norm_epsilon"))
    norm_options: dict[str, Any] = setting(help="extra options of the norm; key@group for one site group (attn, "
                                           "mlp, final, embed)", factory=dict)
    placement: str = setting("pre", "where norms sit in a block: pre, post, peri, output, mix or deepnorm "
                             "(docs/placements.md)", choices=tuple(PLACEMENTS))
    final_norm: bool | None = setting(None, "norm before the LM head (null: the placement's default)")
    embed_norm: bool | None = setting(None, "norm after the token embedding (null: the placement's default)")
    mix_alpha: float = setting(0.25, "Mix-LN: share of blocks (the first ones) that use Post-LN", range=R(0, 1))
    layernorm_scaling: bool = setting(False, "scale input-norm outputs of block l by 1/sqrt(l) (Curse of Depth)")
    residual_scale: str = setting("none", "residual branch scale: none, fixed 1/sqrt(2L), or learnable (a scalar "
                                  "per branch, init 0)", choices=RESIDUAL_SCALES)
    residual: str = setting("add", "residual stream: add (one stream), hc (hyper-connections), mhc (manifold-"
                            "constrained hyper-connections) or ngpt (the hypersphere update) (docs/streams.md)",
                            choices=tuple(residual_names()), identity="dropped at default")
    streams: int = setting(4, "residual streams n of hc / mhc (the expansion rate; ignored by add)", range=I(1, 64),
                           aliases=("num_residual_streams", "hyper_connection_count", "expansion_rate"),
                           identity="dropped at default")
    hc_dynamic: bool = setting(True, "hc / mhc: per-token dynamic maps on top of the static ones (false: static)",
                               identity="dropped at default")
    sinkhorn_iters: int = setting(20, "mhc: Sinkhorn-Knopp iterations of the doubly stochastic projection",
                                  range=I(0, 1000), identity="dropped at default")
    ngpt_alpha_init: float = setting(0.05, "ngpt: initial eigen learning rates alpha_A, alpha_M", range=POS,
                                     identity="dropped at default")
    embed_scale: str = setting("auto", "token-embedding scale: auto (as the norm asks), none, fixed sqrt(width) or "
                               "learnable", choices=EMBED_SCALES)
    embed_scale_init: float | None = setting(None, "(initial) embedding scale (null: sqrt(width), or 1/init_std for "
                                             "dyt's auto)", range=POS)
    head_bias: bool = setting(False, "a bias on the LM head (lets convert fold a final norm's bias into it)")
    logit_softcap: float | None = setting(None, "output logit cap c: z = c * tanh(z / c) (Gemma 2; null: no cap)",
                                          range=POS, aliases=("final_logit_softcapping",))
    output: str = setting("softmax", "output distribution: softmax, or StableMax (Prieto et al. 2025; "
                          "docs/output.md)", choices=OUTPUTS)
    init_std: float = setting(0.02, "standard deviation of the normal weight initialisation", range=POS,
                              aliases=("initializer_range",))

    def validate(self) -> "ModelConfig":
        """Check each key's declared range and choices, then the cross-field constraints; raise a one-line
        NormlabError naming the field."""
        check_section(self, "model.")  # each field's range / choices (attention options: their kinds)
        if self.width % self.heads:
            raise NormlabError(
                f"model.width ({self.width}) must be divisible by model.heads ({self.heads})"
            )
        if self.positions == "rope" and (self.width // self.heads) % 2:
            raise NormlabError(f"model.positions 'rope' needs an even head dim, got {self.width // self.heads}")
        check_param_total(self)  # every size within its range can still multiply to terabytes
        self._validate_attention()
        self._validate_placement()
        get_norm_class(self.norm)
        for group in NORM_GROUPS:  # unknown or invalid norm options fail here, not mid-build
            build_norm(self.norm, self.width, eps=self.norm_eps, **self.norm_kwargs(group))
        return self

    def _validate_attention(self) -> None:
        """Attention kind, its options and the position encoding: refuse pairs without a meaning (one line). Every
        rule is declared by the registered kinds (normlab.attention.registry: each kind's options, check_keys and
        check_config), so a new kind brings its own."""
        check_attention_config(self)

    def _validate_placement(self) -> None:
        used = sites_used(self)
        if self.residual != "add":
            if used & {"attn_post", "mlp_post"} or skip_scale(self) != 1.0:
                raise NormlabError(f"model.residual '{self.residual}' mixes residual streams around each sublayer, "
                                   f"which placement '{self.placement}' normalises after the addition: use pre, peri "
                                   "or output")
            if self.normalized:
                self._validate_ngpt()
            if get_norm_class(self.norm).compressed_stream:
                raise NormlabError(f"model.residual '{self.residual}' with model.norm '{self.norm}': the compressed "
                                   "stream holds one stream of width - 1 coordinates; use add")
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

    def _validate_ngpt(self) -> None:
        """nGPT normalises the hidden states itself and its weight rows after every step: the pairs it has no
        meaning with are refused (docs/streams.md)."""
        need = [("model.norm", self.norm, "none"), ("model.tie_embeddings", self.tie_embeddings, False),
                ("model.attention", self.attention, "softmax"), ("model.qk_norm", self.qk_norm, False),
                ("model.bias", self.bias, False), ("model.final_norm", bool(self.final_norm), False),
                ("model.embed_norm", bool(self.embed_norm), False), ("model.head_bias", self.head_bias, False),
                ("model.positions", self.positions if self.positions == "learned" else "rope", "rope")]
        for key, got, want in need:
            if got != want:
                raise NormlabError(f"model.residual 'ngpt' needs {key}: {str(want).lower()} (nGPT normalises the "
                                   f"hidden states and weight rows itself), got {str(got).lower()}")
        if self.embed_scale not in ("auto", "none") or self.logit_softcap is not None or self.output != "softmax":
            raise NormlabError("model.residual 'ngpt' reads unit-norm embeddings and scales its logits by s_z: "
                               "model.embed_scale auto or none, no model.logit_softcap, model.output softmax")

    @property
    def normalized(self) -> bool:
        """Whether the residual kind is nGPT's hypersphere (its class declares ``normalized``): unit-norm
        embeddings, weight rows and hidden states, scaled q/k, s_u / s_v and scaled logits."""
        return bool(getattr(get_connection_class(self.residual), "normalized", False))

    def norm_kwargs(self, group: str) -> dict[str, Any]:
        """Options for a norm at a site of ``group`` (``attn``, ``mlp``, ``final``, ``embed``).

        ``norm_options`` keys apply to every site; ``key@group`` keys apply to one group and win, e.g.
        ``{alpha_init: 0.5, alpha_init@attn: 0.8}`` (DyT's per-site alpha init). Values the norm class resolves
        from the width and the group are filled in (``normlab.norms.registry.resolve_norm_options``: DyT's
        ``alpha_init: auto``).
        """
        out = {k: v for k, v in self.norm_options.items() if "@" not in k}
        for k, v in self.norm_options.items():
            if k.partition("@")[0] == "eps":  # build_norm gets eps=norm_eps beside these options
                raise NormlabError(f"model.norm_options key '{k}': a norm's eps is model.norm_eps (one value for "
                                   "every site); set that key instead")
            if "@" in k:
                name, _, grp = k.partition("@")
                if grp not in NORM_GROUPS:
                    raise NormlabError(f"model.norm_options key '{k}': group must be one of {', '.join(NORM_GROUPS)}")
                if grp == group:
                    out[name] = v
        return resolve_norm_options(self.norm, self.width, group, out)  # e.g. DyT's alpha_init: auto

    @property
    def embed_scale_kind(self) -> str:
        """``embed_scale`` with ``auto`` resolved by the norm class (``auto_embed_scale``: ``learnable`` for DyT,
        whose authors scale the LLaMA token embeddings by a learnable scalar; ``none`` for the others)."""
        if self.embed_scale == "auto":
            return auto_embed_scale(self.norm)
        return self.embed_scale

    @property
    def head_dim(self) -> int:
        return self.width // self.heads
