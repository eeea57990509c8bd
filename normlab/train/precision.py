"""Device, precision and compilation of a training run: ``device``, ``train.precision``, ``train.compile``.

``resolve_runtime(cfg)`` turns every ``auto`` into a concrete value *in place* (so ``config.yaml`` records what the
run used) and returns one line per decision with its reason, printed at start and stored in ``summary.json``.

- ``device: auto | cpu | cuda`` -- ``auto`` is ``cuda`` when ``torch.cuda.is_available()``, else ``cpu``.
- ``train.precision: auto | fp32 | bf16`` -- ``bf16`` runs the forward pass under ``torch.autocast(bfloat16)``: the
  matmuls (linear layers, attention's ``q k^T`` and ``a v``) in bf16, while the weights, gradients and optimizer
  state stay fp32 (master weights). Kept in fp32: every normalization layer (it runs with autocast off on an fp32
  copy of its input, so its statistics -- mean, variance, RMS, batch statistics and their running buffers -- are fp32),
  the loss (the logits are cast to fp32 before the cross-entropy), evaluation on a CPU (no autocast; on CUDA a bf16
  run's periodic evaluation runs its forward under bf16 autocast, the cross-entropy in fp32) and the diagnostics
  (they cast to fp32). Softmax on bf16 scores accumulates its max and normaliser in fp32 inside torch's kernels
  (SDPA's flash kernel and ``torch.softmax`` both use an fp32 accumulator). ``auto`` on a CUDA device picks bf16
  whenever the device supports it (``torch.cuda.is_bf16_supported``), without a timing probe: a probe at a tiny
  shape measures launch overhead, not the matmuls that dominate a real step. On a CPU ``auto`` picks bf16 only
  where the hardware has fast bf16 (AMX or AVX512-BF16) *and* a probe at the model's shape (paired rounds, median
  ratio) measures it at least ``BF16_MARGIN`` faster than fp32 (the probe is cached per machine and shape in
  ``<cache dir>/precision_probe.json``); fp32 otherwise.
- ``train.tf32: auto | true | false`` -- CUDA only: fp32 matmuls and convolutions (a ``precision: fp32`` run, and
  the fp32 parts of a bf16 run) use TF32 tensor cores (``torch.set_float32_matmul_precision("high")``, 10-bit mantissa
  products, fp32 accumulation); ``auto`` and ``true`` switch it on, ``false`` asks for strict fp32 ("highest").
  Restored after the run. On a CPU nothing is set (CPU numbers unchanged).
- ``train.compile: auto | true | false`` -- ``torch.compile`` of the model (``nn.Module.compile``: parameter names and
  checkpoints unchanged). Needs a C++ compiler on CPU; without one the run says so in one line and runs uncompiled.
  ``auto`` compiles on CUDA, and on CPU only for runs whose training FLOPs (steps x the step's FLOPs) reach
  ``COMPILE_PAYBACK_FLOPS``, the work after which the measured compile time is paid back (docs/benchmarks.md);
  shorter runs, like all of the lab's presets, run eager. On CUDA it needs a working triton (else uncompiled, with
  why). A compile that fails at the first compiled step (forward or backward) is not fatal: the run says so in one
  line, repeats that micro-batch eager and trains on eager (``compile_fallback_step`` in summary.json), as a stacked
  group does. The compile time is measured (the first step minus a normal step) and reported.
- ``train.deterministic: auto | true | false`` (default auto) -- ``true``: on CUDA,
  ``torch.use_deterministic_algorithms(True)`` for the run (restored after it; without torch's debugging fill of new
  memory with NaN, which changes no result of a correct kernel) and ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` where unset
  (``import normlab`` sets it, before torch is imported, and it is never removed: cuBLAS reads it once per process):
  SDPA then runs deterministic backward kernels, inductor avoids atomic adds and cuBLAS a shared workspace, so a run
  resumed after kill -9 is bit-identical to one never stopped (tests/test_cuda.py). ``auto`` (the default) and
  ``false``: on CUDA the fast kernels (CUDA's atomic-add kernels make two identical runs, and a resumed run and the
  run it continues, differ in the last bits; ask ``true`` for exact resume); the resolved value is what a CUDA run's
  config.yaml records, and ``summary.json``'s ``deterministic`` says which it was. On a CPU nothing changes whatever
  the setting: the kernels normlab runs there give the same bits for the same inputs and thread count (the resume
  tests check it), and ``auto`` hashes as ``true``, the default before, so stored CPU runs keep their hashes.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import platform
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils import deterministic as torch_deterministic
from torch.utils._triton import has_triton as torch_has_triton  # private: kept behind has_triton

from normlab.data.cache import default_cache_dir
from normlab.errors import NormlabError
from normlab.io import read_json, write_json
from normlab.locks import exclusive_lock
from normlab.model import build_model
from normlab.norms.registry import _REGISTRY
from normlab.train.threads import step_flops

DEVICES = ("auto", "cpu", "cuda")
PRECISIONS = ("auto", "fp32", "bf16")
BF16_MARGIN = 0.10  # auto picks bf16 only when its probed step is >= 10% faster than fp32's
# CPU: a run's training FLOPs from which torch.compile pays back its compile time. Measured on an idle 2-core AMD
# EPYC (AVX512-BF16), 1 thread, cold inductor cache (benchmarks/nanogpt_speed.py, docs/benchmarks.md, 2026-11-26):
# S compiled in 21 s for 1.028x the eager step (pays back after 11,849 steps of 4.1 GFLOP = 4.8e13 FLOPs), M in 25 s
# for 1.019x (1,267 steps of 146 GFLOP = 1.9e14). The larger of the two: compile only where both shapes would have
# paid back. (An earlier measurement under load, 169 s for 1.31x at S, gave 3.5e12; on an idle machine the eager
# step gains far less.) Expressing it as work assumes the compile time and the saved fraction stay near S's and M's.
COMPILE_PAYBACK_FLOPS = 1.9e14


# ---------------------------------------------------------------------------------------------------- hardware
def cpu_flags() -> set[str]:
    """The CPU feature flags of ``/proc/cpuinfo`` (empty where it does not exist)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def fast_bf16(device: str) -> tuple[bool, str]:
    """Whether ``device`` has bf16 matrix units, and a short reason."""
    if device == "cuda":
        ok = torch.cuda.is_bf16_supported()
        return ok, f"CUDA device {'supports' if ok else 'lacks'} bf16"
    flags = cpu_flags()
    units = sorted(flags & {"amx_bf16", "avx512_bf16"})
    if units:
        return True, f"CPU has {' and '.join(u.upper() for u in units)}"
    return (
        False,
        f"CPU has no bf16 matrix units (no AMX / AVX512-BF16; torch uses {torch.backends.cpu.get_cpu_capability()})",
    )


