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
    margin: 0.01                    # optional: the practical margin ("within margin" by TOST)
    sequential: {max_seeds: 12}     # optional: seeds in rounds until decided (normlab.decide.plan)
    replicate: english              # optional: the same design on a second data source (docs/compare.md)
    replicate_seeds: [10, 11]       # optional: the replication's own seed block (default: seeds + 10000)
    designed_from: ...              # optional: the runs (and their seeds) that informed this design

With ``lr_grid`` every run's ``axes`` carries ``train.lr`` and ``grid_group``: the label of its variant and other
axes without the learning rate, which the report uses to draw loss against learning rate per group. ``train.lr``
may then not be set anywhere else in the sweep (it would be silently overridden).

Everything is validated before anything is written (the top-level keys by the typed loader
normlab.experiments.sweepfile, the question by normlab.decide.question): unknown keys get a did-you-mean, an
empty axis, a seed given as an override, two variants that produce the same config, and every expanded config's own
checks are one-line ``NormlabError``s. A sweep's identity (``Sweep.hash``) is the hash of its resolved spec (base
config inlined, overrides flattened to dotted keys), so the same sweep written differently (key order, nested vs
dotted keys, a preset name vs the same config inlined) has the same hash.
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

from normlab.config import RunConfig, derive_config, planned_config
from normlab.errors import NormlabError, did_you_mean
from normlab.experiments.design import make_design
from normlab.decide.question import QUESTION_KEYS, Question, parse_question, question_spec
from normlab.experiments.sizes import SIZE_OWNED, size_points
from normlab.experiments.sweepfile import LR_KEY, MAX_NAME, MAX_RUNS, PROVENANCE_KEYS, SweepFile, read_sweep_file
from normlab.experiments.sweepspec import SweepSpec
from normlab.io import read_yaml_file
from normlab.presets import SWEEP_DIR, sweep_presets  # package data: shipped sweeps

__all__ = ["MAX_NAME", "MAX_RUNS", "Sweep", "SweepSpec", "PlannedRun", "dump_spec", "load_sweep", "parse_sweep"]
REPLICATION_SEED_OFFSET = 10_000
"""A replication without ``replicate_seeds`` runs the design's seeds shifted by this much: a fresh seed block."""
NOT_HASHED = ("description", "replicate", "replicate_seeds", *PROVENANCE_KEYS, *QUESTION_KEYS)
# a replication adds a second sweep dir; the question keys' changes are recorded in the store instead
# (normlab.experiments.design)


@dataclass
class PlannedRun:
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
    """A validated, expanded sweep. ``spec`` is the self-contained form written to ``SWEEP_DIR/sweep.yaml`` (its
    serialised form: hashed and dumped, never read by key); ``resolved`` is the same spec typed."""

    name: str
    spec: dict[str, Any]
    runs: list[PlannedRun]
    variants: list[str] = field(default_factory=list)
    description: str = ""
    lr_grid: list[float] | None = None
    rerun: str = ""  # the command that re-runs it, for sweep.yaml's header (default: normlab compare this file)
    question: Question | None = None  # normlab.decide.question.parse_question (None: a sweep built in code)

    def design(self) -> dict[str, Any]:
        """The declared design written to the store before the first run (normlab.experiments.design)."""
        groups = list(dict.fromkeys(r.axes.get("grid_group") or r.variant for r in self.runs))
        assert self.question is not None, "a sweep built without a question has no design"
        return make_design(self.question, groups, self.resolved.seeds, self.lr_grid)

    @property
    def resolved(self) -> SweepSpec:
        """The spec typed (normlab.experiments.sweepspec.SweepSpec: the reader of a stored ``sweep.yaml`` too)."""
        return SweepSpec.from_mapping(self.spec)

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


