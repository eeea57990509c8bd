"""The facts each config key declares next to its field (:func:`setting`: help, range, choices, owner, aliases),
the checks derived from them, ranges for command-line flags, the ``NORMLAB_*`` environment, and a memory estimate
checked before anything is allocated.

Every numeric config key (``int``/``float`` annotations of the config dataclasses, also the numeric entries of
``model.norm_options``) must be finite and lie in the ``range`` its field declares (lower bounds where the value
must be positive, upper bounds where memory or time follows from the value); a key with ``choices`` must hold one
of them. An attention kind's options are declared with ``owner="attention"``: their ranges and values are the
kind's (its ``ranges`` and ``check_keys``, checked by ``ModelConfig.validate`` through :func:`check_value`). A
failure is one line naming the key, the value and what is allowed, raised before anything is written.

:func:`check_train_memory` estimates the model (weights, gradients, two AdamW moments: 16 bytes per parameter)
plus one micro-batch's activations (Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
Transformer Models": ``s*b*h*(34 + 5*a*s/h)`` bytes per layer in 16-bit, doubled for float32, plus the logits and
their gradient) and refuses, with the estimate, a run that cannot fit the machine's available memory.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import typing
from dataclasses import dataclass
from typing import Any

from normlab.errors import NormlabError, did_you_mean, unknown

MAX_SEED = 2**63 - 1
GiB = 1024**3


@dataclass(frozen=True)
class Range:
    """``lo <= v <= hi`` (``<`` where open); ``None`` = unbounded. ``integer``: the value must be an int."""

    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False
    integer: bool = False

    def contains(self, v: float) -> bool:
        if isinstance(v, float) and not math.isfinite(v):
            return False
        if self.lo is not None and (v <= self.lo if self.lo_open else v < self.lo):
            return False
        if self.hi is not None and (v >= self.hi if self.hi_open else v > self.hi):
            return False
        return True

    def text(self, value: float | None = None) -> str:
        """What is allowed: ``> 0 (a finite number)``, ``in [0, 1) (a finite number)``; for an integer, the side
        ``value`` violates first: ``>= 1 (an integer in [1, 1000000000])``."""
        kind = "an integer" if self.integer else "a finite number"
        lo = None if self.lo is None else f"{'>' if self.lo_open else '>='} {_num(self.lo)}"
        hi = None if self.hi is None else f"{'<' if self.hi_open else '<='} {_num(self.hi)}"
        if lo and hi:
            full = f"in {'(' if self.lo_open else '['}{_num(self.lo)}, {_num(self.hi)}{')' if self.hi_open else ']'}"
            if self.integer and value is not None:
                side = lo if value <= self.lo else hi
                return f"{side} ({kind} {full})"
            return f"{full} ({kind})"
        if lo or hi:
            return f"{lo or hi} ({kind})"
        return kind


def _num(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else f"{v:g}"


def R(lo=None, hi=None, *, lo_open=False, hi_open=False) -> Range:  # noqa: N802 - table shorthand
    return Range(lo, hi, lo_open, hi_open)


def I(lo=None, hi=None) -> Range:  # noqa: N802, E743 - table shorthand
    return Range(lo, hi, integer=True)


POS = R(0, lo_open=True)
NONNEG = R(0)
UNIT_OPEN_HI = R(0, 1, hi_open=True)

FACTS = "normlab.key"
"""The ``dataclasses.field`` metadata entry that holds a config key's :class:`KeyFacts`."""


@dataclass(frozen=True)
class KeyFacts:
    """What a config key declares next to its field (:func:`setting`); validation (:func:`check_section`),
    ``normlab config`` (normlab.config_help), and the alias hints (normlab.config.suggest_key) read it.

    ``help``: one line. ``range``: a numeric key's allowed values. ``choices``: the allowed values (a tuple, or a
    function returning them when a registry holds them; a list key: each entry). ``owner``: who checks the key
    instead of :func:`check_section` (``attention``: the kind that declares the key's ``ranges`` and
    ``check_keys``; ``norms``: the norm registry), its choices then only listed. ``aliases``: other tools' names
    for the key (nanoGPT, Hugging Face, papers), with ``alias_note`` (``{alias}``: the name) when the meaning
    differs. ``identity``: whether the key is part of a run's identity (its config hash): ``kept``; ``dropped``
    (where a run logs, how a sweep schedules it: no number changes); ``dropped at default`` (a key that came later,
    whose default is how every earlier run trained; ``earlier_defaults``: values that were the key's default
    before, dropped too, so runs stored with them keep their hashes). ``role``: ``runtime`` (the machine decides it
    at ``auto``) or ``bookkeeping`` (where and how often a run logs, checkpoints and evaluates): left out of a run's
    banner."""

    help: str
    range: Range | None = None
    choices: tuple[Any, ...] | typing.Callable[[], typing.Iterable[str]] | None = None
    owner: str = ""
    aliases: tuple[str, ...] = ()
    alias_note: str = ""
    identity: str = "kept"
    role: str = ""
    earlier_defaults: tuple[Any, ...] = ()

    def allowed(self) -> tuple[Any, ...] | None:
        """The choices as a tuple (a registry's read now), or None."""
        return tuple(self.choices()) if callable(self.choices) else self.choices


