#!/usr/bin/env python
"""Training throughput of normlab's GPT vs x-transformers at the same shape, on this machine's CPU.

Measures, in one process:

1. the machine's own fp32 GEMM peak (best-of ``torch.mm`` on large square matrices, GFLOP/s), the MFU denominator;
2. training throughput (tokens/s of forward + backward + AdamW step, after warm-up, median over timed windows) and
   MFU of normlab's GPT and of x-transformers' ``TransformerWrapper(Decoder(...))`` at the same shape. The two
   models run alternately (window by window, order flipped every round) so machine noise hits both alike;
3. the normlab training loop's per-step extras (batch sampling, lr schedule, ``loss.item()``, grad clipping);
4. with ``--variants``: candidate speed-ups of normlab's GPT, each timed against the unmodified model by
   monkeypatching inside this process (no model file is edited).

Model FLOPs per token (nanoGPT ``estimate_mfu``): ``6 N + 12 L d T`` with ``N`` the parameters that take part in
matmuls (all parameters minus the input embedding table; the LM head counts even when tied to it), ``L`` depth,
``d`` width, ``T`` context. MFU = tokens/s * FLOPs/token / measured GEMM peak.

Results go to the section of ``--out`` (default ``docs/benchmarks.md``) between
``<!-- train_throughput:start -->`` and ``<!-- train_throughput:end -->``; the rest of the file is kept.
The file is written atomically (temporary file + rename).

    python benchmarks/train_throughput.py [--out docs/benchmarks.md] [--quick] [--variants] [--threads N]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import math
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sections import write_section  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(ROOT))

from normlab.config import TrainConfig  # noqa: E402
from normlab.model import ModelConfig, build_model  # noqa: E402
from normlab.train.optim import build_optimizer, param_groups  # noqa: E402

START, END = "<!-- train_throughput:start -->", "<!-- train_throughput:end -->"
NOISY = 1.35  # a shape's result is flagged when its slowest and fastest windows differ by more than this factor


@dataclass(frozen=True)
class Shape:
    name: str
    depth: int
    width: int
    heads: int
    context: int
    batch: int
    vocab: int
    target: float  # required normlab / x-transformers tokens/s ratio

    def describe(self) -> str:
        return (f"depth {self.depth}, width {self.width}, heads {self.heads} (head dim {self.width // self.heads}), "
                f"MLP ratio 4, context {self.context}, batch {self.batch}, vocab {self.vocab}")


SHAPES = {
    "A": Shape("A", depth=4, width=128, heads=4, context=64, batch=12, vocab=256, target=1.8),
    "B": Shape("B", depth=6, width=384, heads=6, context=256, batch=8, vocab=256, target=1.0),
}


# ----------------------------------------------------------------------------------------------- machine and GEMM


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def blas_name() -> str:
    cfg = torch.__config__.show()
    for key, name in (("BLAS_INFO=mkl", "MKL"), ("BLAS_INFO=open", "OpenBLAS"), ("BLAS_INFO=blis", "BLIS")):
        if key in cfg:
            return name
    return "unknown BLAS"


def _cpu_times() -> tuple[int, int] | None:
    try:
        vals = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0)  # idle + iowait
    return sum(vals[:8]) - idle, sum(vals[:8])


def other_cpu_use(interval: float = 1.0) -> float | None:
    """CPUs' worth of work done by other processes while this one sleeps ``interval`` seconds (0 = idle)."""
    a = _cpu_times()
    time.sleep(interval)
    b = _cpu_times()
    if a is None or b is None or b[1] == a[1]:
        return None
    return (b[0] - a[0]) / (b[1] - a[1]) * (os.cpu_count() or 1)


def wait_idle(max_wait: float, threshold: float = 0.15) -> float | None:
    """Wait (up to ``max_wait`` s) until other processes use under ``threshold`` CPUs; return the last reading."""
    end = time.perf_counter() + max_wait
    busy = other_cpu_use()
    while busy is not None and busy > threshold and time.perf_counter() < end:
        busy = other_cpu_use()
    return busy


def gemm_peak(sizes: list[int], reps: int) -> dict[int, float]:
    """Best-of-``reps`` fp32 ``torch.mm`` throughput (GFLOP/s, 2 n^3 FLOPs) for each square size ``n``."""
    out = {}
    gen = torch.Generator().manual_seed(0)
    for n in sizes:
        a, b = torch.randn(n, n, generator=gen), torch.randn(n, n, generator=gen)
        c = torch.empty(n, n)
        torch.mm(a, b, out=c)  # warm-up (thread pool, packing buffers)
        best = math.inf
        for _ in range(reps):
            t = time.perf_counter()
            torch.mm(a, b, out=c)
            best = min(best, time.perf_counter() - t)
        out[n] = 2 * n**3 / best / 1e9
    return out