def cxx_compiler() -> str | None:
    """The C++ compiler inductor would use (``$CXX``, ``c++``, ``g++``, ``clang++``), or None."""
    for name in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if name and shutil.which(name):
            return name
    return None


# ---------------------------------------------------------------------------------------------------- resolve
def has_triton() -> bool:
    """Whether inductor can generate GPU kernels here (``torch.utils._triton.has_triton``: the triton package and a
    device it supports)."""
    return torch_has_triton()


def resolve_device(name: str) -> tuple[str, str]:
    if name == "auto":
        dev = "cuda" if torch.cuda.is_available() else "cpu"
        return dev, "auto: " + ("a CUDA device is available" if dev == "cuda" else "no CUDA device")
    if name == "cuda" and not torch.cuda.is_available():
        raise NormlabError("device: cuda was asked for but torch sees no CUDA device; use device: cpu or auto")
    return name, "set in the config"


def _probe_key(cfg: Any, device: str) -> str:
    m = cfg.model
    # the shape only (not the norm or placement): every variant of a sweep at one shape gets the same precision
    shape = {k: getattr(m, k) for k in ("vocab_size", "context", "width", "depth", "heads", "mlp_ratio", "attention")}
    return json.dumps({"probe": 2, "cpu": cpu_name() if device == "cpu" else torch.cuda.get_device_name(),
                       "device": device,
                       "threads": torch.get_num_threads(), "torch": torch.__version__, "batch": cfg.train.batch_size,
                       **shape}, sort_keys=True)