IDENTITIES = ("kept", "dropped", "dropped at default")
ROLES = ("", "runtime", "bookkeeping")


def setting(default: Any = dataclasses.MISSING, help: str = "", *, range: Range | None = None,
            choices: Any = None, owner: str = "", aliases: tuple[str, ...] = (), alias_note: str = "",
            identity: str = "kept", role: str = "", factory: typing.Callable[[], Any] | None = None,
            earlier_defaults: tuple[Any, ...] = ()) -> Any:
    """A config dataclass field with its facts: ``lr: float = setting(3e-3, "peak learning rate", range=POS)``.
    The type is the field's annotation and the default its default (``factory`` for a list or mapping); a key
    without a one-line ``help`` is refused here, a numeric key without a ``range`` (or an ``owner``) by
    :func:`declared_keys`."""
    if not help or "\n" in help:
        raise TypeError(f"a config key needs a one-line help text, got {help!r}")
    if identity not in IDENTITIES or role not in ROLES:
        raise TypeError(f"identity must be one of {IDENTITIES} and role one of {ROLES}, got {identity!r}, {role!r}")
    meta = {FACTS: KeyFacts(help, range, choices, owner, tuple(aliases), alias_note, identity, role,
                            tuple(earlier_defaults))}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


class DeclaredKey(typing.NamedTuple):
    """One config key as declared: its annotation, its default and its :class:`KeyFacts`."""

    annotation: Any
    default: Any
    facts: KeyFacts


def _numeric(tp: Any) -> bool:
    return any(a in (int, float) for a in (typing.get_args(tp) or (tp,)))


def declared_keys(cls: type, prefix: str = "") -> dict[str, DeclaredKey]:
    """``key -> DeclaredKey`` for every leaf field of config dataclass ``cls`` and its nested sections, in field
    order. A TypeError names a key declared without :func:`setting`, a numeric key with neither a range nor an
    owner, and an alias declared twice or equal to a key's own name."""
    out: dict[str, DeclaredKey] = {}
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp, key = hints[f.name], f"{prefix}{f.name}"
        if dataclasses.is_dataclass(tp):
            out.update(declared_keys(tp, f"{key}."))
            continue
        facts = f.metadata.get(FACTS)
        if facts is None:
            raise TypeError(f"config key {key} is declared without its facts: use normlab.validate.setting(default, "
                            "help, range=/choices=/aliases=)")
        if _numeric(tp) and facts.range is None and not facts.owner:
            raise TypeError(f"numeric config key {key} declares no range (setting(..., range=...))")
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        out[key] = DeclaredKey(tp, default, facts)
    if not prefix:
        leaves = {k.rsplit(".", 1)[-1] for k in out}
        seen: set[str] = set()
        for key, d in out.items():
            for alias in d.facts.aliases:
                if alias in seen or alias in leaves:
                    raise TypeError(f"alias {alias!r} of config key {key} is declared twice or is a key's own name")
                seen.add(alias)
    return out


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def check_value(key: str, value: Any, rng: Range | None = None) -> None:
    """One-line NormlabError unless ``value`` is finite and inside ``rng`` (unbounded without one)."""
    if not _is_number(value):
        return
    rng = rng or R()
    if not rng.contains(value):
        raise NormlabError(f"{key} must be {rng.text(value)}, got {value!r}")


def _or(values: typing.Iterable[Any]) -> str:
    words = ["null" if v is None else str(v).lower() if isinstance(v, bool) else str(v) for v in values]
    return ", ".join(words[:-1]) + f" or {words[-1]}" if len(words) > 1 else words[0]


