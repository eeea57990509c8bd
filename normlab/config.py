"""Run configuration: ``seed`` + ``data`` + ``model`` + ``train`` + ``optim`` sections, loaded from YAML with
``--set`` overrides.

Every key is checked: unknown keys get a did-you-mean, values are type-checked against the dataclass annotations,
and cross-field rules are checked by each section's ``validate()``. All failures are one-line ``NormlabError``s.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import types
import typing
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from normlab.aliases import suggest_key
from normlab.errors import NormlabError, unknown
from normlab.io import load_yaml, read_yaml_file
from normlab.model.config import ModelConfig
from normlab.presets import CONFIG_DIR, config_presets  # package data: shipped presets
from normlab.validate import check_config

_FLOAT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


@dataclass
class DataConfig:
    """Corpus and tokenizer. ``source``: see docs/data.md; ``tokenizer``: ``bytes``, ``bpe:N`` or a tokenizer.json
    path, each optionally ``+doc`` (a document token before every document)."""

    source: str = "pystdlib"
    tokenizer: str = "bytes"
    val_fraction: float = 0.05
    test_fraction: float = 0.05
    cache_dir: str | None = None

    def validate(self) -> "DataConfig":
        check_config(self, "data.")  # val_fraction, test_fraction in (0, 0.5): normlab.validate.RANGES
        return self


EVAL_SAMPLES = ("spread", "head")
CLIPS = ("global", "adagc")  # normlab.train.clipping
PRECISIONS = ("auto", "fp32", "bf16")
TRACKERS = ("tensorboard", "wandb", "mlflow")  # normlab.train.tracking: each through the library's own logger
DEVICES = ("auto", "cpu", "cuda")
STACKS = ("auto", "on", "off")  # normlab.train.stacked; a sweep's runs of one architecture in one stacked model
TRI = (True, False, "auto")


@dataclass
class TrainConfig:
    """Optimisation and bookkeeping. ``steps`` counts optimizer steps (each of ``grad_accum`` micro-batches).

    Periodic validation scores ``eval_batches * batch_size * context`` validation targets, every ``eval_every``
    steps: ``eval_sample: spread`` (default) in windows spread evenly over the whole split, ``head`` in its first
    tokens (cheaper to reason about, but one long file at the split's start dominates it).
    """

    steps: int = 200
    batch_size: int = 16
    grad_accum: int = 1
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 20
    weight_decay: float = 0.1
    wd_norm: bool = False
    wd_embeddings: bool = False
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    clip: str = "global"
    adagc_lambda: float = 1.05
    adagc_beta: float = 0.98
    adagc_warmup: int | None = None
    eval_every: int = 50
    eval_batches: int = 8
    eval_sample: str = "spread"
    log_every: int = 10
    checkpoint_every: int = 100
    keep_checkpoints: int = 2
    loss_ceiling: float | None = None
    z_loss: float = 0.0
    logitnorm_tau: float | None = None
    threads: int | str | None = "auto"
    precision: str = "auto"
    compile: bool | str = "auto"
    deterministic: bool | str = True
    tf32: bool | str = "auto"
    stack: bool | str = "auto"  # YAML reads on / off as booleans: true is on, false is off
    track: list[str] = field(default_factory=lambda: ["tensorboard"])
    track_required: bool = False  # a tracker server that does not answer: error before training, not a warning

    def validate(self) -> "TrainConfig":
        check_config(self, "train.")  # numeric ranges: normlab.validate.RANGES
        if self.clip not in CLIPS:  # normlab.train.clipping: what each value does
            raise unknown("train.clip", self.clip, CLIPS)
        if self.eval_sample not in EVAL_SAMPLES:
            raise unknown("train.eval_sample", self.eval_sample, EVAL_SAMPLES)
        if self.precision not in PRECISIONS:  # normlab.train.precision: what each value does
            raise unknown("train.precision", self.precision, PRECISIONS)
        if isinstance(self.threads, str) and self.threads != "auto":
            raise NormlabError(f"train.threads must be auto, a count >= 1 or null, got {self.threads!r}")
        for key in ("compile", "deterministic", "tf32"):
            if getattr(self, key) not in TRI:
                raise NormlabError(f"train.{key} must be auto, true or false, got {getattr(self, key)!r}")
        if isinstance(self.stack, bool):
            self.stack = "on" if self.stack else "off"
        if self.stack not in STACKS:
            raise unknown("train.stack", self.stack, STACKS)
        for t in self.track:
            if t not in TRACKERS:
                raise unknown("train.track entry", t, TRACKERS)
        if len(set(self.track)) != len(self.track):
            raise NormlabError(f"train.track lists a tracker twice: {self.track}")
        return self


OPTIMIZERS = ("adamw", "adamp", "sgdp")


@dataclass
class OptimConfig:
    """Optimizer choice and norm-aware options (docs/optim.md).

    ``name``: ``adamw`` (torch), ``adamp`` / ``sgdp`` (Heo et al. 2021, the authors' ``adamp`` package; ``delta``,
    ``wd_ratio``; ``momentum`` is SGDP's). ``nap``: Normalize-and-Project (Lyle et al. 2024) after every step.
    ``effective_lr_every``: record ``||dW|| / ||W||`` of the weights feeding norms every N steps (0 = off).
    ``perp_grad``: perp-Grad (Prieto et al. 2025): before every step, remove from each parameter's gradient its
    component along the parameter and rescale it to the original gradient norm (normlab.train.optim.orthograd_).
    Learning rate, betas, weight decay and its grouping (``train.wd_norm``) stay in ``train``.
    """

    name: str = "adamw"
    nap: bool = False
    delta: float = 0.1
    wd_ratio: float = 0.1
    momentum: float = 0.9
    effective_lr_every: int = 0
    perp_grad: bool = False

    def validate(self) -> "OptimConfig":
        if self.name not in OPTIMIZERS:
            raise unknown("optim.name", self.name, OPTIMIZERS)
        check_config(self, "optim.")  # numeric ranges: normlab.validate.RANGES
        return self


@dataclass
class DiagConfig:
    """Training-time diagnostics (normlab.diagnostics.training; docs/diagnostics.md).

    ``every``: every N optimizer steps record per-block residual-stream RMS / variance, each norm's output RMS and
    per-block gradient norms (attention, MLP, norm parameters) as flat ``diag/...`` keys in metrics.jsonl
    (0 = off: no hooks, nothing recorded). Loss spikes -- a step whose training loss exceeds ``spike_factor`` x
    the mean of the previous ``spike_window`` step losses -- are counted on every step regardless (one float per
    step) and listed in summary.json as ``loss_spikes: {count, steps}``. The effective step size of weights
    feeding norms is ``optim.effective_lr_every`` (``eff_lr/...`` keys), not duplicated here.
    ``probes``: in a sweep, measure the in-context probes (induction, associative recall; normlab.eval.probes at
    ``normlab probe``'s defaults) on each completed run and store them as ``RUN/probes.json`` for the report.
    """

    every: int = 0
    spike_factor: float = 2.0
    spike_window: int = 20
    probes: bool = False

    def validate(self) -> "DiagConfig":
        check_config(self, "diag.")  # every >= 0, spike_factor > 1, spike_window >= 1: normlab.validate.RANGES
        return self


@dataclass
class RunConfig:
    """A whole run. ``seed`` drives model init, data order and dropout. ``device``: ``auto`` (CUDA when available),
    ``cpu`` or ``cuda`` (normlab.train.precision resolves it at the start of training)."""

    seed: int = 0
    device: str = "auto"
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    diag: DiagConfig = field(default_factory=DiagConfig)

    def validate(self) -> "RunConfig":
        if self.device not in DEVICES:
            raise unknown("device", self.device, DEVICES)
        self.data.validate()
        self.model.validate()
        self.train.validate()
        self.optim.validate()
        self.diag.validate()
        return self

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def identity_dict(self) -> dict[str, Any]:
        """``to_dict()`` less keys that came later and leave a run as it was, so runs from before keep their hashes:
        ``train.track`` and ``train.track_required`` (where the curves are logged; changes no number),
        ``train.stack`` (a sweep's scheduling), and ``train.deterministic`` and ``train.tf32`` at their defaults (true
        and auto: how every earlier CPU run trained), ``diag.probes`` at its default (false: measured after training,
        nothing of the run changes; true keeps it, so a sweep asking for probes trains runs that measure them)."""
        d = self.to_dict()
        d["train"].pop("track", None)
        d["train"].pop("track_required", None)  # whether a tracker may be missing: changes no number
        d["train"].pop("stack", None)  # where a sweep trains the run (alone or stacked), equal to fp32 round-off
        if d["train"].get("deterministic") is True:
            d["train"].pop("deterministic")
        if d["train"].get("tf32") == "auto":
            d["train"].pop("tf32")
        if d["diag"].get("probes") is False:
            d["diag"].pop("probes")
        return d

    def hash(self) -> str:
        """Stable short hash of the whole config (used to detect a changed config on resume), over
        ``identity_dict()``."""
        blob = json.dumps(self.identity_dict(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


def _type_name(tp: Any) -> str:
    args = typing.get_args(tp)
    if typing.get_origin(tp) is list:
        return f"list of {args[0].__name__}"
    if args:
        return " or ".join("null" if a is type(None) else a.__name__ for a in args)
    return tp.__name__


def _coerce(key: str, value: Any, tp: Any) -> Any:
    """Check ``value`` against annotation ``tp`` (int, float, str, bool, and ``X | None``)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        errors = []
        for arg in typing.get_args(tp):
            if arg is type(None):
                if value is None:
                    return None
                continue
            try:
                return _coerce(key, value, arg)
            except NormlabError as e:
                errors.append(e)
        raise NormlabError(f"{key} must be {_type_name(tp)}, got {type(value).__name__} {value!r}")
    if origin is dict:
        if isinstance(value, dict) and all(isinstance(k, str) for k in value):
            return dict(value)
        raise NormlabError(f"{key} must be a mapping of option names to values, got {type(value).__name__}")
    if origin is list:  # a list of strings; one string is a list of one (--set train.track=wandb)
        if isinstance(value, str):
            return [value]
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return list(value)
        raise NormlabError(f"{key} must be a list of names, e.g. [tensorboard, wandb], got {value!r}")
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str) and _FLOAT.fullmatch(value.strip()):  # YAML 1.1 reads '1e-3' as a string
            return float(value)
    elif tp is str:
        if isinstance(value, str):
            return value
    raise NormlabError(f"{key} must be {_type_name(tp)}, got {type(value).__name__} {value!r}")


def _build(cls: type, data: dict[str, Any], prefix: str) -> Any:
    hints = typing.get_type_hints(cls)
    names = [f.name for f in fields(cls)]
    kwargs = {}
    for key, value in data.items():
        full = f"{prefix}{key}"
        if key not in hints:
            allowed = [f"{prefix}{n}" for n in names]
            raise NormlabError(
                f"unknown config key '{full}'{suggest_key(full, allowed)}; allowed: {', '.join(allowed)}"
            )
        tp = hints[key]
        if dataclasses.is_dataclass(tp):
            if not isinstance(value, dict):
                raise NormlabError(f"config section '{full}' must be a mapping, got {type(value).__name__}")
            kwargs[key] = _build(tp, value, f"{full}.")
        else:
            kwargs[key] = _coerce(full, value, tp)
    return cls(**kwargs)


RUNTIME_KEYS = ("device", "train.precision", "train.compile", "train.threads", "train.tf32", "train.stack")
"""Keys the machine decides at ``auto`` (a run names what it used on its own line, normlab.train.precision)."""
BOOKKEEPING_KEYS = ("train.track", "train.track_required", "train.log_every", "train.checkpoint_every",
                    "train.keep_checkpoints", "train.eval_every", "train.eval_batches", "data.cache_dir")
"""Keys that say where and how often a run logs, checkpoints and evaluates, not what it trains."""


def non_default(cfg: RunConfig) -> list[tuple[str, Any]]:
    """``(key, value)`` for every key of ``cfg`` whose value differs from ``RunConfig()``'s default, in config order
    (a mapping such as ``model.norm_options`` entry by entry), less ``RUNTIME_KEYS`` and ``BOOKKEEPING_KEYS``: the
    choices a run's banner names, derived from the dataclasses' defaults rather than a list of keys."""
    def flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in d.items():
            out.update(flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
        return out

    default, mine = flat(RunConfig().to_dict()), flat(cfg.to_dict())
    skip = set(RUNTIME_KEYS) | set(BOOKKEEPING_KEYS)
    return [(k, v) for k, v in mine.items() if k not in skip and (k not in default or default[k] != v)]


def _all_keys(cls: type = RunConfig, prefix: str = "") -> list[str]:
    out = []
    for f in fields(cls):
        tp = typing.get_type_hints(cls)[f.name]
        out += _all_keys(tp, f"{prefix}{f.name}.") if dataclasses.is_dataclass(tp) else [f"{prefix}{f.name}"]
    return out


def _mapping_keys(cls: type = RunConfig, prefix: str = "") -> list[str]:
    """Keys whose value is a free-form mapping (``--set model.norm_options.alpha_init=0.5`` sets one entry)."""
    out = []
    for f in fields(cls):
        tp = typing.get_type_hints(cls)[f.name]
        if dataclasses.is_dataclass(tp):
            out += _mapping_keys(tp, f"{prefix}{f.name}.")
        elif typing.get_origin(tp) is dict:
            out.append(f"{prefix}{f.name}")
    return out


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply ``key.sub=value`` strings (values parsed as YAML scalars) to a nested dict, in place."""
    valid = _all_keys()
    for item in overrides:
        if "=" not in item:
            raise NormlabError(f"--set expects KEY=VALUE, got '{item}'")
        key, raw = item.split("=", 1)
        key = key.strip()
        in_mapping = any(key.startswith(f"{m}.") and key.count(".") == m.count(".") + 1 for m in _mapping_keys())
        if key not in valid and not in_mapping:
            raise NormlabError(f"unknown config key '{key}'{suggest_key(key, valid)}")
        value = _override_value(raw, key)
        node = data
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return data


def _override_value(raw: str, key: str) -> Any:
    """A ``--set`` value as a YAML scalar; text YAML cannot read stays text. A value that starts with ``*`` is text
    too (``data.source=*foo``, a glob): as YAML it would be an alias, and a one-value document has no anchor it
    could refer to. Aliases after an anchor inside a value (``{a: &x [..], b: *x}``) are still refused."""
    if raw == "" or raw.lstrip().startswith("*"):
        return raw
    try:
        return load_yaml(raw, f"--set {key}")
    except yaml.YAMLError:
        return raw


def resolve_config_path(name: str) -> Path:
    """A YAML path, or the name of a shipped preset in ``normlab/configs/`` (e.g. ``tiny``)."""
    p = Path(name)
    if p.is_file():
        return p
    preset = CONFIG_DIR / f"{name}.yaml"
    if preset.is_file():
        return preset
    raise NormlabError(f"config '{name}' is neither a file nor a preset; presets: {', '.join(config_presets())}")


def read_yaml(path: Path) -> dict[str, Any]:
    """Read a YAML mapping; unreadable or non-mapping files are one-line errors."""
    data = read_yaml_file(path, "config")
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise NormlabError(
            f"config {path} must be a YAML mapping of sections (seed, device, data, model, train, optim, diag)"
        )
    return data


def config_from_dict(data: dict[str, Any]) -> RunConfig:
    """Build and validate a RunConfig from a nested dict (numeric ranges first: normlab.validate)."""
    cfg = _build(RunConfig, data, "")
    check_config(cfg)
    return cfg.validate()


def load_config(name: str | Path, overrides: list[str] | None = None) -> RunConfig:
    """Load a YAML file or preset name, apply ``--set`` overrides, validate."""
    data = read_yaml(resolve_config_path(str(name)))
    apply_overrides(data, overrides or [])
    return config_from_dict(data)


def dump_config(cfg: RunConfig) -> str:
    """YAML text of the full config (every key, defaults included)."""
    return yaml.safe_dump(cfg.to_dict(), sort_keys=False)
