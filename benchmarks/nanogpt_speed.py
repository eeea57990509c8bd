#!/usr/bin/env python
"""Training speed of normlab against karpathy/nanoGPT (and x-transformers), side by side on this machine's CPU.

Every row is the full training step -- forward, backward, AdamW step -- at vocab 256 on a fixed batch, except
``normlab train (whole loop)``, which times ``normlab.train.loop.train`` itself (batch sampling, lr schedule,
loss-spike check, clipping, logging; its own ``tokens_per_s``, which leaves evaluation out).

- nanoGPT: ``model.py`` imported from a checkout given by ``--nanogpt DIR`` (``git clone
  https://github.com/karpathy/nanoGPT``; nothing of it is vendored here) with its own CPU defaults: fp32, no
  compile, ``bias=False``, ``dropout=0``, its ``configure_optimizers(0.1, 6e-4, (0.9, 0.95), 'cpu')`` AdamW.
  Without ``--nanogpt`` (or when DIR has no ``model.py``) its rows are skipped and the ratios are left out.
- x-transformers at the same shape (benchmarks/train_throughput.py's settings), when installed.
- normlab's GPT (Pre-LN LayerNorm, RoPE, GELU, tied embeddings) at its defaults (``auto``: what
  ``normlab.train.precision`` resolves on this machine), and fp32 / bf16 / compiled separately.

- ``normlab train`` as a command (``--policy-shapes``, default S; ``--policy-only`` measures just these, into their
  own section of ``--out``): a fresh process per window, so the wait policy and ``auto``'s thread count are the
  command's own decision at start (normlab.train.threads); idle against nanoGPT's ``train.py`` at 1 thread and at
  every usable core (the ratio to the better of them), then with a spinner per usable core against the command at
  ``train.threads=1``. Each row says which threads and policy its runs recorded (``command_loop.py``). The in-process
  rows all run under the policy this process decided at its start (the section's first line).

Runners alternate window by window (order reversed every round), several rounds; a ratio is the median over
rounds of the per-round ratio, so load on a shared machine hits both sides alike. MFU = tokens/s x FLOPs/token
(nanoGPT's ``6 N + 12 L d T``) / this machine's measured GEMM peak of the row's precision (square ``torch.mm``,
best of several sizes, fp32 and bf16).

    python benchmarks/nanogpt_speed.py --nanogpt DIR [--out docs/benchmarks.md] [--quick] [--shapes S,M,L]
                                       [--threads 2] [--no-compile] [--policy-shapes S] [--policy-only]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import importlib.util
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from normlab.train.heap import set_heap_policy
from normlab.train.threads import set_wait_policy

USER_ENV = dict(os.environ)  # nanoGPT's train.py runs with the environment as the user gave it
WAIT_POLICY = set_wait_policy()  # as the normlab entry point does, before torch is imported
HEAP_POLICY = set_heap_policy()  # likewise (normlab.train.heap): the in-process rows, nanoGPT's included, share it

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from command_loop import LOOP_LOG, LOOP_LR, command_loop, loop_config, ran_under, render_policy
from sections import write_section
from train_throughput import (
    Shape,
    cpu_model,
    fixed_batch,
    flops_per_token,
    matmul_params,
    model_config,
    xt_runner,
    xt_version,
)

from normlab.config import RunConfig, TrainConfig
from normlab.model import build_model
from normlab.train import precision as P
from normlab.train.optim import build_optimizer
from normlab.train.threads import decide_threads, read_budget, step_flops

# target = the required normlab-defaults / nanoGPT ratio
SHAPES = {
    "S": (Shape("S", depth=4, width=128, heads=4, context=64, batch=12, vocab=256, target=0.0), 1.0),
    "M": (Shape("M", depth=6, width=384, heads=6, context=256, batch=8, vocab=256, target=0.0), 1.0),
    "L": (Shape("L", depth=12, width=768, heads=12, context=256, batch=4, vocab=256, target=0.0), 1.0),
    "DEMO": (Shape("demo", depth=6, width=64, heads=4, context=64, batch=16, vocab=256, target=0.0), 1.0),
}
SLOW_STEP_S = 60.0  # a row whose single step takes longer is reported as such, not timed in windows


def gemm_peak(dtype: torch.dtype, sizes: list[int], reps: int) -> float:
    """Best ``torch.mm`` GFLOP/s over square sizes (2 n^3 FLOPs), ``reps`` tries each."""
    best = 0.0
    for n in sizes:
        a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
        torch.mm(a, b)
        for _ in range(reps):
            t = time.perf_counter()
            torch.mm(a, b)
            best = max(best, 2 * n**3 / (time.perf_counter() - t) / 1e9)
    return best


# ------------------------------------------------------------------------------------------------------ runners
@dataclass
class Row:
    """One benchmarked setup. ``window(seconds)`` runs about that long and returns tokens/s."""

    label: str
    precision: str  # fp32 | bf16: which GEMM peak its MFU uses
    flops_per_token: float
    step: Callable[[], None] | None = None
    tokens_per_step: int = 0
    loop: Callable[[int], float] | None = None  # whole loop: steps -> tokens/s
    setup_s: float = 0.0
    step_s: float = math.nan
    windows: list[float] = field(default_factory=list)
    note: str = ""
    threads: int = 0  # torch threads while this row runs (0: the benchmark's --threads)

    def _threads(self) -> None:
        if self.threads:
            torch.set_num_threads(self.threads)

    def warm(self, n: int) -> None:
        self._threads()
        t = time.perf_counter()
        if self.loop is not None:
            self.loop(max(n, 4))
        else:
            for _ in range(n):
                self.step()
        self.step_s = (time.perf_counter() - t) / max(n, 4 if self.loop else 1)

    def window(self, seconds: float) -> float:
        k = max(1, round(seconds / self.step_s))
        self._threads()
        if self.loop is not None:
            return self.loop(max(k, 8))
        t = time.perf_counter()
        for _ in range(k):
            self.step()
        dt = time.perf_counter() - t
        self.step_s = dt / k
        return self.tokens_per_step * k / dt


def _step_fn(loss: Callable[[], torch.Tensor], opt: torch.optim.Optimizer) -> Callable[[], None]:
    def step() -> None:
        loss().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def nanogpt_row(shape: Shape, directory: Path) -> Row:
    spec = importlib.util.spec_from_file_location("nanogpt_model", directory / "model.py")
    mod = importlib.util.module_from_spec(spec)
    with contextlib.redirect_stdout(open(os.devnull, "w")):
        spec.loader.exec_module(mod)
        torch.manual_seed(0)
        model = mod.GPT(mod.GPTConfig(block_size=shape.context, vocab_size=shape.vocab, n_layer=shape.depth,
                                      n_head=shape.heads, n_embd=shape.width, dropout=0.0, bias=False))
        opt = model.configure_optimizers(0.1, 6e-4, (0.9, 0.95), "cpu")
    model.train()
    x, y = fixed_batch(shape)
    n = sum(p.numel() for p in model.parameters()) - model.transformer.wpe.weight.numel()  # LM head tied to wte
    return Row("nanoGPT (fp32, no compile)", "fp32", flops_per_token(n, shape),
               _step_fn(lambda: model(x, y)[1], opt), shape.batch * shape.context)


def normlab_row(shape: Shape, precision: str, compile_: bool, label: str, positions: str = "rope") -> Row:
    torch.manual_seed(0)
    mc = model_config(shape)
    mc.positions = positions
    model = P.prepare_model(build_model(mc), precision)
    opt, _ = build_optimizer(model, TrainConfig())
    fwd = torch.compile(model) if compile_ else model
    x, y = fixed_batch(shape)
    model.train()

    def loss() -> torch.Tensor:
        with P.autocast("cpu", precision):
            logits = fwd(x)
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), y.reshape(-1))

    n = matmul_params(model, model.tok_emb, True)
    row = Row(label, precision, flops_per_token(n, shape), _step_fn(loss, opt), shape.batch * shape.context)
    if compile_:
        t = time.perf_counter()
        row.step()
        row.setup_s = time.perf_counter() - t
    return row




def loop_row(shape: Shape, cache: Path, workdir: Path) -> Row:
    """``normlab.train.loop.train`` at normlab's default config except the learning rate (``LOOP_LR``, nanoGPT's),
    this shape, bytes of the tiny preset's synthetic corpus (vocab 256), evaluation and checkpoints only at the end.
    A window is one run of the loop; its rate is the median of the loop's own ``tokens_per_s`` records (one per
    ``LOOP_LOG`` steps: batch sampling, lr schedule, clipping, loss checks and logging included), the first dropped
    (start-up and first-step allocation), the way nanoGPT's per-iteration ``time`` is read below."""
    from normlab.config import config_from_dict
    from normlab.train.loop import train

    counter = [0]
    threads = torch.get_num_threads()

    def run(steps: int) -> float:
        counter[0] += 1
        steps = max(steps, 3 * LOOP_LOG)
        spec = loop_config(shape, cache)
        spec["train"].update(steps=steps, threads=threads)
        cfg = config_from_dict(spec)
        out = workdir / f"loop{counter[0]}"
        train(cfg, out, quiet=True)
        recs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        rates = [float(r["tokens_per_s"]) for r in recs if "tokens_per_s" in r and r.get("step", 0) % LOOP_LOG == 0]
        summary = json.loads((out / "summary.json").read_text())
        if summary.get("status") != "completed":
            raise RuntimeError(f"the whole-loop row's run ended {summary.get('status')}: its rate is not a loop's")
        return statistics.median(rates[1:] or rates)

    model = build_model(model_config(shape))
    n = matmul_params(model, model.tok_emb, True)
    prec = P.resolve_precision(_as_run(shape), "cpu")[0]
    return Row("normlab train (whole loop, defaults)", prec, flops_per_token(n, shape), loop=run,
               tokens_per_step=shape.batch * shape.context, threads=threads,
               note=f"lr {LOOP_LR:g}; median tokens/s per {LOOP_LOG} steps")


