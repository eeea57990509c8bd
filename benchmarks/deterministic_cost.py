#!/usr/bin/env python
"""What ``train.deterministic`` costs on CUDA, and which operations it slows: a profile of one training step with
and without torch's deterministic algorithms.

One fresh process per mode (``CUBLAS_WORKSPACE_CONFIG`` is read when cuBLAS first makes its workspace), each
training the model of a ``gpu_speed.py`` shape (bf16 autocast, fused AdamW, eager unless ``--compile``) on random
byte tokens, with normlab's own switch (``normlab.train.precision.use_deterministic_kernels``):

- ``off``: torch's defaults (``train.deterministic: false``);
- ``cublas``: only ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` (cuBLAS's fixed workspace, part of the deterministic mode);
- ``true``: deterministic algorithms and that workspace, without torch's NaN fill of new memory
  (``train.deterministic: true``; the default ``auto`` is ``off`` on CUDA);
- ``fill``: as ``true`` with torch's NaN fill of new memory (torch's own default under deterministic algorithms).

Per mode: the median step time over ``--steps`` steps after ``WARMUP`` (CUDA events), and a ``torch.profiler``
table of device time per operator and per kernel over ``PROFILED`` steps (``device_times``). The section
``deterministic-cost`` of docs/benchmarks.md gets the step times as ratios to ``off`` and the operators (then the
kernels) whose device time grows most from ``off`` to ``true`` (the operation that falls back to a slower kernel is
the top row). Without a CUDA device: one
line, exit 2, nothing written.

    python benchmarks/deterministic_cost.py [--shape issue|demo] [--steps 50] [--compile] [--out docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from gpu_speed import SHAPES, no_cuda_line

ROOT = Path(__file__).resolve().parent.parent
MODES = ("off", "cublas", "true", "fill")
WARMUP, PROFILED, TOP = 10, 5, 8


def child(mode: str, shape_name: str, steps: int, compiled: bool) -> dict:
    """Train ``steps`` steps in this process under ``mode``; step times (ms) and device time per operator (us)."""
    if mode == "cublas":
        os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    import torch
    from torch.profiler import ProfilerActivity, profile

    from normlab.model import build_model
    from normlab.model.config import ModelConfig
    from normlab.train.precision import use_deterministic_kernels

    if mode in ("true", "fill"):
        use_deterministic_kernels("cuda", True)
        if mode == "fill":
            torch.utils.deterministic.fill_uninitialized_memory = True
    s = SHAPES[shape_name]
    torch.manual_seed(0)
    model = build_model(ModelConfig(width=s.width, depth=s.depth, heads=s.heads, context=s.context,
                                    vocab_size=s.vocab)).cuda()
    step_fn = torch.compile(model) if compiled else model
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, fused=True)
    x = torch.randint(0, s.vocab, (s.batch, s.context), device="cuda")
    y = torch.randint(0, s.vocab, (s.batch, s.context), device="cuda")

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = step_fn(x)
            loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), y.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(WARMUP):
        step()
    times = []
    for _ in range(steps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        step()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(PROFILED):
            step()
        torch.cuda.synchronize()
    ops, kernels = device_times(prof.key_averages(), PROFILED)
    return {"mode": mode, "step_ms": statistics.median(times), "ops_us": ops, "kernels_us": kernels,
            "device": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda}


def device_times(averages: list, steps: int) -> tuple[dict[str, float], dict[str, float]]:
    """Device time per step (us) from ``torch.profiler``'s ``key_averages()``: per operator (the aten op rows,
    recorded on the CPU, whose ``self_device_time_total`` is the time of the kernels they launched themselves), and
    per kernel (the CUDA rows). Without the CPU activity only kernel names would be known, not the operator that
    chose a slower kernel."""
    from torch.autograd import DeviceType

    ops, kernels = {}, {}
    for e in averages:
        if e.self_device_time_total > 0:
            into = ops if e.device_type == DeviceType.CPU else kernels
            into[e.key] = into.get(e.key, 0.0) + e.self_device_time_total / steps
    return ops, kernels


def grown(off: dict[str, float], on: dict[str, float], top: int = TOP) -> list[tuple[str, float, float]]:
    """The ``top`` operators whose device time per step grows most from ``off`` to ``on``: ``(name, off us, on
    us)``, largest growth first (an operator only one side runs counts 0 on the other)."""
    names = set(off) | set(on)
    rows = [(n, off.get(n, 0.0), on.get(n, 0.0)) for n in names]
    return sorted((r for r in rows if r[2] > r[1]), key=lambda r: r[1] - r[2])[:top]


def section(results: dict[str, dict], shape: str, compiled: bool) -> str:
    off = results["off"]
    head = (f"## What `train.deterministic` costs on CUDA (`benchmarks/deterministic_cost.py`)\n\n"
            f"{off['device']}, torch {off['torch']}, CUDA {off['cuda']}; shape `{shape}`, bf16 autocast, fused "
            f"AdamW, {'compiled' if compiled else 'eager'}; median step time, one fresh process per mode.\n\n"
            "| mode | step (ms) | vs off |\n|---|---:|---:|\n")
    rows = "".join(f"| {m} | {results[m]['step_ms']:.2f} | {results[m]['step_ms'] / off['step_ms']:.3f} |\n"
                   for m in MODES)
    def table(key: str) -> str:
        return "".join(f"| `{n}` | {a:.0f} | {b:.0f} | {b - a:+.0f} |\n"
                       for n, a, b in grown(off.get(key) or {}, results["true"].get(key) or {}))

    return (head + rows + "\nOperators whose device time per step grows most from `off` to `true` (us per step):\n\n"
            "| operator | off | true | growth |\n|---|---:|---:|---:|\n" + table("ops_us")
            + "\nAnd the kernels (us per step):\n\n| kernel | off | true | growth |\n|---|---:|---:|---:|\n"
            + table("kernels_us"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="issue")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks.md")
    ap.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.steps < 1:
        print(f"deterministic_cost.py: --steps must be >= 1 (steps timed per mode), got {args.steps}", file=sys.stderr)
        return 2
    why = no_cuda_line()
    if why:
        print(why.replace("gpu_speed.py", "deterministic_cost.py"), file=sys.stderr)
        return 2
    if args.child:
        print(json.dumps(child(args.child, args.shape, args.steps, args.compile)))
        return 0
    results = {}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "benchmarks")])}
    env.pop("CUBLAS_WORKSPACE_CONFIG", None)
    for mode in MODES:
        cmd = [sys.executable, __file__, "--child", mode, "--shape", args.shape, "--steps", str(args.steps)]
        r = subprocess.run(cmd + (["--compile"] if args.compile else []), capture_output=True, text=True, env=env)
        if r.returncode:
            print(f"deterministic_cost.py: mode {mode} failed: {(r.stderr.strip().splitlines() or ['?'])[-1]}",
                  file=sys.stderr)
            return 1
        results[mode] = json.loads(r.stdout.strip().splitlines()[-1])
        print(f"{mode}: {results[mode]['step_ms']:.2f} ms/step", file=sys.stderr)
    from sections import write_section

    write_section(args.out, "deterministic-cost", section(results, args.shape, args.compile))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
