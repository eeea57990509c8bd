"""Pre-CRMSNorm GPT: the residual stream of width ``d`` stored in its first ``d - 1`` coordinates.

Jiang et al. 2023, "Pre-RMSNorm and Pre-CRMSNorm Transformers" (arXiv:2305.14858). When every residual-stream
writer is zero-mean over ``d``, a stream vector ``z [d]`` is determined by ``x = z[:d-1]`` (``z[d-1] = -sum(x)``):

- writers (token / position embeddings, attention ``proj``, MLP ``proj``) keep ``d - 1`` output rows;
- readers (attention ``qkv`` and, per kind, its gates; MLP ``fc`` / ``gate``; LM head) read ``x`` with
  ``W[:, :-1] - W[:, -1:]``;
- every norm is a ``CRMSNorm(d - 1)`` (normlab.norms.crmsnorm).

``model.width`` in the config stays the logical width ``d`` (heads, head_dim, MLP hidden size unchanged), so a
converted run's config reads like the Pre-LN model it is equivalent to, with ``norm: crmsnorm``.
``model.bias`` also gives the LM head a bias here (the final LayerNorm's bias folds into it), as does
``model.head_bias``.

Every attention kind works here: ``build_attention(..., in_width=d-1, out_width=d-1)`` builds it reading and
writing the compressed stream (heads and head_dim unchanged), so no attention forward is duplicated.

Shapes: ``idx [B, T] -> logits [B, T, vocab]``; hidden states ``[B, T, d-1]``; attention internals ``[B, H, T, d/H]``.
"""

from __future__ import annotations

from torch import nn

from normlab.attention import build_attention
from normlab.errors import NormlabError
from normlab.model.blocks import MLP
from normlab.model.config import ModelConfig
from normlab.model.gpt import GPT, init_weights
from normlab.norms import get_norm_class


class CRMSGPT(GPT):
    """GPT whose norm class declares ``compressed_stream`` (``model.norm: crmsnorm``): the residual stream is
    stored in ``width - 1`` coordinates. ``normlab.model.build_model`` picks it.

    Built as the full-width GPT, then every stream-facing layer is narrowed (fresh modules, re-initialised with
    the same scheme); works for every placement, since CRMSNorm keeps a zero-mean stream zero-mean.
    """

    def __init__(self, cfg: ModelConfig):
        norm_cls = get_norm_class(cfg.norm)
        if not norm_cls.compressed_stream:
            raise NormlabError(f"CRMSGPT needs a compressed-stream norm (model.norm 'crmsnorm'), got '{cfg.norm}'")
        if cfg.width < 2:
            raise NormlabError(f"model.norm '{cfg.norm}' stores width - 1 coordinates: model.width must be >= 2")
        super().__init__(cfg)
        s, bias = cfg.width - 1, cfg.bias
        self.tok_emb = nn.Embedding(cfg.vocab_size, s)
        if self.pos_emb is not None:
            self.pos_emb = nn.Embedding(cfg.context, s)
        for l, block in enumerate(self.blocks):
            mlp = block.mlp
            if type(mlp) is not MLP:
                raise NormlabError(f"model.norm '{cfg.norm}' supports the standard MLP only (block {l} has "
                                   f"{type(mlp).__name__})")
            # every attention kind reads and writes the compressed stream: in/out width d - 1, heads unchanged
            block.attn = build_attention(cfg, getattr(block.attn, "rope", None), in_width=s, out_width=s)
            hidden = mlp.fc.out_features
            mlp.fc = nn.Linear(s, hidden, bias=bias)
            if mlp.activation == "swiglu":
                mlp.gate = nn.Linear(s, hidden, bias=bias)
            mlp.proj = nn.Linear(hidden, s, bias=bias)
        # every norm site (whatever the placement) holds the norm built at full width: rebuild it at d - 1
        for name, m in list(self.named_modules()):
            if isinstance(m, norm_cls):
                parent, _, attr = name.rpartition(".")
                setattr(self.get_submodule(parent) if parent else self, attr,
                        norm_cls(s, eps=m.eps, affine=m.weight is not None, bias=m.bias is not None))
        self.lm_head = nn.Linear(s, cfg.vocab_size, bias=bias or cfg.head_bias)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight
        init_weights(self, cfg)