def check_choice(key: str, value: Any, choices: tuple[Any, ...]) -> None:
    """One-line NormlabError unless ``value`` (each entry of a list) is one of ``choices``: names get the standard
    ``unknown ... allowed:`` line with did-you-mean, a mix with true / false ``KEY must be auto, true or false``."""
    if isinstance(value, list):
        for entry in value:
            if entry not in choices:
                raise unknown(f"{key} entry", entry, choices)
        return
    if value in choices:
        return
    if all(isinstance(c, str) for c in choices):
        raise unknown(key, value, choices)
    raise NormlabError(f"{key} must be {_or(choices)}, got {value!r}")


def _walk(obj: Any, prefix: str = "") -> typing.Iterator[tuple[str, Any, KeyFacts | None]]:
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(v):
            yield from _walk(v, f"{key}.")
        elif isinstance(v, dict):
            for k, sub in v.items():
                yield f"{key}.{k}", sub, None
        else:
            yield key, v, f.metadata.get(FACTS)


def check_config(cfg: Any, prefix: str = "") -> None:
    """Every numeric key of a RunConfig (or of one section, ``prefix`` e.g. ``"model."``) and its nested sections
    finite and in its declared range (the first failure is raised): what ``config_from_dict`` checks first."""
    for key, value, facts in _walk(cfg, prefix):
        check_value(key, value, facts.range if facts else None)


def check_section(section: Any, prefix: str = "") -> None:
    """The declared facts of one config section's own keys, in field order (what each section's ``validate`` checks
    first; nested sections check their own): every number finite and in its ``range``, every value among its
    ``choices``, the entries of a mapping finite; a key with an ``owner`` is left to it."""
    for f in dataclasses.fields(section):
        value, key = getattr(section, f.name), f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value):
            continue
        facts = f.metadata.get(FACTS)
        if isinstance(value, dict):
            for k, sub in value.items():
                check_value(f"{key}.{k}", sub)
            continue
        check_value(key, value, facts.range if facts else None)
        if facts is not None and facts.choices is not None and not facts.owner:
            check_choice(key, value, facts.allowed())


# ---------------------------------------------------------------------------------------------- environment
def _number(lo: float, lo_open: bool, hi: float) -> typing.Callable[[str], Any]:
    def parse(text: str) -> float:
        v = float(text)  # ValueError for "lots"
        if not math.isfinite(v) or v < lo or (lo_open and v == lo) or v > hi:
            raise ValueError(text)
        return v
    return parse


YEAR_S = 365 * 86400.0  # the most seconds a NORMLAB_* duration may be (sqlite's busy timeout is an int of ms)
MAX_MEMORY_GB = 2.0**20  # 1 PiB: NORMLAB_MEMORY_GB above this is a typo (its bytes must fit an integer)


def _choice(*allowed: str) -> typing.Callable[[str], Any]:
    def parse(text: str) -> str:
        if text not in allowed:
            raise ValueError(text)
        return text
    return parse


def _path(text: str) -> str:
    if not text.strip():
        raise ValueError(text)
    return text


def _cpu_plan(text: str) -> str:
    parts = text.split()
    if len(parts) != 2 or not parts[0].isdigit() or int(parts[0]) < 1 or parts[1] not in ("spin", "passive"):
        raise ValueError(text)
    return text


ENV_VARS: dict[str, tuple[str, typing.Callable[[str], Any]]] = {
    "NORMLAB_CACHE_DIR": ("a directory path", _path),
    "NORMLAB_DB_TIMEOUT": ("a finite number of seconds > 0 and <= 31536000 (a year)", _number(0.0, True, YEAR_S)),
    "NORMLAB_DIST_BACKEND": ("'gloo' (or unset: NCCL for CUDA tensors)", _choice("gloo")),
    "NORMLAB_MALLOC": ("'default' (glibc's own malloc settings) or unset", _choice("default")),
    "NORMLAB_MEMORY_GB": ("a finite number of GiB > 0 and <= 1048576 (1 PiB)", _number(0.0, True, MAX_MEMORY_GB)),
    "NORMLAB_PROGRESS_EVERY": ("a finite number of seconds >= 0 (0: off) and <= 31536000 (a year)",
                               _number(0.0, False, YEAR_S)),
    "NORMLAB_RAY_FILES": ("auto, shared or copy", _choice("auto", "shared", "copy")),
    # set by normlab for its child processes (normlab.train.threads, normlab.train.heap)
    "NORMLAB_CPU_PLAN": ("'<threads> spin' or '<threads> passive' (set by normlab)", _cpu_plan),
    "NORMLAB_WAIT_POLICY_NOTE": ("any text (set by normlab)", str),
    "NORMLAB_HEAP_NOTE": ("any text (set by normlab)", str),
}
"""Every ``NORMLAB_*`` environment variable normlab reads: what it must be, and its parser (ValueError when bad).
``NORMLAB_TEST_*`` names are the test suite's hooks and are not normlab's."""