def nanogpt_loop_row(shape: Shape, directory: Path, workdir: Path, threads: int | None = None,
                     label: str = "nanoGPT train.py (whole loop)") -> Row:
    """karpathy/nanoGPT's own ``train.py``, run as a subprocess in a scratch directory laid out the way it expects
    (``data/<dataset>/train.bin``, ``val.bin``, ``meta.pkl`` with the vocabulary size, which the script reads, and
    its ``configurator.py`` copied from the checkout), at this shape: ``--device=cpu --compile=False
    --dtype=float32``, no gradient accumulation, warm-up 20 iterations and cosine decay over the run to a tenth
    (normlab's schedule), grad clip 1.0 (both), evaluation only at iteration 0 with one batch. A window is one run;
    its rate is the median of the script's per-iteration ``time`` after its first 5 iterations."""
    import pickle
    import re
    import shutil

    import numpy as np

    root = workdir / f"nanogpt_loop{threads or ''}"
    data = root / "data" / "normlab_bench"
    data.mkdir(parents=True, exist_ok=True)
    tokens = np.random.default_rng(0).integers(0, shape.vocab, 300_000, dtype=np.uint16)
    tokens.tofile(data / "train.bin")
    tokens[:30_000].tofile(data / "val.bin")
    with open(data / "meta.pkl", "wb") as f:  # written here, read by nanoGPT's script (its vocabulary size)
        pickle.dump({"vocab_size": shape.vocab}, f)
    shutil.copy(directory / "configurator.py", root / "configurator.py")
    threads = threads or torch.get_num_threads()

    def run(steps: int) -> float:
        steps = max(steps, 3 * LOOP_LOG)
        argv = [sys.executable, str(directory / "train.py"), "--dataset=normlab_bench", f"--out_dir={root / 'out'}",
                "--device=cpu", "--compile=False", "--dtype=float32", f"--batch_size={shape.batch}",
                f"--block_size={shape.context}", f"--n_layer={shape.depth}", f"--n_head={shape.heads}",
                f"--n_embd={shape.width}", "--bias=False", "--dropout=0.0", "--gradient_accumulation_steps=1",
                f"--max_iters={steps}", "--eval_interval=1000000", "--eval_iters=1", "--log_interval=1",
                "--always_save_checkpoint=False", f"--learning_rate={LOOP_LR}", "--warmup_iters=20",
                f"--lr_decay_iters={steps}", f"--min_lr={LOOP_LR / 10}"]
        env = dict(USER_ENV, OMP_NUM_THREADS=str(threads))  # nanoGPT as its users run it: no normlab settings
        res = subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True, timeout=1800)
        if res.returncode != 0:
            raise RuntimeError(f"nanoGPT train.py failed: {res.stderr.strip().splitlines()[-1:]}")
        dts = [float(m) for m in re.findall(r"time ([0-9.]+)ms", res.stdout)]
        return shape.batch * shape.context / (statistics.median(dts[5:] or dts) / 1e3)

    return Row(label, "fp32", nanogpt_row(shape, directory).flops_per_token, loop=run,
               tokens_per_step=shape.batch * shape.context, threads=threads,
               note=f"lr {LOOP_LR:g}; median per-iteration time")


