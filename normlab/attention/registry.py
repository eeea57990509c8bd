"""Attention kinds by name (``model.attention``): one registered class per kind, which declares its own facts.

Every registered kind is an ``nn.Module`` mapping ``x [B, T, in_width] -> [B, T, out_width]`` that is built from a
validated ``ModelConfig`` by ``from_config(cfg, rope, in_width=..., out_width=..., bias=..., dropout=...)``, and
declares as class attributes (``register_attention`` fills in the defaults of ``ATTENTION_FACTS``):

- ``paper``, ``description``: what ``docs/attention.md`` lists;
- ``score_matrix`` (True): it forms a T x T score matrix, so ALiBi can bias it, extrapolation memory grows with T^2,
  and diagnostics can ask it for ``attention_probs(x) -> [B, H, T, T]`` (attention sinks); False for kernel
  (linear) attention, which keeps a recurrent state instead;
- ``options``: the ``ModelConfig`` keys only this kind reads, each ``key -> (default, message)``: another kind with
  the key away from its default is refused with ``message`` (``{att}`` = that kind);
- ``qk_norm_refusal`` (""): why ``model.qk_norm`` has no meaning for this kind ("" = allowed);
- ``eval_keys`` (()): option keys that may change after training (``normlab eval --set``); the module applies
  them itself in ``apply_eval_options(cfg)``;
- ``convertible`` / ``exportable`` (False): exact norm conversion (``normlab convert``, which knows the fused
  ``qkv`` / ``proj`` projections) and HF export apply;

and may define ``check_config(cfg)`` (a classmethod) for the value ranges of its own options. Adding a kind is one
class with ``@register_attention("name")``: config validation, ``build_model``, the CLI, extrapolation and the
shared tests (``tests/test_attention.py``) find it here.
"""

from __future__ import annotations

from typing import Any

from normlab.errors import unknown

ATTENTION_FACTS: dict[str, Any] = {"paper": "", "description": "", "score_matrix": True, "options": {},
                                   "qk_norm_refusal": "", "eval_keys": (), "convertible": False,
                                   "exportable": False}

_REGISTRY: dict[str, type] = {}


def register_attention(name: str):
    """Class decorator: register an attention kind under ``name`` (sets ``cls.kind``)."""

    def deco(cls: type) -> type:
        for fact, default in ATTENTION_FACTS.items():
            if fact not in vars(cls) and not any(fact in vars(b) for b in cls.__mro__[1:] if b is not object):
                setattr(cls, fact, default)
        cls.kind = name
        _REGISTRY[name] = cls
        return cls

    return deco


def get_attention_class(name: str) -> type:
    """The class of attention kind ``name``; an unknown name is a one-line error listing the kinds."""
    if name not in _REGISTRY:
        raise unknown("model.attention", name, _REGISTRY)
    return _REGISTRY[name]


def attention_names() -> tuple[str, ...]:
    """Registered kinds, in registration order."""
    return tuple(_REGISTRY)


def eval_time_keys() -> tuple[str, ...]:
    """Every kind's ``eval_keys``: the config keys ``normlab eval --set`` may change after training."""
    return tuple(dict.fromkeys(k for c in _REGISTRY.values() for k in c.eval_keys))


def check_attention_config(cfg: Any) -> None:
    """Kind-specific rules of a ``ModelConfig``: the kind exists; options of other kinds stay at their defaults;
    ``qk_norm`` and ALiBi only where they mean something; the kind's own ``check_config``."""
    from normlab.errors import NormlabError

    cls = get_attention_class(cfg.attention)
    if cfg.positions == "alibi" and not cls.score_matrix:
        raise NormlabError(f"model.positions 'alibi' biases a score matrix, which model.attention '{cfg.attention}' "
                           "never forms; use rope, learned or none")
    for other in _REGISTRY.values():
        for key, (default, message) in other.options.items():
            if key not in cls.options and getattr(cfg, key) != default:
                raise NormlabError(message.format(att=cfg.attention))
    if cfg.qk_norm and cls.qk_norm_refusal:
        raise NormlabError(f"model.qk_norm: {cls.qk_norm_refusal}")
    check = getattr(cls, "check_config", None)
    if check is not None:
        check(cfg)