def env_value(name: str, default: Any = None, environ: typing.Mapping[str, str] | None = None) -> Any:
    """The parsed value of ``NORMLAB_*`` variable ``name`` (:data:`ENV_VARS`), ``default`` when unset or empty; a
    one-line NormlabError naming the variable, the value and what is allowed when it is bad."""
    text = (os.environ if environ is None else environ).get(name, "")
    if text == "":
        return default
    what, parse = ENV_VARS[name]
    try:
        return parse(text)
    except ValueError:
        raise NormlabError(f"{name} must be {what}, got {text!r}") from None


def check_environment(environ: typing.Mapping[str, str] | None = None) -> None:
    """Every ``NORMLAB_*`` variable of ``environ`` (default ``os.environ``) known and valid (``env_value``); an
    unknown name is refused with the closest known one (a misspelt variable would otherwise do nothing)."""
    env = os.environ if environ is None else environ
    for name in sorted(env):
        if not name.startswith("NORMLAB_") or name.startswith("NORMLAB_TEST_"):
            continue
        if name not in ENV_VARS:
            raise NormlabError(f"unknown environment variable {name}{did_you_mean(name, ENV_VARS)}; normlab reads "
                               f"{', '.join(sorted(ENV_VARS))}")
        env_value(name, environ=env)


# ---------------------------------------------------------------------------------------------- memory
def available_memory() -> int:
    """Bytes this process may still allocate: ``MemAvailable`` (Linux), else physical memory;
    ``NORMLAB_MEMORY_GB`` (GiB, finite, > 0) replaces it."""
    override = env_value("NORMLAB_MEMORY_GB")
    if override is not None:
        return int(override * GiB)
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 1 << 62


def param_count(mc: Any) -> int:
    """Approximate parameter count of a GPT of ``mc`` (embeddings, head, attention and MLP weights)."""
    w, d, v = mc.width, mc.depth, mc.vocab_size
    mlp = mc.mlp_hidden or int(mc.mlp_ratio * w)
    mlp_mats = 3 if mc.activation == "swiglu" else 2
    per_block = 4 * w * w + mlp_mats * w * mlp + 8 * w
    emb = v * w * (1 if mc.tie_embeddings else 2)
    pos = mc.context * w if mc.positions == "learned" else 0
    return emb + pos + d * per_block


MAX_PARAMS = 10**11
"""The most parameters a model config may describe (400 GB of float32 weights): every size key can be within its
range while the product is not, so the total is checked too (``ModelConfig.validate``), before anything is
allocated."""


def check_param_total(mc: Any, what: str = "the model") -> int:
    """``param_count(mc)``, or a one-line NormlabError when it exceeds :data:`MAX_PARAMS` (the limit named)."""
    n = param_count(mc)
    if n > MAX_PARAMS:
        raise NormlabError(f"{what} has about {n:.3g} parameters (model.vocab_size {mc.vocab_size}, width {mc.width}, "
                           f"depth {mc.depth}, mlp {mc.mlp_hidden or mc.mlp_ratio}); the limit is {MAX_PARAMS:.0e} "
                           "parameters")
    return n


def forward_bytes(mc: Any, batch: int, context: int, *, backward: bool) -> int:
    """Activation bytes of one forward (and backward) over ``[batch, context]`` tokens (float32)."""
    s, b, h, a = context, batch, mc.width, mc.heads
    per_layer = s * b * (34 * h + 5 * a * s) * 2  # Korthikanti et al. 2022, x2 for float32
    logits = b * s * mc.vocab_size * 4 * (3 if backward else 2)
    if not backward:
        per_layer //= 4  # only the live layer's tensors, not all saved for backward
        return per_layer * 2 + logits
    return mc.depth * per_layer + logits


def _gib(n: float) -> str:
    return f"{n / GiB:.3g} GiB"


def check_memory(need: int, parts: str, what: str, fix: str, available: tuple[int, str] | None = None) -> None:
    have, where = available if available is not None else (available_memory(), "this machine has")
    if need > have:
        raise NormlabError(f"{what} needs an estimated {_gib(need)} ({parts}) but {where} {_gib(have)} "
                           f"available; {fix}")


