"""The typed loader of a sweep file's top-level keys (normlab.experiments.sweep): one dataclass field per key,
each with the reader that checks it (``_key``: a one-line ``NormlabError`` naming the key and what is allowed), read
in field order; then the checks that involve two keys (a sequential plan extends the seeds, a replication's seed
block is fresh, ``lr_grid`` owns ``train.lr``). The question keys are read by normlab.decide.question and the
size keys by normlab.experiments.sizes, once the runs' group labels are known.

The resolved spec this produces (``SweepFile.spec``, stored as ``SWEEP_DIR/sweep.yaml``) is read back typed by
normlab.experiments.sweepspec.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from normlab.config import _all_keys, _mapping_keys, read_yaml, resolve_config_path, suggest_key
from normlab.errors import NormlabError, check_keys
from normlab.experiments.grid import expand_grid
from normlab.decide.plan import resolve_plan
from normlab.decide.question import QUESTION_KEYS
from normlab.experiments.sizes import SIZE_KEYS

PLAN_KEYS = ("sequential", "replicate", "replicate_seeds")  # normlab.decide.plan
PROVENANCE_KEYS = ("designed_from",)
"""What informed a declared design (earlier runs, their seeds and data): recorded, not hashed; the design's own
seed block must be disjoint from the seeds it names (docs/compare.md, "Seed blocks")."""
TOP_KEYS = ("name", "description", "base", "set", "axes", "variants", "seeds", "lr_grid", "baseline", *QUESTION_KEYS,
            *PLAN_KEYS, *PROVENANCE_KEYS, *SIZE_KEYS)
LR_KEY = "train.lr"
SECTIONS = ("data", "model", "train", "optim")
MAX_RUNS = 10_000
"""The most runs one sweep may expand to (variants x axes x sizes x seeds), checked before expanding."""
MAX_NAME = 200
"""The longest variant name (it becomes part of run ids, labels, tables and file names)."""


@dataclass(frozen=True)
class Where:
    """What a reader needs besides the value: the file's name for messages and its folder for relative paths."""

    source: str
    here: Path | None


def check_key(key: str, where: str) -> None:
    """A dotted config key a sweep may override (``seed`` is the sweep's own)."""
    if key == "seed":
        raise NormlabError(f"{where}: 'seed' is set by the sweep's 'seeds:' list, not as an override")
    if key in _all_keys():
        return
    if any(key.startswith(f"{m}.") and key.count(".") == m.count(".") + 1 for m in _mapping_keys()):
        return
    raise NormlabError(f"{where}: unknown config key '{key}'{suggest_key(key, _all_keys())}")


def flatten(data: Any, where: str, prefix: str = "") -> dict[str, Any]:
    """``{train: {steps: 3}, 'model.norm': x}`` -> ``{'train.steps': 3, 'model.norm': x}`` (mapping-valued keys
    kept). One key spelled twice, dotted and nested (``{train.steps: 4, train: {steps: 5}}``), or a key inside
    another given whole (``model.norm_options.eps`` beside ``model: {norm_options: {...}}``), is one line naming the
    key: the YAML loader sees two different keys there, and the one read last would win silently."""
    if not isinstance(data, dict):
        raise NormlabError(f"{where} must be a mapping of config keys to values, got {type(data).__name__}")
    out: dict[str, Any] = {}
    spelled: dict[str, str] = {}
    for k, v in data.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and not prefix and key in SECTIONS:
            inner = flatten(v, where, f"{key}.")
            items = [(ik, iv, f"'{key}: {{{ik[len(key) + 1:]}: ...}}'") for ik, iv in inner.items()]
        else:
            check_key(key, where)
            items = [(key, v, f"'{key}'")]
        for ik, iv, how in items:
            clash = next((o for o in spelled if o == ik or o.startswith(f"{ik}.") or ik.startswith(f"{o}.")), None)
            if clash is not None:
                outer, inner = sorted((ik, clash), key=len)
                what = f"'{ik}'" if clash == ik else f"'{outer}' (which holds '{inner}')"
                raise NormlabError(f"{where}: {what} is given twice, as {spelled[clash]} and as {how}; give each key "
                                   "once (the one read last would win)")
            spelled[ik] = how
            out[ik] = iv
    return out


