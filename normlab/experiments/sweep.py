"""Sweep files: a base config, overrides for every run, axes (cartesian product), named variants, and seeds.

    name: quick                     # names the default sweep dir runs/compare-<name>
    base: small                     # a config preset, a YAML path (relative to this file, then the cwd), or a mapping
    set:                            # overrides applied to every run (dotted keys or nested sections)
      train.steps: 300
    axes:                           # cartesian product over every axis (any config key)
      model.depth: [4, 8]
    variants:                       # named override sets; crossed with the axes when both are given
      - {name: Post-LN, set: {model.placement: post}}
      - {name: Pre-LN,  set: {model.placement: pre}}
    seeds: [0, 1]                   # every (variant, axes point) runs once per seed
    lr_grid: {min: 1e-3, max: 1e-1, points: 5}   # optional: train.lr over a log-spaced grid (or a list), crossed
                                                 # with variants, axes and seeds (normlab.experiments.grid)
    baseline: Pre-LN                # optional: the variant the report's paired differences compare with
                                    # (default: the first)
    primary: lr_sensitivity         # optional, the declared question (normlab.experiments.design): the metric
    family: [Peri-LN]               # decided on, the comparisons with the baseline it decides, alpha and the
    alpha: 0.05                     # multiplicity correction (holm | bh); without primary: every comparison in
    correction: holm                # the report is exploratory
    sequential: {max_seeds: 12}     # optional: seeds in rounds until decided (normlab.experiments.plan)
    replicate: english              # optional: the same design on a second data source (docs/compare.md)
    replicate_seeds: [10, 11]       # optional: the replication's own seed block (default: seeds + 10000)
    designed_from: ...              # optional: the runs (and their seeds) that informed this design

With ``lr_grid`` every run's ``axes`` carries ``train.lr`` and ``grid_group``: the label of its variant and other
axes without the learning rate, which the report uses to draw loss against learning rate per group. ``train.lr``
may then not be set anywhere else in the sweep (it would be silently overridden).

Everything is validated before anything is written: unknown keys get a did-you-mean, an empty axis, a seed given as
an override, two variants that produce the same config, and every expanded config's own checks are one-line
``NormlabError``s. A sweep's identity (``Sweep.hash``) is the hash of its resolved spec (base config inlined,
overrides flattened to dotted keys), so the same sweep written differently (key order, nested vs dotted keys, a
preset name vs the same config inlined) has the same hash.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from normlab.config import (RunConfig, _all_keys, _mapping_keys, config_from_dict, read_yaml,
                            resolve_config_path, suggest_key)
from normlab.errors import NormlabError, did_you_mean
from normlab.experiments.design import make_design
from normlab.experiments.grid import expand_grid
from normlab.experiments.plan import resolve_plan
from normlab.experiments.question import QUESTION_KEYS, Question, parse_question, question_spec
from normlab.experiments.sizes import SIZE_KEYS, SIZE_OWNED, size_points
from normlab.io import read_yaml_file
from normlab.presets import SWEEP_DIR, sweep_presets  # package data: shipped sweeps

PLAN_KEYS = ("sequential", "replicate", "replicate_seeds")  # normlab.experiments.plan
PROVENANCE_KEYS = ("designed_from",)
"""What informed a declared design (earlier runs, their seeds and data): recorded, not hashed; the design's own
seed block must be disjoint from the seeds it names (docs/compare.md, "Seed blocks")."""
REPLICATION_SEED_OFFSET = 10_000
"""A replication without ``replicate_seeds`` runs the design's seeds shifted by this much: a fresh seed block."""
NOT_HASHED = ("description", "replicate", "replicate_seeds", *PROVENANCE_KEYS, *QUESTION_KEYS)
# a replication adds a second sweep dir; the question keys' changes are recorded in the store instead
# (normlab.experiments.design)
TOP_KEYS = ("name", "description", "base", "set", "axes", "variants", "seeds", "lr_grid", "baseline", *QUESTION_KEYS,
            *PLAN_KEYS, *PROVENANCE_KEYS, *SIZE_KEYS)
LR_KEY = "train.lr"
SECTIONS = ("data", "model", "train", "optim")
MAX_RUNS = 10_000
"""The most runs one sweep may expand to (variants x axes x sizes x seeds), checked before expanding."""
MAX_NAME = 200
"""The longest variant name (it becomes part of run ids, labels, tables and file names)."""