# ----------------------------------------------------------------------------------------------------- models


@dataclass
class Runner:
    """One training setup on a fixed batch: ``step()`` = ``loss()`` (forward + cross-entropy), backward,
    optimizer step, ``zero_grad(set_to_none=True)``."""

    label: str
    loss: Callable[[], torch.Tensor]
    opt: torch.optim.Optimizer
    tokens_per_step: int
    flops_per_token: float
    params: int  # parameters counted in the 6N term
    around: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext  # a variant's patch

    def step(self) -> None:
        with self.around():
            self.loss().backward()
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)


def flops_per_token(n_params: int, shape: Shape) -> float:
    return 6 * n_params + 12 * shape.depth * shape.width * shape.context


def matmul_params(model: nn.Module, input_embedding: nn.Embedding, tied: bool) -> int:
    """All (unique) parameters minus the input embedding table, plus the LM head when it shares that table."""
    n = sum(p.numel() for p in model.parameters()) - input_embedding.weight.numel()
    return n + (input_embedding.weight.numel() if tied else 0)


def fixed_batch(shape: Shape) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1234)
    t = torch.randint(0, shape.vocab, (shape.batch, shape.context + 1), generator=gen)
    return t[:, :-1].contiguous(), t[:, 1:].contiguous()


def trainer_adamw(model: nn.Module) -> torch.optim.Optimizer:
    """The AdamW that ``build_optimizer(model, TrainConfig())`` builds (same grouping rules and settings), for a
    model that is not normlab's GPT (``build_optimizer`` also inspects GPT-specific attributes)."""
    tcfg = TrainConfig()
    groups, _ = param_groups(model, tcfg)
    return torch.optim.AdamW(groups, lr=tcfg.lr, betas=(tcfg.beta1, tcfg.beta2), eps=1e-8, foreach=True)


def model_config(shape: Shape) -> ModelConfig:
    """The benchmarked GPT; the choices that matter for the comparison are spelled out, not left to defaults."""
    return ModelConfig(vocab_size=shape.vocab, context=shape.context, width=shape.width, depth=shape.depth,
                       heads=shape.heads, mlp_ratio=4.0, activation="gelu", positions="rope", dropout=0.0,
                       tie_embeddings=True, bias=False, norm="layernorm", placement="pre")


def normlab_runner(shape: Shape, label: str = "normlab", *, optimizer: str = "foreach",
                   wrap: Callable[[nn.Module], nn.Module] | None = None) -> Runner:
    """normlab's GPT (pre-LN LayerNorm, RoPE, GELU MLP, no biases, tied embeddings) + the trainer's AdamW."""
    torch.manual_seed(0)
    mcfg = model_config(shape)
    model = build_model(mcfg)
    tcfg = TrainConfig()
    opt, _ = build_optimizer(model, tcfg)
    if optimizer != "foreach":  # same groups and hyper-parameters, another implementation ("fused")
        groups, _ = param_groups(model, tcfg)
        opt = torch.optim.AdamW(groups, lr=tcfg.lr, betas=(tcfg.beta1, tcfg.beta2), eps=1e-8, **{optimizer: True})
    fwd = wrap(model) if wrap else model
    model.train()
    x, y = fixed_batch(shape)

    def loss() -> torch.Tensor:
        return fwd(x, y)[1]

    n = matmul_params(model, model.tok_emb, mcfg.tie_embeddings)
    return Runner(label, loss, opt, shape.batch * shape.context, flops_per_token(n, shape), n)


XT_SETTINGS = ("TransformerWrapper(num_tokens=V, max_seq_len=T, tie_embedding=True, attn_layers=Decoder(dim=d, "
               "depth=L, heads=H, attn_dim_head=d//H, rotary_pos_emb=True, rotary_emb_dim=d//H, attn_flash=True, "
               "ff_mult=4, ff_no_bias=True))")


def xt_runner(shape: Shape) -> Runner:
    """x-transformers at the same shape, made as close to normlab's GPT as its options allow (see XT_SETTINGS)."""
    from x_transformers import Decoder, TransformerWrapper

    torch.manual_seed(0)
    hd = shape.width // shape.heads
    model = TransformerWrapper(
        num_tokens=shape.vocab, max_seq_len=shape.context, tie_embedding=True,
        attn_layers=Decoder(dim=shape.width, depth=shape.depth, heads=shape.heads, attn_dim_head=hd,
                            rotary_pos_emb=True, rotary_emb_dim=hd, attn_flash=True, ff_mult=4, ff_no_bias=True,
                            verbose=False),
    )
    opt = trainer_adamw(model)
    model.train()
    x, y = fixed_batch(shape)

    def loss() -> torch.Tensor:
        logits = model(x)
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.reshape(-1))

    n = matmul_params(model, model.token_emb.emb, tied=True)
    return Runner("x-transformers", loss, opt, shape.batch * shape.context, flops_per_token(n, shape), n)