def parse_sweep(raw: Any, *, here: Path | None = None, source: str = "sweep") -> Sweep:
    """Validate and expand a sweep mapping (see the module docstring). ``here``: folder for relative ``base`` paths."""
    f = read_sweep_file(raw, here=here, source=source)  # every top-level key checked (normlab.experiments.sweepfile)
    grid_axes = {**f.axes, LR_KEY: f.lr_grid} if f.lr_grid else f.axes
    sizes, size_spec = size_points(raw, f.base, f.overrides, source, _apply)  # normlab.experiments.sizes
    named = f.variants or [("", {})]
    _check_run_count(source, named, grid_axes, sizes, f.seeds)  # before anything is expanded
    if sizes:
        owned = [k for k in SIZE_OWNED if k in f.axes] + [f"{k} (variant '{n}')" for n, vs in f.variants
                                                          for k in SIZE_OWNED if k in vs]
        if owned:
            raise NormlabError(f"{source}: {owned[0]} is given by the size axis; remove it")
        if (LR_KEY in f.axes or f.lr_grid) and "lr_transfer" in size_spec:
            raise NormlabError(f"{source}: give either lr_transfer or a learning-rate grid (lr_grid or a train.lr "
                               "axis), not both")
    runs, labels = _expand(f, grid_axes, sizes, source)
    names = list(dict.fromkeys(r.axes.get("grid_group") or r.variant for r in runs))
    question = replace(parse_question(raw, names, grid=bool(f.lr_grid), source=source), seeds=tuple(f.seeds))
    if f.plan and question.correction != "holm":
        raise NormlabError(f"{source}: a sequential plan decides with group-sequential Holm; correction "
                           f"{question.correction!r} is not available with it (use correction: holm)")
    if f.plan and question.margin is not None:
        raise NormlabError(f"{source}: a sequential plan's boundaries test a difference, not equivalence; margin "
                           "is for a fixed design (remove sequential: or margin:)")
    spec = f.spec(size_spec, question_spec(raw))
    return Sweep(f.name, spec, runs, labels, f.description, f.lr_grid, question=question)


def _expand(f: SweepFile, grid_axes: dict[str, list[Any]], sizes: list, source: str
            ) -> tuple[list[PlannedRun], list[str]]:
    """The runs (largest sizes first, so parallel workers do not end on one long run; then variants, axis points
    and seeds) and the labels of the distinct configs; two variants with the same config are refused."""
    short = _short_keys(list(grid_axes))
    points = ([dict(zip(grid_axes, combo)) for combo in itertools.product(*grid_axes.values())]
              if grid_axes else [{}])
    named = f.variants or [("", {})]
    combos = ([(s, v) for s in reversed(sizes) for v in named] if sizes else [(None, v) for v in named])
    runs: list[PlannedRun] = []
    labels: list[str] = []
    seen: dict[str, str] = {}
    for size, (vname, vset) in combos:
        for point in points:
            axis_label = ", ".join(f"{short[k]}={_fmt(v)}" for k, v in point.items())
            size_label = size.label if size else ""
            label = " · ".join(p for p in (vname, size_label, axis_label) if p) or "base"
            group = (_group_label(" · ".join(p for p in (vname, size_label) if p), point, short) if f.lr_grid
                     else None)
            overrides = {**f.overrides, **vset, **(size.overrides if size else {}), **point}
            data = _apply(f.base, overrides)
            try:
                cfg = planned_config({**data, "seed": 0})
            except NormlabError as e:
                raise NormlabError(f"{source}: variant '{label}': {e}") from None
            key = RunConfig.hash(cfg)
            if key in seen:
                raise NormlabError(
                    f"{source}: variants '{seen[key]}' and '{label}' produce the same config; remove one"
                )
            seen[key] = label
            labels.append(label)
            for seed in f.seeds:
                cfg_s = derive_config(cfg, {"seed": seed})
                run_axes = (({"variant": vname} if vname else {}) | ({"size": size.label} if size else {}) | point
                            | ({"grid_group": group} if group else {}))
                runs.append(PlannedRun("", label, seed, run_axes, overrides, cfg_s.to_dict(), cfg_s.hash()))
    ids: set[str] = set()
    for r in runs:
        rid = f"{slug(r.variant)}-s{r.seed}"
        if rid in ids:
            rid = f"{rid}-{r.config_hash[:6]}"
        ids.add(rid)
        r.run_id = rid
    return runs, labels


def replication_seeds(spec: SweepSpec) -> list[int]:
    """The seed block of a replication of the sweep ``spec``: its ``replicate_seeds``, else its seeds shifted by
    REPLICATION_SEED_OFFSET (never the seeds of the design it replicates)."""
    return list(spec.replicate_seeds or [s + REPLICATION_SEED_OFFSET for s in spec.seeds])


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