@dataclass
class SweepRun:
    """One training run of a sweep: ``variant`` label, ``seed``, the axis values that define it, its config."""

    run_id: str
    variant: str
    seed: int
    axes: dict[str, Any]
    overrides: dict[str, Any]
    config: dict[str, Any]
    config_hash: str


@dataclass
class Sweep:
    """A validated, expanded sweep. ``spec`` is the self-contained form written to ``SWEEP_DIR/sweep.yaml``."""

    name: str
    spec: dict[str, Any]
    runs: list[SweepRun]
    variants: list[str] = field(default_factory=list)
    description: str = ""
    lr_grid: list[float] | None = None
    rerun: str = ""  # the command that re-runs it, for sweep.yaml's header (default: normlab compare this file)
    question: Question | None = None  # normlab.experiments.question.parse_question (None: a sweep built in code)

    def design(self) -> dict[str, Any]:
        """The declared design written to the store before the first run (normlab.experiments.design)."""
        groups = list(dict.fromkeys(r.axes.get("grid_group") or r.variant for r in self.runs))
        assert self.question is not None, "a sweep built without a question has no design"
        return make_design(self.question, groups, self.spec.get("seeds") or [], self.lr_grid)

    @property
    def hash(self) -> str:
        """Hash of the resolved spec (base inlined, overrides flattened; not the description). Config keys that
        a newer normlab adds with a default do not change it, so an upgrade does not orphan a sweep dir. The question
        keys (``primary``, ``family``, ``alpha``, ``correction``, ``paired``) are not part of it: changing them is
        recorded in the store and makes the report exploratory (normlab.experiments.design); nor is ``replicate``
        (a replication is a second sweep directory). A ``sequential`` plan is: it fixes the seeds."""
        spec = {k: v for k, v in self.spec.items() if k not in NOT_HASHED}
        return hashlib.sha256(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()[:16]


def list_presets() -> list[str]:
    return sweep_presets()


def preset_path(name: str) -> Path:
    path = SWEEP_DIR / f"{name}.yaml"
    if not path.is_file():
        presets = list_presets()
        raise NormlabError(f"unknown sweep preset '{name}'{did_you_mean(name, presets)}; presets: {', '.join(presets)}")
    return path


def _check_key(key: str, where: str) -> None:
    if key == "seed":
        raise NormlabError(f"{where}: 'seed' is set by the sweep's 'seeds:' list, not as an override")
    if key in _all_keys():
        return
    if any(key.startswith(f"{m}.") and key.count(".") == m.count(".") + 1 for m in _mapping_keys()):
        return
    raise NormlabError(f"{where}: unknown config key '{key}'{suggest_key(key, _all_keys())}")


def _flatten(data: Any, where: str, prefix: str = "") -> dict[str, Any]:
    """``{train: {steps: 3}, 'model.norm': x}`` -> ``{'train.steps': 3, 'model.norm': x}`` (mapping-valued keys
    kept)."""
    if not isinstance(data, dict):
        raise NormlabError(f"{where} must be a mapping of config keys to values, got {type(data).__name__}")
    out: dict[str, Any] = {}
    for k, v in data.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and not prefix and key in SECTIONS:
            out.update(_flatten(v, where, f"{key}."))
        else:
            _check_key(key, where)
            out[key] = v
    return out


def _apply(data: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    data = copy.deepcopy(data)
    for key, value in overrides.items():
        node = data
        *parents, leaf = key.split(".")
        for p in parents:
            nxt = node.get(p)
            if not isinstance(nxt, dict):
                nxt = node[p] = {}
            node = nxt
        node[leaf] = copy.deepcopy(value)
    return data


def _fmt(v: Any) -> str:
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, (dict, list)):
        return json.dumps(v, separators=(",", ":"))
    return str(v)


def slug(text: str) -> str:
    s = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return s[:60] or "run"


def _short_keys(keys: list[str]) -> dict[str, str]:
    """Shortest unambiguous suffix of each dotted key (``model.norm`` -> ``norm``)."""
    out = {}
    for k in keys:
        parts = k.split(".")
        for n in range(1, len(parts) + 1):
            cand = ".".join(parts[-n:])
            if sum(1 for o in keys if o == cand or o.endswith(f".{cand}")) == 1:
                out[k] = cand
                break
        else:
            out[k] = k
    return out


def _load_base(base: Any, here: Path | None) -> dict[str, Any]:
    if isinstance(base, dict):
        return copy.deepcopy(base)
    if not isinstance(base, str) or not base:
        raise NormlabError("sweep 'base' must be a config preset name, a YAML path, or a mapping")
    if here is not None and (here / base).is_file():
        return read_yaml(here / base)
    return read_yaml(resolve_config_path(base))


def parse_sweep(raw: Any, *, here: Path | None = None, source: str = "sweep") -> Sweep:
    """Validate and expand a sweep mapping (see the module docstring). ``here``: folder for relative ``base`` paths."""
    if not isinstance(raw, dict):
        raise NormlabError(f"{source} must be a YAML mapping with keys {', '.join(TOP_KEYS)}")
    for k in raw:
        if k not in TOP_KEYS:
            raise NormlabError(
                f"{source}: unknown key '{k}'{did_you_mean(str(k), TOP_KEYS)}; allowed: {', '.join(TOP_KEYS)}"
            )
    name = raw.get("name") or (Path(source).stem if source.endswith((".yaml", ".yml")) else "sweep")
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
        raise NormlabError(f"{source}: name must be letters, digits, '.', '_' or '-', got {name!r}")
    if "base" not in raw:
        raise NormlabError(
            f"{source}: 'base' is required (a config preset such as tiny or small, a YAML path, or a mapping)"
        )
    base = _load_base(raw["base"], here)
    if "seed" in base:
        base.pop("seed")
    common = _flatten(raw.get("set") or {}, f"{source}: set")

    axes_raw = raw.get("axes") or {}
    if not isinstance(axes_raw, dict):
        raise NormlabError(f"{source}: axes must be a mapping of config key -> list of values")
    axes: dict[str, list[Any]] = {}
    for key, values in axes_raw.items():
        _check_key(str(key), f"{source}: axes")
        if not isinstance(values, list):
            raise NormlabError(f"{source}: axis '{key}' must be a list of values, got {type(values).__name__}")
        if not values:
            raise NormlabError(f"{source}: axis '{key}' is empty; give at least one value")
        axes[str(key)] = values

    variants_raw = raw.get("variants")
    variants: list[tuple[str, dict[str, Any]]] = []
    if variants_raw is not None:
        if not isinstance(variants_raw, list) or not variants_raw:
            raise NormlabError(f"{source}: variants must be a non-empty list of {{name: ..., set: {{...}}}}")
        for i, v in enumerate(variants_raw):
            if not isinstance(v, dict) or not isinstance(v.get("name"), str) or not v["name"].strip():
                raise NormlabError(f"{source}: variant #{i + 1} needs a 'name' (string) and a 'set' mapping")
            if len(v["name"]) > MAX_NAME or not v["name"].isprintable():
                raise NormlabError(f"{source}: variant #{i + 1}'s name ({len(v['name'])} characters, starting "
                                   f"{v['name'][:20]!r}) must be at most {MAX_NAME} printable characters")
            extra = set(v) - {"name", "set"}
            if extra:
                raise NormlabError(
                    f"{source}: variant '{v['name']}' has unknown key '{sorted(extra)[0]}'; allowed: name, set"
                )
            if any(v["name"] == n for n, _ in variants):
                raise NormlabError(f"{source}: two variants are named '{v['name']}'; names must be unique")
            variants.append((v["name"], _flatten(v.get("set") or {}, f"{source}: variant '{v['name']}'")))

    seeds = _seed_list(raw.get("seeds", [0]), source, "seeds")
    replicate_seeds = None
    if raw.get("replicate_seeds") is not None:
        replicate_seeds = _seed_list(raw["replicate_seeds"], source, "replicate_seeds")
    designed_from = raw.get("designed_from")
    if designed_from is not None and (not isinstance(designed_from, str) or not designed_from.strip()):
        raise NormlabError(f"{source}: designed_from must be a sentence naming the runs (and their seeds) that "
                           f"informed the design, got {designed_from!r}")
    plan = None
    if raw.get("sequential") is not None:  # the plan's seeds are all in the design from the start
        plan, seeds = resolve_plan(raw["sequential"], seeds, source)
    if replicate_seeds and set(replicate_seeds) & set(seeds):
        raise NormlabError(f"{source}: replicate_seeds {replicate_seeds} share seeds with seeds {seeds}; a "
                           "replication runs on a fresh seed block")
    replicate = raw.get("replicate")
    if replicate is not None and (not isinstance(replicate, str) or not replicate.strip()):
        raise NormlabError(f"{source}: replicate must be a data source string (docs/data.md), got {replicate!r}")

    lr_grid = None
    if raw.get("lr_grid") is not None:
        lr_grid = expand_grid(raw["lr_grid"], name=f"{source}: lr_grid")
        where = ("set" if LR_KEY in common else "axes" if LR_KEY in axes else
                 next((f"variant '{n}'" for n, vs in variants if LR_KEY in vs), None))
        if where:
            raise NormlabError(f"{source}: {where} sets {LR_KEY}, but lr_grid already sweeps it; remove one")
    grid_axes = {**axes, LR_KEY: lr_grid} if lr_grid else axes
    short = _short_keys(list(grid_axes))
    named = variants or [("", {})]
    sizes, size_spec = size_points(raw, base, common, source, _apply)  # the size axis (normlab.experiments.sizes)
    _check_run_count(source, named, grid_axes, sizes, seeds)  # before anything is expanded
    points = ([dict(zip(grid_axes, combo)) for combo in itertools.product(*grid_axes.values())]
              if grid_axes else [{}])
    if sizes:
        owned = [k for k in SIZE_OWNED if k in axes] + [f"{k} (variant '{n}')" for n, vs in variants
                                                        for k in SIZE_OWNED if k in vs]
        if owned:
            raise NormlabError(f"{source}: {owned[0]} is given by the size axis; remove it")
        if (LR_KEY in axes or lr_grid) and "lr_transfer" in size_spec:
            raise NormlabError(f"{source}: give either lr_transfer or a learning-rate grid (lr_grid or a train.lr "
                               "axis), not both")
    # largest sizes first, so parallel workers do not end on one long run
    combos = ([(s, v) for s in reversed(sizes) for v in named] if sizes else [(None, v) for v in named])
    runs: list[SweepRun] = []
    labels: list[str] = []
    seen: dict[str, str] = {}
    for size, (vname, vset) in combos:
        for point in points:
            axis_label = ", ".join(f"{short[k]}={_fmt(v)}" for k, v in point.items())
            size_label = size.label if size else ""
            label = " · ".join(p for p in (vname, size_label, axis_label) if p) or "base"
            group = _group_label(" · ".join(p for p in (vname, size_label) if p), point, short) if lr_grid else None
            overrides = {**common, **vset, **(size.overrides if size else {}), **point}
            data = _apply(base, overrides)
            try:
                cfg = config_from_dict({**data, "seed": 0})
            except NormlabError as e:
                raise NormlabError(f"{source}: variant '{label}': {e}") from None
            key = RunConfig.hash(cfg)
            if key in seen:
                raise NormlabError(
                    f"{source}: variants '{seen[key]}' and '{label}' produce the same config; remove one"
                )
            seen[key] = label
            labels.append(label)
            for seed in seeds:
                cfg_s = config_from_dict({**data, "seed": seed})
                run_axes = (({"variant": vname} if vname else {}) | ({"size": size.label} if size else {}) | point
                            | ({"grid_group": group} if group else {}))
                runs.append(SweepRun("", label, seed, run_axes, overrides, cfg_s.to_dict(), cfg_s.hash()))
    baseline = raw.get("baseline")
    names = list(dict.fromkeys(r.axes.get("grid_group") or r.variant for r in runs))
    question = replace(parse_question(raw, names, grid=bool(lr_grid), source=source), seeds=tuple(seeds))
    if plan and question.correction != "holm":
        raise NormlabError(f"{source}: a sequential plan decides with group-sequential Holm; correction "
                           f"{question.correction!r} is not available with it (use correction: holm)")
    ids: set[str] = set()
    for r in runs:
        rid = f"{slug(r.variant)}-s{r.seed}"
        if rid in ids:
            rid = f"{rid}-{r.config_hash[:6]}"
        ids.add(rid)
        r.run_id = rid
    spec = {"name": name, "description": str(raw.get("description") or ""), "base": base,
            "set": common, "axes": axes,
            **({"variants": [{"name": n, "set": s} for n, s in variants]} if variants else {}), "seeds": seeds,
            **({"lr_grid": lr_grid} if lr_grid else {}), **size_spec,
            **({"baseline": baseline} if baseline is not None else {}), **question_spec(raw),
            **({"sequential": plan} if plan else {}), **({"replicate": replicate} if replicate else {}),
            **({"replicate_seeds": replicate_seeds} if replicate_seeds else {}),
            **({"designed_from": designed_from.strip()} if designed_from else {})}
    return Sweep(name, spec, runs, labels, spec["description"], lr_grid, question=question)


def _seed_list(seeds: Any, source: str, key: str) -> list[int]:
    """``seeds`` checked: a non-empty list of distinct integers >= 0, at most MAX_RUNS."""
    if isinstance(seeds, list) and len(seeds) > MAX_RUNS:
        raise NormlabError(f"{source}: {len(seeds)} {key}; a sweep has at most {MAX_RUNS} runs (MAX_RUNS)")
    if (not isinstance(seeds, list) or not seeds
            or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds)):
        raise NormlabError(f"{source}: {key} must be a non-empty list of integers >= 0, got {seeds!r}")
    if len(set(seeds)) != len(seeds):
        raise NormlabError(f"{source}: {key} contain a duplicate: {seeds}")
    return seeds