def xt_version() -> str | None:
    try:
        from importlib.metadata import version

        import x_transformers  # noqa: F401

        return version("x-transformers")
    except Exception:  # not installed (run `make bench`, which installs the `bench` extra)
        return None


# ---------------------------------------------------------------------------------------------------- timing


@dataclass
class Timing:
    label: str
    windows: list[float]  # tokens/s of each timed window
    step_s: float  # median seconds per step

    @property
    def median(self) -> float:
        return statistics.median(self.windows)


def measure(runners: list[Runner], *, warmup: int, rounds: int, window_s: float,
            budget_s: float | None = None) -> dict[str, Timing]:
    """Warm every runner up, then time ``rounds`` windows of each, alternating runners (order reversed every
    round: A B, B A, ...) so that slow drifts and bursts of machine load hit all of them alike.

    A window is a whole number of steps lasting about ``window_s``. With ``budget_s``, stop early (after at
    least 3 rounds) when the estimated time of the next round would overrun it.
    """
    t0 = time.perf_counter()
    per_step = {}
    for r in runners:
        for _ in range(warmup):
            r.step()
        t = time.perf_counter()
        r.step()
        r.step()
        per_step[r.label] = (time.perf_counter() - t) / 2
    steps = {lbl: max(1, round(window_s / s)) for lbl, s in per_step.items()}
    windows: dict[str, list[float]] = {r.label: [] for r in runners}
    step_times: dict[str, list[float]] = {r.label: [] for r in runners}
    for i in range(rounds):
        t_round = time.perf_counter()
        for r in runners if i % 2 == 0 else runners[::-1]:
            k = steps[r.label]
            t = time.perf_counter()
            for _ in range(k):
                r.step()
            dt = time.perf_counter() - t
            windows[r.label].append(r.tokens_per_step * k / dt)
            step_times[r.label].append(dt / k)
        round_s = time.perf_counter() - t_round
        if budget_s is not None and i + 1 >= 3 and time.perf_counter() - t0 + round_s > budget_s:
            break
    return {r.label: Timing(r.label, windows[r.label], statistics.median(step_times[r.label])) for r in runners}


def spread(timings: dict[str, Timing]) -> float:
    """Largest fastest/slowest window ratio over the runners (1.0 = perfectly steady)."""
    return max(max(t.windows) / min(t.windows) for t in timings.values())


def measure_steady(runners: list[Runner], *, attempts: int, wait_s: float, label: str,
                   **kw) -> tuple[dict[str, Timing], float | None]:
    """``measure`` after waiting for an idle machine; when the windows spread more than ``NOISY`` (other
    processes took the CPUs meanwhile), wait and measure again, up to ``attempts`` times, and keep the steadiest
    attempt. Returns the timings and the other processes' CPU use seen just before that attempt."""
    best: tuple[dict[str, Timing], float | None] | None = None
    for attempt in range(attempts):
        if attempt:
            print(f"{label}: windows spread {spread(best[0]):.2f}x (machine busy); measuring again", file=sys.stderr)
        busy = wait_idle(wait_s)
        timings = measure(runners, **kw)
        if best is None or spread(timings) < spread(best[0]):
            best = (timings, busy)
        if spread(best[0]) <= NOISY:
            break
    return best


GEMM_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_mkl_linear", "mkldnn::_linear_pointwise")
ATTENTION_OPS = ("aten::_scaled_dot_product_flash_attention_for_cpu",
                 "aten::_scaled_dot_product_flash_attention_for_cpu_backward")


def breakdown(r: Runner, steps: int) -> dict[str, float]:
    """Where one step's time goes, in ms per step.

    ``forward`` / ``backward`` / ``optimizer`` (optimizer step + zero_grad): wall time of each phase (median over
    ``steps``). ``gemm`` / ``attention``: self CPU time of the matmul ops (aten::mm & co.) and of the fused SDPA
    kernels under ``torch.profiler`` (which adds a little overhead to every op, so they are slight
    under-estimates of their share); per thread-pool call, not summed over threads.
    """
    from torch.profiler import ProfilerActivity, profile

    fwd, bwd, opt = [], [], []
    for _ in range(steps):
        with r.around():
            t0 = time.perf_counter()
            loss = r.loss()
            t1 = time.perf_counter()
            loss.backward()
            t2 = time.perf_counter()
            r.opt.step()
            r.opt.zero_grad(set_to_none=True)
            t3 = time.perf_counter()
        fwd.append(t1 - t0)
        bwd.append(t2 - t1)
        opt.append(t3 - t2)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t = time.perf_counter()
        for _ in range(steps):
            r.step()
        wall = time.perf_counter() - t
    gemm = attn = 0.0
    for ev in prof.key_averages():
        if ev.key in GEMM_OPS:
            gemm += ev.self_cpu_time_total
        elif ev.key in ATTENTION_OPS:
            attn += ev.self_cpu_time_total
    ms = 1e3 / steps
    return {"forward": statistics.median(fwd) * 1e3, "backward": statistics.median(bwd) * 1e3,
            "optimizer": statistics.median(opt) * 1e3, "gemm": gemm / 1e3 / steps, "attention": attn / 1e3 / steps,
            "profiled_step": wall * ms}