def probe_step_times(cfg: Any, device: str, reps: int = 9, budget_s: float = 30.0) -> dict[str, float]:
    """One forward + backward at ``cfg``'s model shape and batch in fp32 and in bf16, alternating which goes first,
    for ``reps`` rounds or until ``budget_s`` is spent (at least 3 rounds after a warm-up round). Returns the median
    seconds of each and ``ratio``, the median over rounds of ``fp32 / bf16`` within a round (paired: load on a shared
    machine hits both alike). Runs under ``torch.random.fork_rng`` so the run's seeded RNG streams are untouched."""
    with torch.random.fork_rng(devices=[torch.cuda.current_device()] if device == "cuda" else []):
        model = build_model(cfg.model).to(device)
        prepare_model(model, "bf16")
        idx = torch.randint(cfg.model.vocab_size, (cfg.train.batch_size, cfg.model.context), device=device)
        times: dict[str, list[float]] = {"fp32": [], "bf16": []}
        t0 = time.perf_counter()
        for rep in range(reps + 1):
            for prec in ("fp32", "bf16") if rep % 2 else ("bf16", "fp32"):
                t = time.perf_counter()
                with autocast(device, prec):
                    out = model(idx)
                out.float().square().mean().backward()
                if device == "cuda":
                    torch.cuda.synchronize()
                if rep:  # the first round warms up
                    times[prec].append(time.perf_counter() - t)
                model.zero_grad(set_to_none=True)
            if rep >= 3 and time.perf_counter() - t0 > budget_s:
                break
    ratios = sorted(a / b for a, b in zip(times["fp32"], times["bf16"]))
    out = {k: sorted(v)[len(v) // 2] for k, v in times.items()}
    out["ratio"] = ratios[len(ratios) // 2]
    return out


def _cached_probe(cfg: Any, device: str) -> dict[str, float]:
    """The probe's times for this machine and shape: from the cache, else measured (under a file lock, so the
    workers of a sweep starting together probe once and agree)."""
    path = Path(cfg.data.cache_dir or default_cache_dir()) / "precision_probe.json"
    key = _probe_key(cfg, device)
    path.parent.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(path.with_suffix(".lock"), "the precision probe's cache", wait=True):
        try:  # the bounded reader; a damaged cache is probed again
            cache = read_json(path, "precision probe cache") if path.exists() else {}
        except NormlabError:
            cache = {}
        cache = cache if isinstance(cache, dict) else {}
        if key not in cache:
            cache[key] = probe_step_times(cfg, device)
            write_json(path, cache)
    return cache[key]


def resolve_precision(cfg: Any, device: str) -> tuple[str, str]:
    name = cfg.train.precision
    if name != "auto":
        return name, "set in the config"
    ok, why = fast_bf16(device)
    if not ok:
        return "fp32", f"auto: {why}"
    if device == "cuda":
        return "bf16", f"auto: {why} (no timing probe on CUDA)"
    t = _cached_probe(cfg, device)
    speedup = t["ratio"]
    pick = "bf16" if speedup >= 1.0 + BF16_MARGIN else "fp32"
    return pick, f"auto: {why}; bf16 step measured {speedup:.2f}x fp32's at this shape"


def resolve_compile(value: bool | str, device: str, work: float = 0.0) -> tuple[bool, str]:
    """``train.compile`` -> ``(compile?, reason)``. ``work``: the run's training FLOPs (steps x
    ``normlab.train.threads.step_flops``); on CPU ``auto`` compiles when it reaches ``COMPILE_PAYBACK_FLOPS``."""
    if value == "auto":
        if device != "cuda":
            if work < COMPILE_PAYBACK_FLOPS:
                return False, (f"auto: off on CPU (the run's {work / 1e12:.2g} TFLOP are below the "
                               f"{COMPILE_PAYBACK_FLOPS / 1e12:.0f} TFLOP where compiling pays back)")
            value, why = True, (f"auto: on (the run's {work / 1e12:.2g} TFLOP exceed the "
                                f"{COMPILE_PAYBACK_FLOPS / 1e12:.0f} TFLOP where compiling pays back)")
        else:
            value, why = True, "auto: on for CUDA"
    else:
        why = "set in the config"
    if value and device == "cpu" and cxx_compiler() is None:
        return False, "no C++ compiler found (install g++ or set CXX); running uncompiled"
    if value and device == "cuda" and not has_triton():
        return False, "no working triton for this CUDA device (inductor's GPU kernels need it); running uncompiled"
    return bool(value), why


def resolve_runtime(cfg: Any) -> list[str]:
    """Replace ``auto`` in ``cfg.device``, ``cfg.train.precision`` and ``cfg.train.compile`` by what this machine
    uses, in place, and switch on deterministic CUDA kernels (``train.deterministic``); returns the decisions as
    ``key: value (reason)`` lines."""
    dev, why_dev = resolve_device(cfg.device)
    det, why_det = use_deterministic_kernels(dev, cfg.train.deterministic)  # before the probe's first matmul
    tf32, why_tf32 = use_tf32(dev, cfg.train.tf32)
    if dev == "cuda":  # config.yaml records what the run used; a CPU run keeps its keys (and hash) as they were
        cfg.train.tf32, cfg.train.deterministic = tf32, det
    prec, why_prec = resolve_precision(cfg, dev)
    comp, why_comp = resolve_compile(cfg.train.compile, dev, cfg.train.steps * step_flops(cfg))
    cfg.device, cfg.train.precision, cfg.train.compile = dev, prec, comp
    lines = [f"device {dev} ({why_dev})", f"precision {prec} ({why_prec})",
             f"compile {'on' if comp else 'off'} ({why_comp})"]
    return lines + ([f"deterministic {why_det}"] if why_det else []) + ([f"tf32 {why_tf32}"] if why_tf32 else [])


def use_tf32(device: str, value: bool | str) -> tuple[bool | str, str]:
    """``train.tf32`` on ``device``: on CUDA set TF32 for fp32 matmuls and cuDNN convolutions (the caller restores the
    previous setting with ``kept_determinism``) and return ``(on?, reason)``; on a CPU set nothing, ``(value, "")``."""
    if device != "cuda":
        return value, ""
    on = value in (True, "auto")
    others = _knobs()
    _set_tf32(("high", True) if on else ("highest", False))
    _restore_knobs(others, keep=("cuda.matmul", "cudnn.conv", "cudnn.rnn"))  # the CPU's (mkldnn) matmuls as they were
    if not on:
        return False, "off (train.tf32: false; fp32 matmuls in strict fp32)"
    why = "auto: on for CUDA" if value == "auto" else "set in the config"
    return True, f"on ({why}; fp32 matmuls use TF32 tensor cores; train.tf32=false for strict fp32)"


def _tf32_state() -> tuple[Any, Any]:
    """The TF32 switches of CUDA matmuls and cuDNN convolutions, as ``(torch.get_float32_matmul_precision(),
    torch.backends.cudnn.allow_tf32)``. On torch >= 2.9 both legacy reads raise once something in the process set
    TF32 through the new ``fp32_precision`` API alone; then that switch is read there instead, as ``("new", value)``.
    """
    try:
        matmul: Any = torch.get_float32_matmul_precision()
    except RuntimeError:
        matmul = ("new", torch.backends.cuda.matmul.fp32_precision)
    try:
        conv: Any = torch.backends.cudnn.allow_tf32
    except RuntimeError:
        conv = ("new", torch.backends.cudnn.conv.fp32_precision)
    return matmul, conv


# torch >= 2.9's fp32_precision switches, parents before children; "" is torch.backends itself
_KNOBS = ("", "cuda.matmul", "cudnn", "cudnn.conv", "cudnn.rnn", "mkldnn", "mkldnn.matmul", "mkldnn.conv",
          "mkldnn.rnn")


def _knob(name: str) -> Any:
    obj = torch.backends
    for part in filter(None, name.split(".")):
        obj = getattr(obj, part)
    return obj


def _knobs() -> dict[str, str]:
    """Every ``fp32_precision`` switch of this torch (``{}`` before 2.9): ``torch.set_float32_matmul_precision`` also
    sets the CPU's (mkldnn) matmul switch and ``cudnn.allow_tf32`` the cuDNN RNN one, which ``_tf32_state`` omits."""
    if not hasattr(torch.backends, "fp32_precision"):
        return {}
    return {name: _knob(name).fp32_precision for name in _KNOBS}


def _restore_knobs(saved: dict[str, str], keep: tuple[str, ...] = ()) -> None:
    """Set each switch of ``saved`` (but those in ``keep``) back where it differs, parents first."""
    for name, value in saved.items():
        if name not in keep and _knob(name).fp32_precision != value:
            _knob(name).fp32_precision = value


def _set_tf32(state: tuple[Any, Any]) -> None:
    """Set what :func:`_tf32_state` returns. A run sets ``("high", True)`` or ``("highest", False)`` through
    ``torch.set_float32_matmul_precision`` and ``cudnn.allow_tf32``, which leave every read consistent: the new API's
    ``torch.backends.cuda.matmul.fp32_precision = "tf32"`` alone makes ``torch.get_float32_matmul_precision()`` raise
    (torch 2.13), and inductor's autotuner reads it."""
    matmul, conv = state
    if isinstance(matmul, tuple):
        torch.backends.cuda.matmul.fp32_precision = matmul[1]
    else:
        torch.set_float32_matmul_precision(matmul)
    if isinstance(conv, tuple):
        torch.backends.cudnn.conv.fp32_precision = conv[1]
    else:
        torch.backends.cudnn.allow_tf32 = conv


CUBLAS_WORKSPACE = ":4096:8"  # what ``import normlab`` sets (normlab/__init__.py: the same value, set before torch)


def fix_cublas_workspace() -> None:
    """Set ``CUBLAS_WORKSPACE_CONFIG`` (where unset) in a process that trains several runs, before its first: torch
    sizes cuBLAS's workspace from it once, at the process's first cuBLAS call, so a deterministic CUDA run after a
    ``train.deterministic: false`` one in the same sweep worker would otherwise run on the default workspace. On a
    CPU it changes nothing. (``import normlab`` sets it already; this keeps a worker right if something unset it.)"""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)


def use_deterministic_kernels(device: str, on: bool | str) -> tuple[bool, str]:
    """``train.deterministic`` on ``device``: ``(deterministic?, reason line)``. On CUDA ``true`` switches torch's
    deterministic algorithms on (the caller restores the previous setting with ``kept_determinism``), without
    torch's debugging fill of new memory with NaN (it changes no result of a correct kernel); ``auto`` and
    ``false`` leave the fast kernels. On a CPU nothing is switched: its kernels give the same bits for the same
    inputs and thread count whatever the setting, ``(True, "")``."""
    if device != "cuda":
        return True, ""
    if on is not True:
        why = "auto: off on CUDA, the fast path" if on == "auto" else "train.deterministic: false"
        return False, f"no ({why}; a resumed CUDA run can differ in the last bits; train.deterministic=true for exact)"
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_WORKSPACE)  # import normlab set it; read by cuBLAS
    torch.use_deterministic_algorithms(True)
    torch_deterministic.fill_uninitialized_memory = False
    how = f"torch.use_deterministic_algorithms, CUBLAS_WORKSPACE_CONFIG={os.environ['CUBLAS_WORKSPACE_CONFIG']}"
    return True, (f"yes (set in the config: deterministic kernels for bit-exact resume, {how}; new memory is not "
                  "filled with NaN, a debugging aid that changes no result)")


def nondeterministic_op_error(e: BaseException) -> Exception | None:
    """The one-line error for ``e`` when it is torch refusing an operation that has no deterministic kernel while
    ``train.deterministic`` switched deterministic algorithms on (on CUDA, e.g. an attention kind or diagnostic
    built on a scatter-add), else None."""
    msg = str(e)
    if not (isinstance(e, RuntimeError) and torch.are_deterministic_algorithms_enabled()):
        return None
    if "CUBLAS_WORKSPACE_CONFIG" in msg:  # torch's check of the variable at a cuBLAS call with determinism on
        now = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
        return NormlabError(f"train.deterministic: cuBLAS needs CUBLAS_WORKSPACE_CONFIG={CUBLAS_WORKSPACE} (or :16:8) "
                            f"for deterministic matmuls, and this process has "
                            f"{'it unset' if now is None else repr(now)}; set it before the process's first CUDA "
                            "work (import normlab first, or export it), or set train.deterministic=false")
    if "does not have a deterministic implementation" not in msg:
        return None
    first = msg.splitlines()[0][:200] if msg else "RuntimeError"
    return NormlabError(f"train.deterministic: an operation of this run has no deterministic kernel on this device "
                        f"({first}); set train.deterministic=false to run it (a resumed run may then differ in the "
                        "last bits)")


@contextlib.contextmanager
def kept_determinism() -> Iterator[None]:
    """Restore torch's deterministic-algorithms setting (with its NaN fill of new memory) and the TF32 switches on
    exit (a run sets them for CUDA). ``CUBLAS_WORKSPACE_CONFIG`` stays set: cuBLAS read it once, at the process's
    first handle, so a later deterministic run in this process needs it still there."""
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    fill = torch_deterministic.fill_uninitialized_memory
    tf32, knobs = _tf32_state(), _knobs()
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
        torch_deterministic.fill_uninitialized_memory = fill
        if _tf32_state() != tf32:  # set by a CUDA run
            _set_tf32(tf32)
        _restore_knobs(knobs)


# ---------------------------------------------------------------------------------------------------- running
def autocast(device: str, precision: str) -> contextlib.AbstractContextManager:
    """The forward pass's context: bf16 autocast for ``bf16``, nothing for ``fp32``."""
    if precision == "bf16":
        return torch.autocast(device_type=device, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _fp32_forward(forward: Any) -> Any:
    """``forward`` with autocast off and a bf16 / fp16 input cast to fp32 (the norm computes in fp32)."""

    @functools.wraps(forward)
    def run(x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        with torch.autocast(device_type=x.device.type, enabled=False):
            return forward(x.float() if x.dtype in (torch.bfloat16, torch.float16) else x, *args, **kwargs)

    return run


def norm_layers(model: nn.Module) -> Iterator[nn.Module]:
    """Every module of ``model`` that is a registered norm class (block, embedding, final and QK norms)."""
    classes = tuple(_REGISTRY.values())
    return (m for m in model.modules() if isinstance(m, classes))


def prepare_model(model: nn.Module, precision: str) -> nn.Module:
    """For ``bf16``: every norm layer runs with autocast off on an fp32 input (its ``forward`` is wrapped), so its
    statistics and its own reductions (``vecdot``, ``@``) are fp32 under autocast. Weights stay fp32 in every
    precision."""
    if precision == "bf16":
        for m in norm_layers(model):
            m.forward = _fp32_forward(m.forward)
    return model


class CompileTimer:
    """Measures ``torch.compile``'s cost: the first step's time minus the median of the next few."""

    def __init__(self, enabled: bool, n: int = 5):
        self.enabled, self.n, self.times = enabled, n, []

    def add(self, seconds: float) -> None:
        if self.enabled and len(self.times) <= self.n:
            self.times.append(seconds)

    @property
    def compile_s(self) -> float | None:
        if not self.enabled or len(self.times) < 2:
            return None
        rest = sorted(self.times[1:])
        return max(self.times[0] - rest[len(rest) // 2], 0.0)