def _as_run(shape: Shape) -> RunConfig:
    cfg = RunConfig()
    m = cfg.model
    m.depth, m.width, m.heads = shape.depth, shape.width, shape.heads
    m.context, m.vocab_size = shape.context, shape.vocab
    cfg.train.batch_size = shape.batch
    return cfg


# ------------------------------------------------------------------------------------------------- measuring
def measure(rows: list[Row], rounds: int, window_s: float, warmup: int, budget_s: float) -> None:
    """Warm every row, then windows in alternating order. A whole-loop row whose run fails (a diverged run, nanoGPT's
    script exiting non-zero) drops out with the reason as its note, in one line on stderr; the others go on."""
    live = list(rows)

    def attempt(r: Row, fn: Callable[[], object]) -> None:
        try:
            fn()
        except RuntimeError as e:
            if r.loop is None:  # an in-process step failing is a bug to see, not a row to drop
                raise
            live.remove(r)
            r.windows.clear()
            r.note = f"not measured: {e}"
            print(f"{r.label}: {r.note}", file=sys.stderr, flush=True)

    for r in list(live):
        attempt(r, lambda r=r: r.warm(warmup))
    t0 = time.perf_counter()
    for i in range(rounds):
        for r in list(live) if i % 2 == 0 else list(live)[::-1]:
            attempt(r, lambda r=r: r.windows.append(r.window(window_s)))
        if i >= 2 and time.perf_counter() - t0 > budget_s:
            break