def replication_seeds(spec: dict[str, Any]) -> list[int]:
    """The seed block of a replication of the sweep ``spec``: its ``replicate_seeds``, else its seeds shifted by
    REPLICATION_SEED_OFFSET (never the seeds of the design it replicates)."""
    return list(spec.get("replicate_seeds") or [s + REPLICATION_SEED_OFFSET for s in spec["seeds"]])


def _check_run_count(source: str, named: list, grid_axes: dict[str, list[Any]], sizes: list, seeds: list) -> None:
    """Refuse a sweep of more than :data:`MAX_RUNS` runs (one line with the factors) before expanding it."""
    factors = [("variants", len(named)), *((f"axis {k}", len(v)) for k, v in grid_axes.items()),
               ("sizes", len(sizes) or 1), ("seeds", len(seeds))]
    n = 1
    for _, f in factors:
        n *= f
    if n > MAX_RUNS:
        parts = " x ".join(f"{f} {what}" for what, f in factors if f != 1) or str(n)
        raise NormlabError(f"{source}: {n:,} runs ({parts}); a sweep has at most {MAX_RUNS:,} runs (MAX_RUNS): split "
                           "it or shorten an axis")


def _group_label(vname: str, point: dict[str, Any], short: dict[str, str]) -> str:
    """The label of a run without its grid learning rate: the variant name (and size) and the other axes."""
    rest = ", ".join(f"{short[k]}={_fmt(v)}" for k, v in point.items() if k != LR_KEY)
    return " · ".join(p for p in (vname, rest) if p) or "base"


