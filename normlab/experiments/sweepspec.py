"""A resolved sweep spec, typed: the one reader of the keys of ``SWEEP_DIR/sweep.yaml``.

A sweep file is checked and resolved by normlab.experiments.sweepfile (and normlab.experiments.sweep); the result,
``Sweep.spec``, is the serialised form: hashed (``Sweep.hash``) and written as ``sweep.yaml``, never read by key.
Code reads a sweep's keys through ``SweepSpec``: a parsed sweep's ``Sweep.resolved`` and a stored ``sweep.yaml``
(``stored_sweep``: the report, the sequential looks, the replications, the scaling analysis) are the same typed
object (``SweepSpec.from_mapping``). Torch-free: the report reads it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from normlab.decide.plan import plan_looks
from normlab.decide.question import DEFAULT_ALPHA
from normlab.errors import NormlabError
from normlab.io import read_yaml_file


def _mapping_or(v: Any, default: dict[str, Any] | None) -> dict[str, Any] | None:
    return v if isinstance(v, dict) else default


def _list_or(v: Any, default: list[Any] | None) -> list[Any] | None:
    return v if isinstance(v, list) else default


@dataclass(frozen=True)
class SweepSpec:
    """A resolved sweep spec, typed: what ``SWEEP_DIR/sweep.yaml`` holds (``Sweep.spec`` is its serialised form,
    checked by ``read_sweep_file`` and the question and size readers when it was written). ``overrides`` is
    ``set:`` (dotted keys), ``variants`` the ``(name, set)`` pairs, ``looks`` the seed counts at each look of the
    ``sequential:`` plan (None without one); the question keys are as written (None: not given; their defaults
    are normlab.decide.question's). A key that is absent or of the wrong type reads as its default."""

    name: str = ""
    description: str = ""
    base: dict[str, Any] = field(default_factory=dict)
    overrides: dict[str, Any] = field(default_factory=dict)
    axes: dict[str, list[Any]] = field(default_factory=dict)
    variants: tuple[tuple[str, dict[str, Any]], ...] = ()
    seeds: list[int] = field(default_factory=list)
    lr_grid: list[float] | None = None
    tokens_per_param: float | None = None
    lr_transfer: dict[str, Any] | None = None
    baseline: Any = None
    primary: str | None = None
    family: tuple[str, ...] | None = None
    alpha: float = DEFAULT_ALPHA
    correction: str | None = None
    paired: bool = True
    margin: float | None = None
    looks: list[int] | None = None
    replicate: str | None = None
    replicate_seeds: list[int] | None = None
    designed_from: str | None = None

    @classmethod
    def from_mapping(cls, raw: Any) -> SweepSpec:
        """The typed spec of ``raw``, a resolved spec mapping (``Sweep.spec`` or a stored ``sweep.yaml``); leniently
        (a stored file was checked when it was written): anything but a mapping is the empty spec."""
        if not isinstance(raw, dict):
            return cls()
        variants = tuple((v["name"], v.get("set") or {}) for v in _list_or(raw.get("variants"), [])
                         if isinstance(v, dict) and "name" in v)
        family = raw.get("family")
        return cls(name=str(raw.get("name") or ""), description=str(raw.get("description") or ""),
                   base=_mapping_or(raw.get("base"), {}), overrides=_mapping_or(raw.get("set"), {}),
                   axes=_mapping_or(raw.get("axes"), {}), variants=variants, seeds=_list_or(raw.get("seeds"), []),
                   lr_grid=_list_or(raw.get("lr_grid"), None), tokens_per_param=raw.get("tokens_per_param"),
                   lr_transfer=_mapping_or(raw.get("lr_transfer"), None), baseline=raw.get("baseline"),
                   primary=raw.get("primary"), family=tuple(family) if isinstance(family, list) else None,
                   alpha=raw.get("alpha", DEFAULT_ALPHA), correction=raw.get("correction"),
                   paired=raw.get("paired", True) is not False, margin=raw.get("margin"),
                   looks=plan_looks(raw.get("sequential")), replicate=raw.get("replicate") or None,
                   replicate_seeds=_list_or(raw.get("replicate_seeds"), None),
                   designed_from=raw.get("designed_from"))


def stored_sweep(sweep_dir: Path) -> SweepSpec | None:
    """The stored spec of the sweep in ``sweep_dir`` (``SWEEP_DIR/sweep.yaml``), typed; None when it is absent,
    unreadable or not a mapping."""
    try:
        raw = read_yaml_file(Path(sweep_dir) / "sweep.yaml", "sweep file")
    except NormlabError:
        return None
    return SweepSpec.from_mapping(raw) if isinstance(raw, dict) else None
