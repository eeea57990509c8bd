"""Attention kinds (``model.attention``) and position encodings (``model.positions``); docs/attention.md.

- ``linear``   -- normlab.attention.linear (LINA: relu kernel, causal division normalisation, conv, KV gate)
- ``nala``     -- normlab.attention.nala (NaLaFormer norm-aware kernel)
- ``softmax``  -- normlab.attention.softmax (SDPA; QK-norm, score softcap, ALiBi; the default)
- ``softplus`` -- normlab.attention.softplus (LSSA, re-weighting LSSAR)
- ``transnormer`` -- normlab.attention.transnormer (TransNormer NormAttention: no denominator, SRMSNorm output)

Each kind is one class registered in ``normlab.attention.registry`` that declares its own facts (config options and
their checks, score matrix, eval-time keys, context limit, convertible/exportable); the registry is the one list of
kind names (``attention_names()``, ``normlab attention``). ``build_attention(cfg, rope, in_width=..., out_width=...)``
builds the registered class of ``cfg.attention``.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

from torch import nn

from normlab.attention.base import AttentionState
from normlab.attention.positions import RotaryEmbedding
from normlab.attention.registry import (attention_names, check_attention_config, check_attention_context,
                                        eval_time_keys, get_attention_class, list_attention, register_attention)

# every other module of this package holds kinds that register themselves on import (alphabetical order: the order
# of attention_names(), the docs and the CLI), so a new kind is one registered class in one file, as for norms
for _info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
    if _info.name not in ("base", "dropout", "positions", "registry"):
        importlib.import_module(f"{__name__}.{_info.name}")


def build_attention(cfg: Any, rope: RotaryEmbedding | None, *, in_width: int | None = None,
                    out_width: int | None = None) -> nn.Module:
    """The attention module of ``cfg.attention`` (validated config): its registered class's ``from_config``.
    ``in_width`` / ``out_width``: residual-stream width read and written (default ``cfg.width``; ``width - 1`` in
    the Pre-CRMSNorm model)."""
    cls = get_attention_class(cfg.attention)
    return cls.from_config(cfg, rope, in_width=in_width, out_width=out_width, bias=cfg.bias, dropout=cfg.dropout)


def set_eval_options(model: nn.Module, cfg: Any) -> None:
    """Apply the evaluation-time keys of ``cfg`` (``eval_time_keys()``) to the attention modules of a built model
    (each kind's ``apply_eval_options``)."""
    for m in model.modules():
        if callable(getattr(m, "apply_eval_options", None)):
            m.apply_eval_options(cfg)


__all__ = ["AttentionState", "RotaryEmbedding", "attention_names", "build_attention", "check_attention_config",
           "check_attention_context", "eval_time_keys", "get_attention_class", "list_attention", "register_attention",
           "set_eval_options"]