def paired(a: Row, b: Row) -> float:
    return statistics.median(x / y for x, y in zip(a.windows, b.windows))


def _busy(n: int) -> list[subprocess.Popen]:
    """``n`` competing processes, each spinning one core (pure Python, no threads)."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def thread_rows(shape: Shape, precision: str, competitors: int, rounds: int, window_s: float) -> dict:
    """normlab's default step at 1 thread and at every usable core, and what ``train.threads: auto`` decides for
    it, with ``competitors`` busy processes running (started 2 s before the decision and the windows)."""
    procs = _busy(competitors)
    try:
        if procs:
            time.sleep(2.0)
        else:  # the 1-minute load average still holds this benchmark's own last minute of work: let it decay, as
            # it has for a `normlab train` started from a shell on an idle machine (at most 90 s)
            t_end = time.time() + 90
            while os.getloadavg()[0] > 0.5 and time.time() < t_end:
                time.sleep(2.0)
        budget = read_budget()
        auto, why = decide_threads(step_flops(_as_run(shape)), budget)
        counts = sorted({1, budget.usable})
        rows = []
        for n in counts:
            r = normlab_row(shape, precision, False, f"{n} thread(s)")
            r.threads = n
            rows.append(r)
        measure(rows, rounds, window_s, 1, 60.0)
    finally:
        for p in procs:
            p.kill()
            p.wait()
    rate = {n: statistics.median(r.windows) for n, r in zip(counts, rows)}
    one = rows[0]
    rel = {n: (paired(r, one) if r is not one else 1.0) for n, r in zip(counts, rows)}
    return {"competitors": competitors, "auto": auto, "why": why, "rate": rate, "rel_to_1": rel,
            "auto_vs_1": rel[auto] if auto in rel else float("nan"),
            "auto_vs_best": rel[auto] / max(rel.values()) if auto in rel else float("nan"),
            "load": budget.load}


def policy_rows(shape: Shape, nano: Path | None, cache: Path, rounds: int, steps: int) -> dict:
    """``normlab train`` as a command (train.threads: auto; a fresh process per window: its own wait policy and
    thread count, command_loop.py). Idle: against nanoGPT's train.py at each thread count (1 and every usable core),
    the ratio to the best of them. With a spinner per usable core: against the command at ``train.threads=1``."""
    usable = read_budget().usable
    spec = loop_config(shape, cache / "data")

    def cmd_row(label: str, threads: str, tag: str) -> tuple[Row, list]:
        run, recs = command_loop(spec, cache / "cmd", USER_ENV, threads, LOOP_LOG, f"{shape.name}-{tag}")
        return Row(label, "fp32", 0.0, loop=run, tokens_per_step=shape.batch * shape.context), recs

    res: dict = {"usable": usable, "load_idle": os.getloadavg()[0], "pressure_idle": read_budget().pressure}
    auto, auto_recs = cmd_row("normlab train (auto)", "auto", "idle")
    nanos = [nanogpt_loop_row(shape, nano, cache, threads=n, label=f"nanoGPT train.py, {n} thread(s)")
             for n in sorted({1, usable})] if nano else []
    for r in (auto, *nanos):  # every window (and the warm-up) is one run of `steps` steps
        r.loop = (lambda _n, f=r.loop: f(steps))
    measure([auto, *nanos], rounds, 1.0, 1, 900.0)
    res["idle"] = {"rate": statistics.median(auto.windows) if auto.windows else None, "ran": ran_under(auto_recs)}
    if nanos and auto.windows and all(r.windows for r in nanos):
        best = max(nanos, key=lambda r: statistics.median(r.windows))
        res["idle"].update(nano={r.threads: statistics.median(r.windows) for r in nanos}, best=best.threads,
                           vs_best=paired(auto, best))
    procs = _busy(usable)
    try:
        time.sleep(2.0)
        res["load_busy"], res["pressure_busy"] = os.getloadavg()[0], read_budget().pressure
        busy, busy_recs = cmd_row("normlab train (auto), busy", "auto", "busy")
        one, one_recs = cmd_row("normlab train (1 thread), busy", "1", "busy1")
        for r in (busy, one):
            r.loop = (lambda _n, f=r.loop: f(steps))
        measure([busy, one], rounds, 1.0, 1, 900.0)
    finally:
        for p in procs:
            p.kill()
            p.wait()
    res["busy"] = {"rate": statistics.median(busy.windows) if busy.windows else None, "ran": ran_under(busy_recs),
                   "one": statistics.median(one.windows) if one.windows else None, "ran_one": ran_under(one_recs),
                   "vs_one": paired(busy, one) if busy.windows and one.windows else None}
    return res


def payback(eager: Row, compiled: Row) -> dict:
    """Compile time and the steps after which it pays back: ``compile_s / (eager step - compiled step)``."""
    ratio = paired(compiled, eager)  # compiled tokens/s over eager tokens/s, per round
    eager_s = eager.tokens_per_step / statistics.median(eager.windows)
    saved = eager_s * (1.0 - 1.0 / ratio)
    return {"compile_s": compiled.setup_s, "speedup": ratio, "eager_step_s": eager_s,
            "payback_steps": compiled.setup_s / saved if saved > 0 else math.inf}


def render(info: dict, shapes: list[tuple[Shape, float, list[Row], dict]]) -> str:
    L = ["<!-- nanogpt_speed:start -->", "## Training speed against karpathy/nanoGPT", "",
         f"`{info['command']}` -- {info['date']}, {info['cpu']}, {info['threads']} thread(s), torch {info['torch']} "
         f"(CPU capability {info['capability']}; bf16 units: {info['bf16']}; CPU flags: {info['flags']}). "
         f"Load average {info['load_before']:.1f} before, {info['load_after']:.1f} after"
         + (" -- **the machine was shared with other jobs: absolute tokens/s are low and noisy; the ratios are paired"
            " per round, so load hits both sides alike**" if info["load_before"] > 1.5 else "") + f". {info['wait']}; "
         f"{info['heap']} (normlab.train.heap; this process's rows share it, nanoGPT's train.py runs without it).",
         "", f"Measured GEMM peaks (square `torch.mm`, best of sizes {info['gemm_sizes']}, {info['threads']} "
         f"thread(s)): fp32 {info['peak_fp32']:.0f} GFLOP/s ({info['peak_fp32'] / info['threads']:.0f} per core), "
         f"bf16 {info['peak_bf16']:.0f} GFLOP/s. nanoGPT: {info['nanogpt']}. "
         f"x-transformers: {info['xt'] or 'not installed'}.", "",
         f"Rows alternate window by window (order flipped every round), {info['rounds']} rounds of about "
         f"{info['window_s']:g} s per row at most (fewer when a shape's {info['budget_s']:.0f} s budget runs out); "
         "tokens/s = median over windows; a ratio = median over rounds of the two rows' windows of that round. "
         "Without a nanoGPT checkout the reference is normlab's own learned-position model (`model.positions: "
         "learned`: nanoGPT's position scheme in normlab's code), so *ratio to learned* measures what RoPE costs.", ""]
    if not info["has_bf16"]:
        L += ["**This CPU has no bf16 matrix units** (no AMX / AVX512-BF16): torch emulates bf16 matmuls here (GEMM "
              f"{info['peak_bf16']:.1f} GFLOP/s against {info['peak_fp32']:.0f} in fp32), so `train.precision: auto` "
              "picks fp32 and a bf16 row is slower, not faster.", ""]
    for shape, target, rows, extra in shapes:
        ref = next((r for r in rows if r.label.startswith("nanoGPT") and r.loop is None and r.windows), None)
        ref_loop = next((r for r in rows if r.label.startswith("nanoGPT") and r.loop is not None and r.windows), None)
        learned = next((r for r in rows if r.label.startswith("normlab learned") and r.windows), None)
        L += [f"### {shape.name}: L{shape.depth} E{shape.width} T{shape.context} B{shape.batch} (heads {shape.heads}, "
              f"vocab {shape.vocab}); target: normlab at its defaults >= {target:.2f}x nanoGPT"
              + ("; whole-loop rows against nanoGPT's train.py loop" if ref_loop else ""), "",
              "| setup | precision | tokens/s (median) | ratio to nanoGPT | ratio to learned | MFU | note |",
              "|---|---|---|---|---|---|---|"]
        for r in rows:
            peak = info["peak_bf16"] if r.precision == "bf16" else info["peak_fp32"]
            tok = statistics.median(r.windows) if r.windows and r.flops_per_token else None

            def rel(base: Row | None, r: Row = r) -> str:
                if base is None or not r.windows:
                    return "--"
                return "1.00x" if r is base else f"{paired(r, base):.2f}x"

            # emulated bf16: small matmuls beat the square-GEMM "peak", so an MFU would read > 100% (meaningless)
            real = tok and (r.precision != "bf16" or info["has_bf16"])
            mfu = f"{tok * r.flops_per_token / (peak * 1e9):.1%}" if real else "--"
            note = r.note + (f" compile {r.setup_s:.0f} s" if r.setup_s else "")
            base = ref_loop if r.loop and ref_loop else ref
            L.append(f"| {r.label} | {r.precision} | {f'{tok:,.0f}' if tok else '--'} | {rel(base)} | {rel(learned)} "
                     f"| {mfu} | {note.strip()} |")
        L.append("")
        if "payback" in extra:
            pb = extra["payback"]
            steps = "never" if math.isinf(pb["payback_steps"]) else f"{pb['payback_steps']:,.0f} steps"
            L += [f"Compile: {pb['compile_s']:.0f} s (first step), then {pb['speedup']:.2f}x the eager step "
                  f"({pb['eager_step_s'] * 1e3:.0f} ms eager): pays back after {steps}.", ""]
        for t in extra.get("threads", []):
            cells = ", ".join(
                f"{n} thread(s) {t['rate'][n]:,.0f} tokens/s ({t['rel_to_1'][n]:.2f}x)" for n in t["rate"]
            )
            L += [f"Threads with {t['competitors']} competing busy process(es): {cells}; `auto` chose {t['auto']} "
                  f"({t['why']}): {t['auto_vs_1']:.2f}x the 1-thread rate, {t['auto_vs_best']:.2f}x the best.", ""]
    L.append("<!-- nanogpt_speed:end -->")
    return "\n".join(L) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nanogpt", type=Path, default=None, metavar="DIR",
                    help="a checkout of karpathy/nanoGPT (its model.py is imported; rows skipped without it)")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks.md")
    ap.add_argument("--quick", action="store_true", help="fewer, shorter windows (a smoke run)")
    ap.add_argument("--shapes", default="demo,S,M,L")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile rows")
    ap.add_argument("--compile-shapes", default="S,M", help="shapes that get a torch.compile row (default S,M)")
    ap.add_argument("--policy-shapes", default="S",
                    help="shapes whose `normlab train` command rows (idle against nanoGPT's train.py at its best "
                         "thread count, and with a spinner per core) are measured ('' skips)")
    ap.add_argument("--policy-steps", type=int, default=80, help="steps of each command-row run (default 80)")
    ap.add_argument("--policy-only", action="store_true",
                    help="measure only the command rows of --policy-shapes (their own section of --out)")
    ap.add_argument("--thread-shapes", default="demo,S,M",
                    help="shapes whose 1-thread / all-core / auto rates are measured idle and with a busy process "
                         "per core ('' skips)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    nano = args.nanogpt if args.nanogpt and (args.nanogpt / "model.py").is_file() else None
    if args.nanogpt and nano is None:
        print(f"--nanogpt {args.nanogpt}: no model.py there; nanoGPT rows skipped", file=sys.stderr)
    rounds, window_s, warmup, budget_s = (3, 0.5, 1, 30.0) if args.quick else (7, 2.0, 2, 120.0)
    sizes = [512, 1024] if args.quick else [1024, 1536, 2048]
    has_bf16, why = P.fast_bf16("cpu")
    flags = sorted(f for f in P.cpu_flags() if f.startswith(("avx", "amx", "fma", "sse4")))
    main_flags = not args.policy_only  # the table's flags mean nothing to a --policy-only run
    info = {"rounds": rounds, "window_s": window_s, "budget_s": budget_s, "has_bf16": has_bf16,
            "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "cpu": cpu_model(),
            "threads": torch.get_num_threads(), "torch": torch.__version__, "wait": WAIT_POLICY,
            "heap": HEAP_POLICY,
            "capability": torch.backends.cpu.get_cpu_capability(), "bf16": why, "xt": xt_version(),
            "flags": " ".join(flags) or "unknown", "load_before": os.getloadavg()[0], "gemm_sizes": sizes,
            "nanogpt": ("model.py from a karpathy/nanoGPT checkout (`--nanogpt DIR`)" if nano
                        else "not given (`--nanogpt DIR`): rows skipped"),  # no machine path in committed results
            "command": " ".join(" ".join(["python benchmarks/nanogpt_speed.py", "--nanogpt DIR" if nano else "",
                                 "--quick" if args.quick else "", f"--shapes {args.shapes}" if main_flags else "",
                                 f"--threads {args.threads}" if main_flags else "",
                                 "--no-compile" if args.no_compile and main_flags else "",
                                 f"--compile-shapes {args.compile_shapes}" if args.compile_shapes != "S,M" else "",
                                 f"--thread-shapes '{args.thread_shapes}'" if args.thread_shapes != "demo,S,M" else "",
                                 f"--policy-shapes '{args.policy_shapes}'" if args.policy_shapes != "S" else "",
                                 f"--policy-steps {args.policy_steps}" if args.policy_steps != 80 else "",
                                 "--policy-only" if args.policy_only else ""]).split())}
    if not args.policy_only:
        info["peak_fp32"] = gemm_peak(torch.float32, sizes, 5)
        info["peak_bf16"] = gemm_peak(torch.bfloat16, sizes[:1] if not has_bf16 else sizes, 2 if not has_bf16 else 5)
        print(f"{info['cpu']}: GEMM fp32 {info['peak_fp32']:.0f}, bf16 {info['peak_bf16']:.1f} GFLOP/s; {why}")
    cache = Path(tempfile.mkdtemp(prefix="nanogpt_speed_"))
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache / "inductor"))
    compile_shapes = {x.strip().upper() for x in args.compile_shapes.split(",") if x.strip()}
    thread_shapes = {x.strip().upper() for x in args.thread_shapes.split(",") if x.strip()}
    policy_shapes = {x.strip().upper() for x in args.policy_shapes.split(",") if x.strip()}
    out = []
    for name in ([] if args.policy_only else args.shapes.split(",")):
        shape, target = SHAPES[name.strip().upper()]
        key = shape.name.upper()
        auto = P.resolve_precision(_as_run(shape), "cpu")[0]
        rows = [nanogpt_row(shape, nano)] if nano else []
        if xt_version():
            xr = xt_runner(shape)
            rows.append(Row("x-transformers", "fp32", xr.flops_per_token, xr.step, xr.tokens_per_step))
        default = normlab_row(shape, auto, False, f"normlab defaults (RoPE; auto = {auto})")
        rows += [default, normlab_row(shape, auto, False, f"normlab learned positions ({auto})", positions="learned")]
        if key in ("S", "DEMO"):
            rows.append(loop_row(shape, cache / "data", cache))
            if nano:
                rows.append(nanogpt_loop_row(shape, nano, cache))
        other = "bf16" if auto == "fp32" else "fp32"
        if other == "bf16" and not has_bf16 and key != "S":
            rows_slow = [Row("normlab bf16", "bf16", 0.0, note=f"not run: {why}")]
        else:
            rows_slow = []
            rows.append(normlab_row(shape, other, False, f"normlab {other}"))
        compiled = None
        if not args.no_compile and key in compile_shapes:
            if P.cxx_compiler():
                print(f"shape {shape.name}: compiling", flush=True)
                compiled = normlab_row(shape, auto, True, f"normlab compiled ({auto})")
                rows.append(compiled)
            else:
                rows_slow.append(Row(f"normlab compiled ({auto})", auto, 0.0, note="no C++ compiler: not run"))
        for r in rows:
            r.threads = r.threads or args.threads
        print(f"shape {shape.name}: measuring {', '.join(r.label for r in rows)}", flush=True)
        measure(rows, rounds, window_s, warmup, budget_s)
        for r in rows + rows_slow:
            print(f"  {r.label:45s} " + (f"{statistics.median(r.windows):9,.0f} tok/s  windows "
                  f"{', '.join(f'{w:,.0f}' for w in r.windows)}" if r.windows else r.note), flush=True)
        extra: dict = {}
        if compiled is not None:
            extra["payback"] = payback(default, compiled)
            print(f"  payback: {extra['payback']}", flush=True)
        if key in thread_shapes:
            extra["threads"] = []
            for competitors in (0, read_budget().usable):
                t = thread_rows(shape, auto, competitors, 3 if args.quick else 5, 0.5 if args.quick else 1.0)
                extra["threads"].append(t)
                print(f"  threads, {competitors} competitors: {t}", flush=True)
            torch.set_num_threads(args.threads)
        out.append((shape, target, rows + rows_slow, extra))
        info["load_after"] = os.getloadavg()[0]
        write_section(args.out, "nanogpt_speed", render(info, out))  # after every shape: a long run keeps its part
    if out:
        info["load_after"] = os.getloadavg()[0]
        write_section(args.out, "nanogpt_speed", render(info, out))
    done = []
    for name in sorted(policy_shapes):  # their own section: a --policy-only run leaves the table above as it was
        shape = SHAPES[name][0]
        done.append((shape, policy_rows(shape, nano, cache, 3 if args.quick else 5, args.policy_steps)))
        print(f"  command rows, {shape.name}: {done[-1][1]}", flush=True)
        write_section(args.out, "nanogpt_policy", render_policy(info, done))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