# ------------------------------------------------------------------------------------------ loop overhead


def loop_overhead(shape: Shape, reps: int) -> dict[str, float]:
    """Microseconds per step of what ``normlab.train.loop.train`` does besides forward/backward/AdamW:
    batch sampling (``get_batch`` from a 1M-token array), the lr schedule (+ setting it on the param groups),
    ``loss.item()`` and ``clip_grad_norm_``. Best of ``reps``."""
    from normlab.train.loop import get_batch
    from normlab.train.schedule import lr_at

    torch.manual_seed(0)
    model = build_model(model_config(shape))
    opt, _ = build_optimizer(model, TrainConfig())
    tokens = np.random.default_rng(0).integers(0, shape.vocab, 1_000_000).astype(np.uint16)
    gen = torch.Generator().manual_seed(0)
    x, y = get_batch(tokens, shape.batch, shape.context, gen)
    _, loss = model(x, y)
    loss.backward()
    params = [p for p in model.parameters() if p.requires_grad]

    def best(fn: Callable[[], object]) -> float:
        fn()
        b = math.inf
        for _ in range(reps):
            t = time.perf_counter()
            fn()
            b = min(b, time.perf_counter() - t)
        return b * 1e6

    def set_lr() -> None:
        lr = lr_at(100, lr=3e-3, warmup=20, total=200, min_ratio=0.1)
        for g in opt.param_groups:
            g["lr"] = lr

    return {
        "get_batch": best(lambda: get_batch(tokens, shape.batch, shape.context, gen)),
        "lr schedule": best(set_lr),
        "loss.item()": best(lambda: loss.item()),
        "clip_grad_norm_": best(lambda: torch.nn.utils.clip_grad_norm_(params, 1.0)),
    }


# ------------------------------------------------------------------------------------------------- variants


