"""Run configuration: ``seed`` + ``data`` + ``model`` + ``train`` + ``optim`` sections, loaded from YAML with
``--set`` overrides.

Each key is declared once, on its field (``normlab.validate.setting``: type and default, help, range or choices,
other tools' names for it); :data:`KEYS` is that declaration as a table, and validation, ``normlab config``
(normlab.config_help) and the did-you-mean for other tools' key names (:func:`suggest_key`) read it. Every key is
checked: unknown keys get a did-you-mean, values are type-checked against the dataclass annotations, each key's
declared range and choices by its section's ``validate()``, then the cross-field rules. All failures are one-line
``NormlabError``s.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import sys
import types
import typing
from dataclasses import asdict, dataclass, field, fields
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from normlab.errors import NormlabError, did_you_mean
from normlab.io import load_yaml, read_yaml_file
from normlab.model.config import ModelConfig
from normlab.norms import get_norm_class
from normlab.presets import CONFIG_DIR, config_presets  # package data: shipped presets
from normlab.validate import (MAX_SEED, NONNEG, POS, UNIT_OPEN_HI, DeclaredKey, I, R, check_config, check_section,
                              declared_keys, setting)

_FLOAT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")
FRACTION = R(0, 0.5, lo_open=True, hi_open=True)


@dataclass
class DataConfig:
    """Corpus and tokenizer. ``source``: see docs/data.md; ``tokenizer``: ``bytes``, ``bpe:N`` or a tokenizer.json
    path, each optionally ``+doc`` (a document token before every document)."""

    source: str = setting("pystdlib", "the corpus: pystdlib, a file, a directory, a .jsonl, hf:NAME, "
                          "synthetic:markov?... (docs/data.md)", aliases=("dataset",))
    tokenizer: str = setting("bytes", "bytes, bpe:N (trained on the train split) or a tokenizer.json path; +doc "
                             "adds a document token")
    val_fraction: float = setting(0.05, "share of the corpus held out for validation (by document hash, or the "
                                  "file's end)", range=FRACTION)
    test_fraction: float = setting(0.05, "share of the corpus held out for the test split", range=FRACTION)
    cache_dir: str | None = setting(None, "token cache root (null: $NORMLAB_CACHE_DIR, else ~/.cache/normlab)",
                                    role="bookkeeping")

    def validate(self) -> "DataConfig":
        check_section(self, "data.")
        return self


EVAL_SAMPLES = ("spread", "head")
CLIPS = ("global", "adagc")  # normlab.train.clipping
PRECISIONS = ("auto", "fp32", "bf16")
TRACKERS = ("tensorboard", "wandb", "mlflow")  # normlab.train.tracking: each through the library's own logger
DEVICES = ("auto", "cpu", "cuda")
STACKS = ("auto", "on", "off")  # normlab.train.stacked; a sweep's runs of one architecture in one stacked model
TRI = ("auto", True, False)
STEPS = I(0, 10**9)
EVERY = I(1, 10**9)


@dataclass
class TrainConfig:
    """Optimisation and bookkeeping. ``steps`` counts optimizer steps (each of ``grad_accum`` micro-batches).

    Periodic validation scores ``eval_batches * batch_size * context`` validation targets, every ``eval_every``
    steps: ``eval_sample: spread`` (default) in windows spread evenly over the whole split, ``head`` in its first
    tokens (cheaper to reason about, but one long file at the split's start dominates it).
    """

    steps: int = setting(200, "optimizer steps", range=EVERY,
                         aliases=("max_iters", "max_steps", "lr_decay_iters", "num_steps", "total_steps"))
    batch_size: int = setting(16, "sequences per micro-batch", range=I(1, 2**20),
                              aliases=("per_device_train_batch_size", "micro_batch_size"))
    grad_accum: int = setting(1, "micro-batches per optimizer step", range=I(1, 2**16),
                              aliases=("gradient_accumulation_steps",))
    lr: float = setting(3e-3, "peak learning rate (after linear warm-up, cosine decay to min_lr_ratio * lr)",
                        range=POS, aliases=("learning_rate", "max_lr"))
    min_lr_ratio: float = setting(0.1, "final learning rate as a share of lr", range=R(0, 1), aliases=("min_lr",),
                                  alias_note="normlab takes the ratio min_lr / lr")
    warmup_steps: int = setting(20, "linear learning-rate warm-up steps", range=STEPS, aliases=("warmup_iters",))
    weight_decay: float = setting(0.1, "decoupled weight decay on matrices (AdamW)", range=NONNEG)
    wd_norm: bool = setting(False, "also decay norm gains and biases")
    wd_embeddings: bool = setting(False, "also decay the token (and position) embeddings")
    beta1: float = setting(0.9, "Adam beta1", range=UNIT_OPEN_HI, aliases=("adam_beta1",))
    beta2: float = setting(0.95, "Adam beta2", range=UNIT_OPEN_HI, aliases=("adam_beta2",))
    grad_clip: float = setting(1.0, "clip the global gradient norm to this (0: no clipping)", range=NONNEG,
                               aliases=("max_grad_norm", "clip_grad"))
    clip: str = setting("global", "gradient clipping: global norm, or AdaGC's per-tensor adaptive thresholds "
                        "(Wang et al. 2025)", choices=CLIPS)  # normlab.train.clipping: what each value does
    adagc_lambda: float = setting(1.05, "AdaGC: clip each tensor to lambda x the EMA of its clipped gradient norm",
                                  range=POS)
    adagc_beta: float = setting(0.98, "AdaGC: EMA coefficient of each tensor's gradient norm", range=UNIT_OPEN_HI)
    adagc_warmup: int | None = setting(None, "AdaGC: steps of global clipping that initialise the EMA (null: the LR "
                                       "warm-up)", range=STEPS)
    eval_every: int = setting(50, "validate every N steps (and at the end)", range=EVERY,
                              aliases=("eval_interval", "eval_steps"), role="bookkeeping")
    eval_batches: int = setting(8, "validation batches per evaluation", range=I(1, 2**20), aliases=("eval_iters",),
                                role="bookkeeping")
    eval_sample: str = setting("spread", "validation windows spread over the whole split, or its head",
                               choices=EVAL_SAMPLES)
    log_every: int = setting(10, "write a training record to metrics.jsonl every N steps", range=EVERY,
                             aliases=("log_interval", "logging_steps"), role="bookkeeping")
    checkpoint_every: int = setting(100, "save a resumable checkpoint every N steps", range=EVERY,
                                    aliases=("save_steps",), role="bookkeeping")
    keep_checkpoints: int = setting(2, "checkpoints kept on disk (the newest)", range=I(1, 10**6), role="bookkeeping")
    loss_ceiling: float | None = setting(None, "a loss above this stops the run as diverged (null: 3 ln(vocab))",
                                         range=POS)
    z_loss: float = setting(0.0, "z-loss coefficient c: loss += c * mean log^2 Z (PaLM; 0: off)", range=NONNEG)
    logitnorm_tau: float | None = setting(None, "LogitNorm temperature: CE on logits normalised to norm 1/tau "
                                          "(null: off)", range=POS)
    threads: int | str | None = setting("auto", "torch CPU threads: auto (from the machine's load at start), a "
                                        "count (clamped to the usable cores) or null (torch's default)",
                                        range=I(1, 4096), role="runtime")
    precision: str = setting("auto", "matmul precision: auto, fp32 or bf16 autocast (statistics stay fp32)",
                             choices=PRECISIONS, aliases=("dtype",), role="runtime")  # normlab.train.precision
    compile: bool | str = setting("auto", "torch.compile the model: auto, true or false", choices=TRI, role="runtime")
    deterministic: bool | str = setting("auto", "deterministic kernels, so a resumed run is bit-identical: auto (CPU: "
                                        "always, nothing to switch; CUDA: off, the fast path), true (CUDA too), "
                                        "false", choices=TRI, identity="dropped at default", role="runtime",
                                        earlier_defaults=(True,))
    tf32: bool | str = setting("auto", "CUDA: TF32 for fp32 matmuls (auto: on; false: strict fp32); no effect on "
                               "CPU", choices=TRI, identity="dropped at default", role="runtime")
    stack: bool | str = setting("auto", "a sweep's runs of one architecture train as one stacked model: auto (on a "
                                "GPU), on, off", choices=STACKS, identity="dropped", role="runtime")  # YAML: on = true
    track: list[str] = setting(help="where curves and hparams are logged live: tensorboard, wandb, mlflow (a list; "
                               "[] for none)", choices=TRACKERS, identity="dropped", role="bookkeeping",
                               factory=lambda: ["tensorboard"])
    track_required: bool = setting(False, "true: a tracker server that does not answer at start is an error before "
                                   "training (default false: a one-line warning, training goes on without it)",
                                   identity="dropped", role="bookkeeping")

    def validate(self) -> "TrainConfig":
        if isinstance(self.stack, bool):
            self.stack = "on" if self.stack else "off"
        check_section(self, "train.")  # each field's range and choices, declared above
        if isinstance(self.threads, str) and self.threads != "auto":
            raise NormlabError(f"train.threads must be auto, a count >= 1 or null, got {self.threads!r}")
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

    name: str = setting("adamw", "optimizer: adamw, adamp or sgdp (docs/optim.md)", choices=OPTIMIZERS,
                        aliases=("optimizer", "optim"))
    nap: bool = setting(False, "Normalize-and-Project after every step (Lyle et al. 2024)")
    delta: float = setting(0.1, "AdamP / SGDP: cosine threshold for the projection", range=POS)
    wd_ratio: float = setting(0.1, "AdamP / SGDP: weight-decay ratio on projected (scale-invariant) weights",
                              range=R(0, 1))
    momentum: float = setting(0.9, "SGDP momentum", range=UNIT_OPEN_HI)
    effective_lr_every: int = setting(0, "record ||dW|| / ||W|| of weights feeding norms every N steps (0: off)",
                                      range=STEPS)
    perp_grad: bool = setting(False, "perp-Grad: remove the gradient component along each weight (Prieto et al. "
                              "2025)")

    def validate(self) -> "OptimConfig":
        check_section(self, "optim.")
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

    every: int = setting(0, "record per-block activation and gradient statistics every N steps (0: off)",
                         range=STEPS)
    spike_factor: float = setting(2.0, "a step loss above this times the recent mean counts as a loss spike",
                                  range=R(1, lo_open=True))
    spike_window: int = setting(20, "steps in the recent mean for loss spikes", range=I(1, 10**6))
    probes: bool = setting(False, "a sweep measures the in-context probes (induction, recall) on each completed run "
                           "(probes.json)", identity="dropped at default")

    def validate(self) -> "DiagConfig":
        check_section(self, "diag.")
        return self


@dataclass
class RunConfig:
    """A whole run. ``seed`` drives model init, data order and dropout. ``device``: ``auto`` (CUDA when available),
    ``cpu`` or ``cuda`` (normlab.train.precision resolves it at the start of training)."""

    seed: int = setting(0, "drives model initialisation, data order and dropout (the unit of replication)",
                        range=I(0, MAX_SEED), aliases=("random_seed",))
    device: str = setting("auto", "where to train: auto (CUDA when available), cpu or cuda", choices=DEVICES,
                          role="runtime")
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    diag: DiagConfig = field(default_factory=DiagConfig)

    def validate(self) -> "RunConfig":
        check_section(self)  # seed, device; each section checks its own keys
        self.data.validate()
        self.model.validate()
        self.train.validate()
        self.optim.validate()
        self.diag.validate()
        return self

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def identity_dict(self) -> dict[str, Any]:
        """``to_dict()`` less the keys each field declares outside a run's identity (``identity=``), so runs from
        before a key existed keep their hashes: ``dropped`` always (``train.track``, ``train.track_required``: where
        the curves are logged; ``train.stack``: a sweep's scheduling, equal to fp32 round-off), ``dropped at
        default`` at their default or an earlier default (``train.deterministic`` auto, and true, its default before;
        ``train.tf32`` auto: how every earlier CPU run trained; ``diag.probes`` false: measured after training; true
        keeps it, so a sweep asking for probes trains runs that measure them)."""
        d = self.to_dict()
        for key, (_, default, facts) in KEYS.items():
            if facts.identity == "kept":
                continue
            *parents, leaf = key.split(".")
            node = d
            for p in parents:
                node = node[p]
            value = node[leaf]
            at_default = any(value == v and type(value) is type(v) for v in (default, *facts.earlier_defaults))
            if facts.identity == "dropped" or at_default:
                del node[leaf]
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
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > _FLOAT_MAX:
            raise NormlabError(f"{key} must be a finite number, got an integer of {len(str(abs(value)))} digits "
                               "(beyond the largest float)")
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str) and _FLOAT.fullmatch(value.strip()):  # YAML 1.1 reads '1e-3' as a string
            return float(value)
    elif tp is str:
        if isinstance(value, str):
            return value
    raise NormlabError(f"{key} must be {_type_name(tp)}, got {type(value).__name__} {value!r}")


_FLOAT_MAX = int(sys.float_info.max)  # an int above it has no float (float() raises OverflowError)


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


KEYS: dict[str, DeclaredKey] = declared_keys(RunConfig)
"""Every config key in config order, ``key -> (annotation, default, facts)``: the fields' own declarations as a
table (normlab.validate.declared_keys, which refuses a key declared without its facts)."""
RANGES = {k: d.facts.range for k, d in KEYS.items() if d.facts.range is not None}
"""The declared numeric ranges, ``key -> Range`` (an attention kind's options: the kind's ``ranges``)."""
KEY_ALIASES = {a: (k, d.facts.alias_note.format(alias=a)) for k, d in KEYS.items() for a in d.facts.aliases}
"""Other tools' names for normlab's keys, ``name -> (key, note when the meaning differs)``: nanoGPT (``n_layer``,
``block_size``, ``learning_rate``, ...), Hugging Face configs and ``TrainingArguments`` (``hidden_size``,
``num_hidden_layers``, ...) and common paper/code spellings (``d_model``, ``n_heads``, ``seq_len``, ...)."""
RUNTIME_KEYS = tuple(k for k, d in KEYS.items() if d.facts.role == "runtime")
"""Keys the machine decides at ``auto`` (a run names what it used on its own line, normlab.train.precision)."""
BOOKKEEPING_KEYS = tuple(k for k, d in KEYS.items() if d.facts.role == "bookkeeping")
"""Keys that say where and how often a run logs, checkpoints and evaluates, not what it trains."""


def suggest_key(key: str, valid: Iterable[str]) -> str:
    """`` (did you mean 'model.depth'?)`` for an unknown config key. Other tools' names first (:data:`KEY_ALIASES`,
    on the key's last component, so ``n_layer``, ``model.n_layer`` and ``train.n_layer`` all resolve: ``n_layer``
    is nowhere near ``depth`` as a string); nothing is renamed silently, so a config always says what normlab ran.
    Other unknown keys get the closest spelling (``normlab.errors.did_you_mean``)."""
    leaf = key.rsplit(".", 1)[-1]
    if leaf in KEY_ALIASES:
        target, note = KEY_ALIASES[leaf]
        return f" (did you mean '{target}'? '{leaf}' is what other tools call it{'; ' + note if note else ''})"
    return did_you_mean(key, valid)


def _all_keys() -> list[str]:
    return list(KEYS)


def _mapping_keys() -> list[str]:
    """Keys whose value is a free-form mapping (``--set model.norm_options.alpha_init=0.5`` sets one entry)."""
    return [k for k, d in KEYS.items() if typing.get_origin(d.annotation) is dict]


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
    if p.exists():  # a FIFO, a directory, a device: never opened (a FIFO would block)
        raise NormlabError(f"config '{name}' is not a regular file (a directory, FIFO or device); give a YAML file or "
                           f"a preset: {', '.join(config_presets())}")
    raise NormlabError(f"config '{name}' is neither a file nor a preset; presets: {', '.join(config_presets())}")


def read_yaml(path: Path) -> dict[str, Any]:
    """Read a YAML mapping; unreadable or non-mapping files are one-line errors."""
    return config_mapping(read_yaml_file(path, "config"), f"config {path}")


def config_mapping(data: Any, label: str) -> dict[str, Any]:
    """The parsed YAML of a config file (``label``: ``"config PATH"``) as its mapping of sections (an empty file:
    ``{}``); anything else is a one-line error."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise NormlabError(f"{label} must be a YAML mapping of sections (seed, device, data, model, train, optim, "
                           "diag)")
    return data


# --------------------------------------------------------------------- building, completing and reading a config
# A config is built from a mapping in one of four ways, each its own function here, so that what is completed (and
# when) is decided in one module: a new run's config (new_config, load_config: missing keys take their defaults,
# then the norms' run-dependent defaults), a sweep's planned run (planned_config: the defaults, the rest left to the
# run's resolver), a config normlab wrote, read back (stored_config: nothing completed again), and a config derived
# from a run's (derive_config: the changed keys, every other one the run's). What needs the data or the machine
# (vocab_size, every ``auto``) is completed when the run starts, by its resolver (normlab.train.resolve).
def config_from_dict(data: dict[str, Any]) -> RunConfig:
    """Build and validate a RunConfig from a nested dict (numeric ranges first: normlab.validate); a missing key
    takes its default. The parser under the functions below."""
    cfg = _build(RunConfig, data, "")
    check_config(cfg)  # every numeric key in its range before any other rule
    return cfg.validate()


def apply_norm_defaults(cfg: RunConfig) -> None:
    """Fill run-dependent norm options the user did not set, in place (so config.yaml records them).

    A norm class that declares ``needs_warmup`` (PowerNorm, Unified Normalization: statistics warm-up) gets
    ``warmup = train.warmup_steps`` unless ``model.norm_options`` already has a ``warmup`` key. Idempotent: a config
    completed once is unchanged by a second call.
    """
    opts = cfg.model.norm_options
    if get_norm_class(cfg.model.norm).needs_warmup and "warmup" not in opts:
        opts["warmup"] = cfg.train.warmup_steps


def new_config(data: dict[str, Any] | None = None, overrides: list[str] | None = None) -> RunConfig:
    """A new run's config: ``data`` (its sections, any of them partial or absent: a preset's, a YAML file's, the
    API's mapping; not changed) with ``overrides`` (``--set`` strings) applied, each missing key its default,
    validated, then completed by what needs neither data nor machine (:func:`apply_norm_defaults`). The run's name,
    ``normlab config`` and ``--init-from``'s check read it as the run will record it."""
    data = apply_overrides(_copy_sections(data or {}), overrides or [])
    cfg = config_from_dict(data)
    apply_norm_defaults(cfg)
    return cfg


def _copy_sections(d: dict[str, Any]) -> dict[str, Any]:
    return {k: _copy_sections(v) if isinstance(v, dict) else v for k, v in d.items()}


def load_config(name: str | Path, overrides: list[str] | None = None) -> RunConfig:
    """:func:`new_config` of a YAML file or preset name with ``--set`` overrides."""
    return new_config(read_yaml(resolve_config_path(str(name))), overrides)


def planned_config(data: dict[str, Any]) -> RunConfig:
    """A sweep's planned run: ``data`` (the sweep file's base with its overrides, partial) with each missing key its
    default, validated, and not completed further: the norms' run-dependent defaults and every ``auto`` are its
    resolver's when it trains (``config.yaml`` records them), so a planned config's hash is the sweep file's and
    stays the one earlier sweeps stored."""
    return config_from_dict(data)


def stored_config(data: dict[str, Any], where: str) -> RunConfig:
    """A config normlab wrote (``RunConfig.to_dict``: a run's ``config.yaml``, a sweep's planned run or store row),
    read back as written: parsed and checked, never completed again -- its norm defaults and resolved ``auto``
    values are the run's own (a planned run's are completed by its resolver when it trains); only a key newer than
    the file takes its default (such keys are declared ``identity="dropped at default"``, so the hash holds). A key
    out of its type or range is one line naming ``where`` (``config runs/x/config.yaml``, ``sweep run r1``)."""
    try:
        return config_from_dict(data)
    except NormlabError as e:
        raise NormlabError(f"{where}: {e}") from None


def derive_config(cfg: RunConfig, changes: dict[str, Any] | None = None,
                  overrides: list[str] | None = None) -> RunConfig:
    """A config derived from ``cfg`` (a run's, already completed): ``changes`` (dotted keys, ``{"model.norm":
    "rmsnorm"}``; a mapping value such as ``model.norm_options`` is replaced whole) and then ``overrides`` (``--set``
    strings) applied to its dict, validated. Every other key is ``cfg``'s, and nothing is completed again: the norm
    defaults and ``auto`` values it holds stay (a derived config that trains is resolved as every run is)."""
    data = cfg.to_dict()
    for key, value in (changes or {}).items():
        *parents, leaf = key.split(".")
        node = data
        for p in parents:
            node = node[p]
        if leaf not in node:
            raise NormlabError(f"derive_config: unknown config key '{key}'{suggest_key(key, _all_keys())}")
        node[leaf] = value
    return config_from_dict(apply_overrides(data, overrides or []))


def dump_config(cfg: RunConfig) -> str:
    """YAML text of the full config (every key, defaults included)."""
    return yaml.safe_dump(cfg.to_dict(), sort_keys=False)
