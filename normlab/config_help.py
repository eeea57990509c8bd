"""Every config key with its type, default, allowed values and a one-line description (``normlab config``).

Each row is read from the key's own declaration (:data:`normlab.config.KEYS`: the field's annotation and default,
and the facts its ``normlab.validate.setting`` declares: help, range, choices), so it lists what validation
checks: the declared range or choices; for an attention kind's options (``owner="attention"``) the owning kind's
``ranges``; norms and attention kinds from their registries. ``tests/test_config_help.py`` checks that each listed
range and choice list is exactly what validation accepts and refuses.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

from normlab.attention import attention_names, get_attention_class
from normlab.config import KEYS, RunConfig, _type_name
from normlab.validate import Range


def key_range(key: str) -> Range | None:
    """The numeric range validation checks for ``key``: its declared range, else the attention kind that owns
    it."""
    facts = KEYS[key].facts
    if facts.range is not None:
        return facts.range
    if facts.owner == "attention":
        for cls in map(get_attention_class, attention_names()):
            if key[len("model."):] in cls.ranges:
                return cls.ranges[key[len("model."):]]
    return None


def _get(cfg: RunConfig, key: str) -> Any:
    node: Any = cfg
    for part in key.split("."):
        node = getattr(node, part)
    return node


def _word(v: Any) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


def describe_keys(cfg: RunConfig | None = None) -> list[dict[str, Any]]:
    """One row per config key, in config order: ``key``, ``value`` (in ``cfg``; the default without one),
    ``type``, ``default``, ``allowed`` (text) with ``range`` (``{lo, hi, lo_open, hi_open, integer}``) or
    ``choices``, and ``description``."""
    rows = []
    for key, (tp, default, facts) in KEYS.items():
        rng = key_range(key)
        row: dict[str, Any] = {"key": key, "value": _get(cfg, key) if cfg is not None else default,
                               "type": "mapping" if typing.get_origin(tp) is dict else _type_name(tp),
                               "default": default}
        nullable = type(None) in typing.get_args(tp)
        choices = facts.allowed()
        if choices is not None:
            row["choices"] = [_word(c) for c in choices]
            many = "a list of any of " if typing.get_origin(tp) is list else "one of "
            row["allowed"] = many + ", ".join(row["choices"]) + (" or null" if nullable else "")
        elif rng is not None:
            row["range"] = dataclasses.asdict(rng)
            row["allowed"] = rng.text() + (" or null" if nullable else "")
        elif tp is bool or typing.get_args(tp) == (bool, type(None)):
            row["allowed"] = "true or false" + (" or null" if nullable else "")
        else:
            row["allowed"] = "any " + row["type"]
        row["description"] = facts.help
        rows.append(row)
    return rows
