"""Attention kinds by name (``model.attention``): one registered class per kind, which declares its own facts.

Every registered kind is an ``nn.Module`` mapping ``x [B, T, in_width] -> [B, T, out_width]`` that is built from a
validated ``ModelConfig`` by ``from_config(cfg, rope, in_width=..., out_width=..., bias=..., dropout=...)``, and
declares as class attributes (``register_attention`` fills in the defaults of ``ATTENTION_FACTS``):

- ``paper``, ``description``: what ``normlab attention`` and ``docs/attention.md`` list;
- ``score_matrix`` (True): it forms a T x T score matrix, so ALiBi can bias it, extrapolation memory grows with T^2,
  and diagnostics can ask it for ``attention_probs(x) -> [B, H, T, T]`` (attention sinks); False for kernel
  (linear) attention, which keeps a recurrent state instead;
- ``options``: the ``ModelConfig`` keys only this kind reads, each ``key -> (default, message)``: another kind with
  the key away from its default is refused with ``message`` (``{att}`` = that kind);
- ``ranges`` ({}): the numeric ranges of the config keys it owns, ``key -> normlab.validate.Range``, checked for
  EVERY config whatever kind it chooses (the one declaration: ``normlab.validate`` checks every other numeric key),
  with the same one-line message as every numeric key (``normlab.validate.check_value``);
- ``qk_norm_refusal`` (""): why ``model.qk_norm`` has no meaning for this kind ("" = allowed);
- ``eval_keys`` (()): option keys that may change after training (``normlab eval --set``); the module applies
  them itself in ``apply_eval_options(cfg)``;
- ``convertible`` / ``exportable`` (False): exact norm conversion (``normlab convert``, which knows the fused
  ``qkv`` / ``proj`` projections) and HF export apply;

and may define these classmethods (each raises a one-line ``NormlabError``):

- ``check_keys(cfg)``: the allowed values of the config keys it owns, checked for EVERY config whatever kind it
  chooses (``model.linear_gate: dynamic`` is wrong everywhere);
- ``check_config(cfg)``: the rules that apply when this kind is chosen (combinations of its own options);
- ``check_context(cfg, context)``: refuse running a trained model at ``context`` tokens when the kind cannot
  (a static per-position table: linear attention's ``linear_gate: static``).

Adding a kind is one class with ``@register_attention("name")``: config validation, ``build_model``, the CLI
(``normlab attention``), extrapolation, diagnostics and the shared tests (``tests/test_attention.py``) find it here.
"""

from __future__ import annotations

from typing import Any

from normlab.errors import NormlabError, unknown
from normlab.validate import check_value

ATTENTION_FACTS: dict[str, Any] = {"paper": "", "description": "", "score_matrix": True, "options": {},
                                   "ranges": {}, "qk_norm_refusal": "", "eval_keys": (), "convertible": False,
                                   "exportable": False}

_REGISTRY: dict[str, type] = {}


def register_attention(name: str):
    """Class decorator: register an attention kind under ``name`` (must be unique; sets ``cls.kind``)."""

    def deco(cls: type) -> type:
        if name in _REGISTRY:
            raise ValueError(f"attention kind '{name}' registered twice")
        for fact, default in ATTENTION_FACTS.items():
            if not hasattr(cls, fact):
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
    """Registered kinds, in registration order (the shipped kinds: their modules' alphabetical order)."""
    return tuple(_REGISTRY)


def list_attention() -> list[dict[str, Any]]:
    """``[{name, description, paper, score_matrix, options, eval_keys, convertible, exportable}]`` for every
    registered kind, in registration order (``normlab attention``)."""
    return [{"name": n, "description": c.description, "paper": c.paper, "score_matrix": c.score_matrix,
             "options": list(c.options), "eval_keys": list(c.eval_keys), "convertible": c.convertible,
             "exportable": c.exportable} for n, c in _REGISTRY.items()]


def eval_time_keys() -> tuple[str, ...]:
    """Every kind's ``eval_keys``: the config keys ``normlab eval --set`` may change after training."""
    return tuple(dict.fromkeys(k for c in _REGISTRY.values() for k in c.eval_keys))


def _hooks(name: str) -> list:
    """Every kind's classmethod ``name`` once (a subclass that inherits it does not run it twice)."""
    out, seen = [], set()
    for cls in _REGISTRY.values():
        fn = getattr(cls, name, None)
        if fn is not None and getattr(fn, "__func__", fn) not in seen:
            seen.add(getattr(fn, "__func__", fn))
            out.append(fn)
    return out


def check_attention_config(cfg: Any) -> None:
    """The attention rules of a ``ModelConfig``: every kind's ``ranges`` and ``check_keys`` (the values of the keys
    it owns); the kind exists; options of other kinds stay at their defaults; ``qk_norm`` and ALiBi only where they
    mean something; the kind's own ``check_config``."""
    for cls in _REGISTRY.values():
        for key, rng in cls.ranges.items():
            check_value(f"model.{key}", getattr(cfg, key), rng)
    for check_keys in _hooks("check_keys"):
        check_keys(cfg)
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


def check_attention_context(cfg: Any, context: int) -> None:
    """A one-line error when the trained model's attention kind cannot run at ``context`` tokens (its
    ``check_context``; e.g. linear attention's static KV-gate table has one scale per training position)."""
    check = getattr(get_attention_class(cfg.attention), "check_context", None)
    if check is not None:
        check(cfg, context)