def check_train_memory(cfg: Any, members: int = 1, available: tuple[int, str] | None = None) -> None:
    """Refuse a run whose model + one micro-batch cannot fit the available memory (one line with the estimate);
    ``members``: a stacked group's size (normlab.train.stacked: each member's model and micro-batch at once);
    ``available``: ``(bytes, where)`` of the device the run trains on (a CUDA device's free memory, read by the
    caller, which knows the device), else this machine's (:func:`available_memory`)."""
    mc = cfg.model
    model = members * 16 * param_count(mc)  # weights, gradients, AdamW exp_avg and exp_avg_sq in float32
    batch = members * forward_bytes(mc, cfg.train.batch_size, mc.context, backward=True)
    check_memory(model + batch, f"model {_gib(model)} + one batch {_gib(batch)}",
                 "training" if members == 1 else f"a stacked group of {members}",
                 "lower model.width, model.depth, model.context or train.batch_size (train.grad_accum keeps the "
                 "effective batch)" + ("" if members == 1 else ", or train each run alone (train.stack: off)"),
                 available=available)


def check_eval_memory(mc: Any, batch: int, context: int, what: str) -> None:
    model = 4 * param_count(mc)
    act = forward_bytes(mc, batch, context, backward=False)
    check_memory(model + act, f"model {_gib(model)} + one batch {_gib(act)}", what,
                 "lower the batch size, the number of sequences or the context")


# ---------------------------------------------------------------------------------------------- CLI flags
def _flag_type(cast, rng: Range, name: str):
    """argparse ``type=``: ``cast(text)`` must succeed and lie in ``rng`` (argparse prints the one-line error)."""

    def parse(text: str):
        try:
            v = cast(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {rng.text()}, got '{text}'") from None
        if not rng.contains(v):
            raise argparse.ArgumentTypeError(f"must be {rng.text(v)}, got {text}")
        return v

    parse.__name__ = name
    return parse


def flag_in(rng: Range):
    """argparse ``type=`` for a flag whose bounds are ``rng`` (one of :data:`ARG_BOUNDS`: the API checks the same)."""
    return _flag_type(int if rng.integer else float, rng, "integer" if rng.integer else "number")


# The bounds of the arguments the CLI's flags and the Python API (normlab.api) share: one table, checked by argparse
# for a flag (``flag_in``) and by ``check_arg`` for an API argument, so both refuse the same values.
SPLITS = ("val", "test", "all")
ARG_BOUNDS: dict[str, Range] = {
    "context": Range(1, 2**20, integer=True), "stride": Range(1, 2**20, integer=True),
    "batch_size": Range(1, 2**16, integer=True), "max_tokens": Range(0, 2**40, integer=True),
    "max_new_tokens": Range(0, 100_000, integer=True), "seed": Range(0, MAX_SEED, integer=True),
    "temperature": R(0),
}


def shown(v: Any) -> str:
    """``v`` for a one-line error: an integer past 30 digits by its length (``repr`` of one past 4300 digits raises),
    anything else by a clipped ``repr``."""
    if isinstance(v, int) and not isinstance(v, bool) and abs(v) >= 10**30:
        return f"an integer of about {int(abs(v).bit_length() * 0.30103) + 1} digits"
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def check_arg(name: str, value: Any, rng: Range | None = None, *, optional: bool = False) -> Any:
    """An API argument checked as its CLI flag is (``ARG_BOUNDS[name]`` unless ``rng`` is given): an int (for an
    integer range; not a bool) or a real number, within the bounds; ``optional``: None is allowed (the default).
    Anything else is a one-line NormlabError naming the argument, what is allowed and what it got."""
    rng = rng or ARG_BOUNDS[name]
    if value is None and optional:
        return None
    kind_ok = (isinstance(value, int) if rng.integer else isinstance(value, (int, float))) and not isinstance(
        value, bool)
    if not kind_ok or not rng.contains(value):
        raise NormlabError(f"{name} must be {rng.text(value if kind_ok else None)}, got {shown(value)}")
    return value


def int_in(lo: int | None = None, hi: int | None = None):
    """argparse ``type=`` for an integer flag in ``[lo, hi]``."""
    return _flag_type(int, I(lo, hi), "integer")


def float_in(lo: float | None = None, hi: float | None = None, *, lo_open: bool = False):
    """argparse ``type=`` for a finite float flag in its range."""
    return _flag_type(float, R(lo, hi, lo_open=lo_open), "number")