def seed_list(seeds: Any, source: str, key: str) -> list[int]:
    """``seeds`` checked: a non-empty list of distinct integers >= 0, at most MAX_RUNS."""
    if isinstance(seeds, list) and len(seeds) > MAX_RUNS:
        raise NormlabError(f"{source}: {len(seeds)} {key}; a sweep has at most {MAX_RUNS} runs (MAX_RUNS)")
    if (not isinstance(seeds, list) or not seeds
            or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds)):
        raise NormlabError(f"{source}: {key} must be a non-empty list of integers >= 0, got {seeds!r}")
    if len(set(seeds)) != len(seeds):
        raise NormlabError(f"{source}: {key} contain a duplicate: {seeds}")
    return seeds


# -- one reader per key: (value as written or None, Where) -> the checked value ---------------------------------------
def _name(v: Any, w: Where) -> str:
    name = v or (Path(w.source).stem if w.source.endswith((".yaml", ".yml")) else "sweep")
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
        raise NormlabError(f"{w.source}: name must be letters, digits, '.', '_' or '-', got {name!r}")
    return name


def _base(v: Any, w: Where) -> dict[str, Any]:
    if v is None:
        raise NormlabError(
            f"{w.source}: 'base' is required (a config preset such as tiny or small, a YAML path, or a mapping)"
        )
    if isinstance(v, dict):
        base = copy.deepcopy(v)
    elif not isinstance(v, str) or not v:
        raise NormlabError("sweep 'base' must be a config preset name, a YAML path, or a mapping")
    elif w.here is not None and (w.here / v).is_file():
        base = read_yaml(w.here / v)
    else:
        base = read_yaml(resolve_config_path(v))
    base.pop("seed", None)
    return base


def _axes(v: Any, w: Where) -> dict[str, list[Any]]:
    v = v or {}
    if not isinstance(v, dict):
        raise NormlabError(f"{w.source}: axes must be a mapping of config key -> list of values")
    axes: dict[str, list[Any]] = {}
    for key, values in v.items():
        check_key(str(key), f"{w.source}: axes")
        if not isinstance(values, list):
            raise NormlabError(f"{w.source}: axis '{key}' must be a list of values, got {type(values).__name__}")
        if not values:
            raise NormlabError(f"{w.source}: axis '{key}' is empty; give at least one value")
        axes[str(key)] = values
    return axes


def _variants(v: Any, w: Where) -> list[tuple[str, dict[str, Any]]]:
    out: list[tuple[str, dict[str, Any]]] = []
    if v is None:
        return out
    src = w.source
    if not isinstance(v, list) or not v:
        raise NormlabError(f"{src}: variants must be a non-empty list of {{name: ..., set: {{...}}}}")
    for i, x in enumerate(v):
        if not isinstance(x, dict) or not isinstance(x.get("name"), str) or not x["name"].strip():
            raise NormlabError(f"{src}: variant #{i + 1} needs a 'name' (string) and a 'set' mapping")
        name = x["name"]
        if len(name) > MAX_NAME or not name.isprintable():
            raise NormlabError(f"{src}: variant #{i + 1}'s name ({len(name)} characters, starting {name[:20]!r}) "
                               f"must be at most {MAX_NAME} printable characters")
        check_keys(x, ("name", "set"), f"{src}: variant '{name}'")
        if any(name == n for n, _ in out):
            raise NormlabError(f"{src}: two variants are named '{name}'; names must be unique")
        out.append((name, flatten(x.get("set") or {}, f"{src}: variant '{name}'")))
    return out


def _designed_from(v: Any, w: Where) -> str | None:
    if v is not None and (not isinstance(v, str) or not v.strip()):
        raise NormlabError(f"{w.source}: designed_from must be a sentence naming the runs (and their seeds) that "
                           f"informed the design, got {v!r}")
    return v.strip() if v else None