def load_sweep(path: str | Path | None = None, *, preset: str | None = None) -> Sweep:
    """Load a sweep file, or a shipped preset from ``normlab/configs/sweeps/`` by name."""
    if (path is None) == (preset is None):
        raise NormlabError(
            "compare needs a SWEEP.yaml or --preset NAME (not both); presets: " + ", ".join(list_presets())
        )
    p = preset_path(preset) if preset is not None else Path(path)
    if p.is_dir():
        raise NormlabError(f"sweep file {p} is a directory; give a sweep YAML file (or --preset NAME)")
    if p.exists() and not p.is_file():
        raise NormlabError(f"sweep file {p} is not a regular file (a fifo, device or socket); give a sweep YAML file")
    if not p.is_file():
        hint = f" (a preset? use --preset {path})" if preset is None and str(path) in list_presets() else ""
        raise NormlabError(f"sweep file {p} not found{hint}")
    raw = read_yaml_file(p, "sweep file")
    return parse_sweep(raw, here=p.resolve().parent, source=str(p))


def dump_spec(sweep: Sweep) -> str:
    """The self-contained sweep file (base inlined) stored as ``SWEEP_DIR/sweep.yaml``."""
    rerun = sweep.rerun or "normlab compare <this file> --out <its folder>"
    head = f"# sweep '{sweep.name}' (hash {sweep.hash}); re-run: {rerun}\n"
    return head + yaml.safe_dump(sweep.spec, sort_keys=False, allow_unicode=True)