def _rotate_complex(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Same interleaved-pair rotation as normlab's ``_rotate``, as one complex multiply ``(x0 + i x1)(cos + i sin)``
    (Llama style). float32/float64 stay in their precision; other dtypes go through float32."""
    work = x if x.dtype in (torch.float32, torch.float64) else x.float()
    xc = torch.view_as_complex(work.reshape(*work.shape[:-1], -1, 2).contiguous())
    rot = torch.complex(cos.to(work.dtype), sin.to(work.dtype))
    return torch.view_as_real(xc * rot).flatten(-2).type_as(x)


def _rotate_half_split(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """GPT-NeoX / Llama-HF convention: pairs ``(x[i], x[i + hd/2])``. Another layout (checkpoints differ)."""
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


@contextlib.contextmanager
def patched(obj: object, name: str, value: object) -> Iterator[None]:
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


def _gelu_tanh_forward(self, x: torch.Tensor) -> torch.Tensor:
    return self.drop(self.proj(F.gelu(self.fc(x), approximate="tanh")))


def patched_runner(base: Runner, around: Callable[[], contextlib.AbstractContextManager]) -> Runner:
    base.around = around
    return base


@contextlib.contextmanager
def _threads(n: int) -> Iterator[None]:
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def _sdpa_math() -> contextlib.AbstractContextManager:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel(SDPBackend.MATH)


VARIANTS: dict[str, str] = {  # label -> note (what it is, what it changes besides speed)
    "RoPE as complex multiply": ("same interleaved pairs; bit-identical outputs in fp32/fp64 here; "
                                 "checkpoints unchanged"),
    "RoPE half-split (NeoX)": "other pair layout: equivalent only up to a q/k column permutation",
    "GELU tanh approximation": "different activation numerics (max abs difference 5e-4)",
    "SDPA math backend": "`sdpa_kernel(SDPBackend.MATH)` instead of the CPU flash kernel",
    "AdamW fused=True": "same groups and hyper-parameters",
    "1 thread": "`torch.set_num_threads(1)`",
    "complex RoPE + fused AdamW": "the two changes that keep numerics and checkpoints",
    "torch.compile(model)": "inductor (C++ codegen with the system compiler); compile time with an empty cache",
}


def _rope_method(formula: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]) -> Callable:
    """A replacement for ``RotaryEmbedding.rotate(self, x, offset)`` (what the attention layers call) that applies
    ``formula(x, cos, sin)`` on the ``[T, hd/2]`` tables cast to ``x``'s dtype."""

    def rotate(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        a = self.angles(offset, x.shape[-2])
        return formula(x, a.cos().to(x.dtype), a.sin().to(x.dtype))

    return rotate


def _rope_qkv(self, qkv: torch.Tensor, offset: int = 0) -> torch.Tensor:
    """``RotaryEmbedding.rotate_qkv`` through ``self.rotate`` on q and k (so a patched ``rotate`` acts on both)."""
    q, k, v = qkv.unbind(2)
    return torch.stack((self.rotate(q.transpose(1, 2), offset).transpose(1, 2),
                        self.rotate(k.transpose(1, 2), offset).transpose(1, 2), v), 2)


@contextlib.contextmanager
def _rope_patched(formula: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]) -> Iterator[None]:
    from normlab.attention.positions import RotaryEmbedding

    with patched(RotaryEmbedding, "rotate", _rope_method(formula)), patched(RotaryEmbedding, "rotate_qkv", _rope_qkv):
        yield


def variant_runner(shape: Shape, label: str) -> Runner:
    """normlab's GPT with one candidate change, applied by monkeypatching around each step."""
    import normlab.model.blocks as blocks

    # patch the method the attention layers call (patching the module-level reference formula ``_rotate`` would
    # change nothing: the model does not call it)
    complex_rope = lambda: _rope_patched(_rotate_complex)  # noqa: E731
    if label == "RoPE as complex multiply":
        return patched_runner(normlab_runner(shape, label), complex_rope)
    if label == "RoPE half-split (NeoX)":
        return patched_runner(normlab_runner(shape, label),
                              lambda: _rope_patched(_rotate_half_split))
    if label == "GELU tanh approximation":
        return patched_runner(normlab_runner(shape, label), lambda: patched(blocks.MLP, "forward", _gelu_tanh_forward))
    if label == "SDPA math backend":
        return patched_runner(normlab_runner(shape, label), _sdpa_math)
    if label == "AdamW fused=True":
        return normlab_runner(shape, label, optimizer="fused")
    if label == "1 thread":
        return patched_runner(normlab_runner(shape, label), lambda: _threads(1))
    if label == "complex RoPE + fused AdamW":
        return patched_runner(normlab_runner(shape, label, optimizer="fused"), complex_rope)
    if label == "torch.compile(model)":
        return normlab_runner(shape, label, wrap=torch.compile)
    raise KeyError(label)


def paired_ratio(a: Timing, b: Timing) -> float:
    """Median over rounds of ``a``'s window / ``b``'s window of the same round (robust to load drifts)."""
    return statistics.median([x / y for x, y in zip(a.windows, b.windows, strict=True)])


def compile_works() -> tuple[bool, str]:
    """Does inductor compile (needs a C++ compiler) on this machine? Checked on a tiny function."""
    try:
        fn = torch.compile(lambda a: (a * 2).sin().sum())
        fn(torch.randn(8))
        return True, ""
    except Exception as e:  # no compiler, unsupported platform, ...
        return False, f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"


# ------------------------------------------------------------------------------------------------- report


def fmt_int(v: float) -> str:
    return f"{v:,.0f}"


def render(info: dict, peak: dict[int, float], results: dict, overhead: dict | None, variants: dict | None) -> str:
    peak_max = max(peak.values())
    lines = [START, "## Training throughput", "",
             f"Written by `{info['command']}` on {info['date']} (`make bench` runs it without options); the"
             " script rewrites this section, do not edit it by hand.",
             "",
             f"- **Machine**: {info['cpu']} ({info['cpus']} logical CPUs), torch {info['torch']} "
             f"({info['blas']}, CPU capability {info['capability']}), {info['threads']} intra-op threads, "
             f"Python {info['python']}, x-transformers {info['xt'] or 'not installed'}.",
             f"- **Load average** (1 min) before / after: {info['load_before']:.2f} / {info['load_after']:.2f}"
             " (the latter includes this benchmark's own threads; the other processes' CPU use is given per shape).",
             f"- **fp32 GEMM peak** (square `torch.mm`, best of {info['gemm_runs']} x {info['gemm_reps']} calls spread"
             " over the run): "
             + ", ".join(f"n={n}: {g:.1f}" for n, g in peak.items())
             + f" GFLOP/s → **{peak_max:.1f} GFLOP/s**, the MFU denominator.",
             "- **Throughput**: tokens/s of one training step (forward, cross-entropy, backward, AdamW step, "
             "`zero_grad(set_to_none=True)`) on a fixed random batch (no data loading, no grad clipping), after "
             f"{info['warmup']} warm-up steps; median over up to {info['rounds']} windows of"
             f" ≈{info['window_s']:g} s (at least one step), the models alternating window by window (order"
             " flipped every round). Range = slowest–fastest window. Ratio vs x-transformers = median over rounds"
             " of the two windows' ratio.",
             "- **MFU** = tokens/s × FLOPs/token ÷ GEMM peak, FLOPs/token = 6·N + 12·L·d·T"
             " (nanoGPT `estimate_mfu`; N = parameters minus the input embedding table, the tied LM head counted;"
             " L depth, d width, T context).",
             "- **normlab**: `build_model(ModelConfig(...))` (pre-LN LayerNorm with gain and bias, RoPE on the full"
             " head dim, GELU MLP, no linear biases, tied embeddings, SDPA causal attention) and"
             " `build_optimizer(model, TrainConfig())` (AdamW lr 3e-3, betas 0.9/0.95, eps 1e-8, weight decay 0.1 on"
             " matrices only, `foreach=True`).",
             f"- **x-transformers**: `{XT_SETTINGS}` — pre-LN LayerNorm (its bias-free variant), loss"
             " `F.cross_entropy(logits, y)`, and the same AdamW (normlab's `param_groups` and"
             " `build_optimizer`'s settings)."
             " Remaining differences: separate q/k/v projections (normlab fuses them) and a `dim**-0.5` logit scale"
             " on the tied head.",
             ""]
    for name, res in results.items():
        shape: Shape = res["shape"]
        lines += [f"### Shape {name}: {shape.describe()}", ""]
        if res["busy"] is not None:
            lines += [f"Other processes used {res['busy']:.2f} CPUs just before this measurement"
                      + (f"; the windows varied by more than {NOISY - 1:.0%}, so the machine was busy during it."
                         if res["noisy"] else "."), ""]
        t = res["timings"]
        xt = t.get("x-transformers")
        lines += ["| model | N (6N term) | FLOPs/token | tokens/s (median) | range | ms/step | MFU | vs x-transformers "
                  "| target | result |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        for r in res["runners"]:
            tm = t[r.label]
            mfu = tm.median * r.flops_per_token / (peak_max * 1e9)
            if r.label == "normlab":
                ratio = f"**{res['ratio']:.2f}x**" if xt else "n/a"
                target = f"≥ {shape.target:.1f}x"
                result = ("**pass**" if res["ratio"] >= shape.target else "**FAIL**") if xt else "n/a"
                if res["noisy"]:
                    result += " (noisy run: not trustworthy)"
            else:
                ratio, target, result = "1.00x", "", ""
            lines.append(f"| {r.label} | {r.params / 1e6:.3f}M | {r.flops_per_token / 1e6:.2f}M | "
                         f"{fmt_int(tm.median)} | {fmt_int(min(tm.windows))}–{fmt_int(max(tm.windows))} | "
                         f"{tm.step_s * 1e3:.1f} | {mfu:.1%} | {ratio} | {target} | {result} |")
        lines += ["", "Where the time goes (ms per step; phases by wall clock, GEMM = self time of `aten::mm`/`addmm`/"
                  "`bmm` and SDPA = the fused attention kernels, forward + backward, under `torch.profiler`):", "",
                  "| model | forward | backward | AdamW + zero_grad | GEMM | SDPA | GEMM share | GEMM-only bound |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|"]
        for r in res["runners"]:
            b = res["breakdown"][r.label]
            total = b["forward"] + b["backward"] + b["optimizer"]
            bound = r.tokens_per_step / (b["gemm"] / 1e3) if b["gemm"] else float("nan")
            lines.append(f"| {r.label} | {b['forward']:.1f} | {b['backward']:.1f} | {b['optimizer']:.1f} | "
                         f"{b['gemm']:.1f} | {b['attention']:.1f} | {b['gemm'] / b['profiled_step']:.0%} | "
                         f"{fmt_int(bound)} tokens/s |")
        if xt:
            b = res["breakdown"]["normlab"]
            bound = shape.batch * shape.context / (b["gemm"] / 1e3) / t["x-transformers"].median
            lines += ["", f"Even with every non-GEMM op free, normlab would reach about {bound:.2f}x x-transformers "
                      "here (its GEMM-only bound ÷ x-transformers' median tokens/s)"
                      + (" — from a noisy run, not trustworthy." if res["noisy"] else ".")]
        lines.append("")
    if overhead:
        lines += ["### normlab training-loop overhead per step", "",
                  f"Shape {overhead['shape']}: what `normlab.train.loop.train` adds to each step besides forward/"
                  "backward/AdamW (best of repeated calls), against the step time of the fastest window above"
                  f" ({overhead['step_s'] * 1e3:.1f} ms).", "",
                  "| part | µs/step | % of step |", "|---|---:|---:|"]
        step_us = overhead["step_s"] * 1e6
        for k, v in overhead["parts"].items():
            lines.append(f"| {k} | {v:.0f} | {v / step_us:.1%} |")
        total = sum(overhead["parts"].values())
        lines += [f"| total | {total:.0f} | {total / step_us:.1%} |", ""]
    if variants:
        lines += ["### Candidate speed-ups of normlab's GPT (`--variants`)", "",
                  "Each variant is a monkeypatch applied inside the benchmark (the model files are unchanged), timed"
                  " alternately with a fresh unmodified model, window by window; speed-up = median over rounds of"
                  " variant tokens/s ÷ unmodified tokens/s in the same round.", ""]
        if variants.get("compile_error"):
            lines += [f"`torch.compile` not timed: {variants['compile_error']}", ""]
        names = list(variants["shapes"])
        lines += ["| variant | " + " | ".join(f"shape {n} speed-up (tokens/s)" for n in names) + " | note |",
                  "|---|" + "---:|" * len(names) + "---|"]
        for label in next(iter(variants["shapes"].values())):
            cells = []
            for n in names:
                row = variants["shapes"][n][label]
                extra = f", compile {row['setup_s']:.0f} s" if label == "torch.compile(model)" else ""
                noisy = " — noisy" if row["noisy"] else ""
                cells.append(f"{row['ratio']:.2f}x ({fmt_int(row['tokens_s'])} vs {fmt_int(row['base_tokens_s'])}"
                             f"{extra}{noisy})")
            lines.append(f"| {label} | " + " | ".join(cells) + f" | {VARIANTS[label]} |")
        lines.append("")
    lines.append(END)
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks.md", help="markdown file to update")
    ap.add_argument("--quick", action="store_true", help="fewer/shorter windows, smaller GEMMs (a smoke run)")
    ap.add_argument("--shapes", default="A,B", help="comma-separated shape names (A, B)")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's default)")
    ap.add_argument("--variants", action="store_true", help="also time candidate normlab speed-ups (slower)")
    ap.add_argument("--no-compile", action="store_true", help="with --variants: skip the torch.compile variant")
    ap.add_argument("--wait-idle", type=float, default=60.0, metavar="S",
                    help="before each measurement, wait up to S seconds for other processes to go idle (default 60)")
    ap.add_argument("--attempts", type=int, default=None,
                    help="measure a noisy comparison again up to this many times (default 3, 1 with --quick)")
    args = ap.parse_args(argv)

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.attempts is None:
        args.attempts = 1 if args.quick else 3
    shapes = [SHAPES[s.strip().upper()] for s in args.shapes.split(",") if s.strip()]
    quick = args.quick
    gemm_sizes, gemm_reps = ([1024], 3) if quick else ([1024, 1536, 2048], 5)
    warmup, rounds, window_s, budget_s = (2, 3, 0.3, 20.0) if quick else (5, 7, 1.5, 75.0)
    t_all = time.perf_counter()
    load_before = os.getloadavg()[0]
    xt = xt_version()
    info = {
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "quick": quick,
        "cpu": cpu_model(), "cpus": os.cpu_count(), "torch": torch.__version__, "blas": blas_name(),
        "capability": torch.backends.cpu.get_cpu_capability(), "threads": torch.get_num_threads(),
        "python": platform.python_version(), "xt": xt, "load_before": load_before, "gemm_reps": gemm_reps,
        "warmup": warmup, "rounds": rounds, "window_s": window_s,
        "command": " ".join(["python benchmarks/train_throughput.py"]
                            + (["--quick"] if quick else []) + (["--variants"] if args.variants else [])
                            + (["--no-compile"] if args.variants and args.no_compile else [])
                            + ([f"--shapes {args.shapes}"] if args.shapes != "A,B" else [])
                            + ([f"--threads {args.threads}"] if args.threads else [])),
    }
    print(f"{info['cpu']} | torch {info['torch']} | {info['threads']} threads | x-transformers {xt or 'MISSING'} "
          f"| load {load_before:.2f}", flush=True)
    if xt is None:
        print("x-transformers is not installed: run `make bench` (installs the `bench` extra); "
              "timing normlab alone", file=sys.stderr)

    peak: dict[int, float] = {}

    def update_peak() -> None:  # GEMM peak = best over several measurements: load bursts only lower a rate
        for n, g in gemm_peak(gemm_sizes, gemm_reps).items():
            peak[n] = max(peak.get(n, 0.0), g)

    update_peak()
    print("GEMM fp32: " + ", ".join(f"n={n} {g:.1f} GFLOP/s" for n, g in peak.items()), flush=True)

    results = {}
    for shape in shapes:
        update_peak()
        runners = [normlab_runner(shape)] + ([xt_runner(shape)] if xt else [])
        timings, busy = measure_steady(runners, attempts=args.attempts, wait_s=args.wait_idle,
                                       label=f"shape {shape.name}", warmup=warmup, rounds=rounds,
                                       window_s=window_s, budget_s=budget_s)
        bsteps = max(2, min(8, round(4 * window_s / timings["normlab"].step_s)))
        results[shape.name] = {"shape": shape, "runners": runners, "timings": timings,
                               "ratio": paired_ratio(timings["normlab"], timings["x-transformers"]) if xt else None,
                               "breakdown": {r.label: breakdown(r, bsteps) for r in runners}, "busy": busy,
                               "noisy": spread(timings) > NOISY}
        if results[shape.name]["noisy"]:
            print(f"shape {shape.name}: windows differ by more than {NOISY - 1:.0%}: the machine was busy, "
                  "rerun on an idle machine for trustworthy numbers", file=sys.stderr)
        for r in runners:
            tm = timings[r.label]
            print(f"shape {shape.name} {r.label:15s} {tm.median:10,.0f} tokens/s  "
                  f"(windows {', '.join(fmt_int(w) for w in tm.windows)})", flush=True)
        if xt:
            ratio = results[shape.name]["ratio"]
            print(f"shape {shape.name} normlab / x-transformers = {ratio:.2f}x (target {shape.target:.1f}x: "
                  f"{'pass' if ratio >= shape.target else 'FAIL'})", flush=True)

    overhead = None
    small = shapes[0]
    try:
        parts = loop_overhead(small, reps=20 if quick else 100)
    except Exception as e:  # the loop's module is edited by others; never lose the main results over this part
        print(f"loop overhead not measured: {type(e).__name__}: {e}", file=sys.stderr)
    else:
        nl = results[small.name]["timings"]["normlab"]
        overhead = {"shape": small.name, "parts": parts, "step_s": small.batch * small.context / max(nl.windows)}
        print("loop overhead (µs/step): " + ", ".join(f"{k} {v:.0f}" for k, v in parts.items()), flush=True)

    variants = None
    if args.variants:
        labels = list(VARIANTS)
        # a fresh inductor cache, so the compile time shown is a first run's (a warm cache makes it ~1 s)
        cache = tempfile.mkdtemp(prefix="train_throughput_inductor_")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
        ok, err = (False, "skipped (--no-compile)") if args.no_compile else compile_works()
        if not ok:
            labels.remove("torch.compile(model)")
        variants = {"compile_error": None if ok else err, "shapes": {}}
        try:
            for shape in shapes:
                rows = {}
                for label in labels:
                    base = normlab_runner(shape, "normlab (as is)")
                    t = time.perf_counter()
                    var = variant_runner(shape, label)
                    if label == "torch.compile(model)":
                        var.step()  # the first call compiles forward and backward
                    setup_s = time.perf_counter() - t
                    tm, _ = measure_steady([base, var], attempts=args.attempts, wait_s=args.wait_idle,
                                           label=f"variant {label}, shape {shape.name}", warmup=min(warmup, 3),
                                           rounds=max(3, rounds - 2), window_s=window_s, budget_s=budget_s / 2)
                    rows[label] = {"ratio": paired_ratio(tm[label], tm[base.label]), "tokens_s": tm[label].median,
                                   "base_tokens_s": tm[base.label].median, "setup_s": setup_s,
                                   "noisy": spread(tm) > NOISY}
                    print(f"variant shape {shape.name} {label:28s} {tm[label].median:10,.0f} tokens/s vs "
                          f"{tm[base.label].median:10,.0f} as is: {rows[label]['ratio']:.2f}x"
                          + (f" (compile {setup_s:.0f} s)" if label == "torch.compile(model)" else ""), flush=True)
                variants["shapes"][shape.name] = rows
        finally:
            shutil.rmtree(cache, ignore_errors=True)

    update_peak()
    peak_max = max(peak.values())
    print("GEMM fp32 peak (best of all measurements): "
          + ", ".join(f"n={n} {g:.1f}" for n, g in peak.items()) + " GFLOP/s")
    for res in results.values():
        for r in res["runners"]:
            print(f"shape {res['shape'].name} {r.label:15s} MFU "
                  f"{res['timings'][r.label].median * r.flops_per_token / (peak_max * 1e9):.1%}")
    info["load_after"] = os.getloadavg()[0]
    info["gemm_runs"] = len(shapes) + 2
    write_section(args.out, "train_throughput", render(info, peak, results, overhead, variants))
    print(f"wrote {args.out} ({time.perf_counter() - t_all:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