def _replicate(v: Any, w: Where) -> str | None:
    if v is not None and (not isinstance(v, str) or not v.strip()):
        raise NormlabError(f"{w.source}: replicate must be a data source string (docs/data.md), got {v!r}")
    return v or None


def _key(key: str, read: Callable[[Any, Where], Any]) -> Any:
    return field(metadata={"key": key, "read": read})


@dataclass(frozen=True)
class SweepFile:
    """A sweep file's top-level keys, checked (``read_sweep_file``); ``overrides`` is ``set:`` flattened to dotted
    keys, ``plan`` the resolved ``sequential:`` plan (``{"looks": [...]}``) and ``seeds`` extended to its cap."""

    name: str = _key("name", _name)
    description: str = _key("description", lambda v, w: str(v or ""))
    base: dict[str, Any] = _key("base", _base)
    overrides: dict[str, Any] = _key("set", lambda v, w: flatten(v or {}, f"{w.source}: set"))
    axes: dict[str, list[Any]] = _key("axes", _axes)
    variants: list[tuple[str, dict[str, Any]]] = _key("variants", _variants)
    seeds: list[int] = _key("seeds", lambda v, w: seed_list([0] if v is None else v, w.source, "seeds"))
    replicate_seeds: list[int] | None = _key(
        "replicate_seeds", lambda v, w: None if v is None else seed_list(v, w.source, "replicate_seeds"))
    designed_from: str | None = _key("designed_from", _designed_from)
    plan: Any = _key("sequential", lambda v, w: v)
    replicate: str | None = _key("replicate", _replicate)
    lr_grid: list[float] | None = _key(
        "lr_grid", lambda v, w: None if v is None else expand_grid(v, name=f"{w.source}: lr_grid"))
    baseline: Any = _key("baseline", lambda v, w: v)

    def spec(self, size_spec: dict[str, Any], question: dict[str, Any]) -> dict[str, Any]:
        """The resolved, self-contained spec written as ``SWEEP_DIR/sweep.yaml`` (base inlined, overrides flat)."""
        v = self.variants
        return {"name": self.name, "description": self.description, "base": self.base, "set": self.overrides,
                "axes": self.axes, **({"variants": [{"name": n, "set": s} for n, s in v]} if v else {}),
                "seeds": self.seeds, **({"lr_grid": self.lr_grid} if self.lr_grid else {}), **size_spec,
                **({"baseline": self.baseline} if self.baseline is not None else {}), **question,
                **({"sequential": self.plan} if self.plan else {}),
                **({"replicate": self.replicate} if self.replicate else {}),
                **({"replicate_seeds": self.replicate_seeds} if self.replicate_seeds else {}),
                **({"designed_from": self.designed_from} if self.designed_from else {})}


def read_sweep_file(raw: Any, *, here: Path | None = None, source: str = "sweep") -> SweepFile:
    """Check the top-level keys of sweep mapping ``raw`` (field by field, then across fields)."""
    if not isinstance(raw, dict):
        raise NormlabError(f"{source} must be a YAML mapping with keys {', '.join(TOP_KEYS)}")
    check_keys(raw, TOP_KEYS, source)
    w = Where(source, here)
    values = {f.name: f.metadata["read"](raw.get(f.metadata["key"]), w) for f in fields(SweepFile)}
    if values["plan"] is not None:  # the plan's seeds are all in the design from the start
        values["plan"], values["seeds"] = resolve_plan(values["plan"], values["seeds"], source)
    sweep = SweepFile(**values)
    rs, seeds = sweep.replicate_seeds, sweep.seeds
    if rs and set(rs) & set(seeds):
        raise NormlabError(f"{source}: replicate_seeds {rs} share seeds with seeds {seeds}; a replication runs on a "
                           "fresh seed block")
    if sweep.lr_grid:
        where = ("set" if LR_KEY in sweep.overrides else "axes" if LR_KEY in sweep.axes else
                 next((f"variant '{n}'" for n, vs in sweep.variants if LR_KEY in vs), None))
        if where:
            raise NormlabError(f"{source}: {where} sets {LR_KEY}, but lr_grid already sweeps it; remove one")
    return sweep
