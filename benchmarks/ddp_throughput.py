#!/usr/bin/env python
"""Data-parallel training throughput: ``normlab train --nproc 2`` (torchrun + DDP, gloo) next to one process.

Each repetition trains the same run twice, alternating which goes first: one process with all the machine's cores
as torch threads, and 2 processes (ranks) with ``cores // 2`` threads each. Throughput is the median of the
``tokens_per_s`` records of ``metrics.jsonl`` after the first (the loop's own steady-state measure of global
tokens per second: validation excluded); wall time is the whole command, start-up (torch imports, rendezvous)
included. The two runs train the same global batches, so their final losses are printed as a check.

Results go to the ``ddp_throughput`` section of ``--out`` (default ``docs/benchmarks.md``), written atomically.

    python benchmarks/ddp_throughput.py [--out docs/benchmarks.md] [--config small] [--steps 60] [--reps 3]
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sections import write_section  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def train(config: str, steps: int, nproc: int, out: Path, cores: int) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OMP_NUM_THREADS=str(max(1, cores // nproc)))
    cmd = [sys.executable, "-m", "normlab", "train", config, "--out", str(out), "--json",
           "--set", f"train.steps={steps}", "--set", "train.log_every=5", "--set", f"train.eval_every={steps}",
           "--set", f"train.checkpoint_every={steps}", "--set", "diag.every=0"]
    if nproc > 1:
        cmd += ["--nproc", str(nproc)]
    t0 = time.time()
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.time() - t0
    if r.returncode != 0:
        raise SystemExit(f"training failed ({r.returncode}): {r.stderr[-2000:]}")
    summary = json.loads(r.stdout)
    recs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    tok = [x["tokens_per_s"] for x in recs if "tokens_per_s" in x][1:]
    return {"tok_s": statistics.median(tok), "wall_s": wall, "loss": summary["train_loss"]}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=str(ROOT / "docs" / "benchmarks.md"))
    p.add_argument("--config", default="small")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args()
    cmdline = "python benchmarks/ddp_throughput.py " + " ".join(sys.argv[1:])
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    load0 = os.getloadavg()
    res: dict[int, list[dict]] = {1: [], 2: []}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.reps):
            for nproc in ((1, 2) if rep % 2 == 0 else (2, 1)):
                r = train(args.config, args.steps, nproc, Path(tmp) / f"n{nproc}-{rep}", cores)
                res[nproc].append(r)
                print(f"rep {rep} nproc {nproc}: {r['tok_s']:,.0f} tok/s, {r['wall_s']:.1f} s, loss {r['loss']:.5f}",
                      file=sys.stderr)
    load1 = os.getloadavg()
    import torch

    med = {n: statistics.median(x["tok_s"] for x in v) for n, v in res.items()}
    wall = {n: statistics.median(x["wall_s"] for x in v) for n, v in res.items()}
    ratios = [b["tok_s"] / a["tok_s"] for a, b in zip(res[1], res[2])]
    now = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    dloss = max(abs(a["loss"] - b["loss"]) for a, b in zip(res[1], res[2]))
    lines = [
        "## Data-parallel training: 2 processes (DDP, gloo) vs 1 (`benchmarks/ddp_throughput.py`)", "",
        f"{now} · {platform.processor() or platform.machine()} ({cores} CPUs) · torch {torch.__version__} · load "
        f"average {load0[0]:.2f} before, {load1[0]:.2f} after" + (" (other jobs were running)" if load0[0] > 0.5 * cores
                                                                  else ""), "",
        f"`normlab train {args.config}` for {args.steps} steps (global batch and data order identical in both), "
        f"{args.reps} repetitions alternating the order. 1 process: {cores} torch threads; 2 processes "
        f"(`--nproc 2`): {max(1, cores // 2)} thread(s) each, gradients all-reduced by DDP over gloo on loopback. "
        "tokens/s = median of the loop's steady-state `tokens_per_s` records (validation excluded), global tokens; "
        "wall = the whole command including start-up (torch imports, rendezvous). Command: "
        f"`{cmdline}`.", "",
        "| processes | tokens/s (median of reps) | per rep | wall s (median) |",
        "|---:|---:|---|---:|",
    ]
    for n in (1, 2):
        per = ", ".join(f"{x['tok_s']:,.0f}" for x in res[n])
        lines.append(f"| {n} | {med[n]:,.0f} | {per} | {wall[n]:.1f} |")
    lines += ["", f"2 processes ÷ 1 process, per repetition: {', '.join(f'{r:.2f}x' for r in ratios)} (median "
              f"{statistics.median(ratios):.2f}x). Largest final-loss difference between the paired runs: "
              f"{dloss:.1e} (the same training, to fp32 summation order). On {cores} cores DDP is expected to "
              "gain little: the same cores do the same arithmetic, plus one gradient all-reduce per step; the point "
              "of `--nproc` here is correctness, and the speed-up comes with more cores or nodes.", ""]
    if max(load0[0], load1[0]) > cores:
        lines += [f"**Caveat: the machine was overloaded** (load average {max(load0[0], load1[0]):.1f} on {cores} "
                  "cores, from other jobs): the runs got whatever CPU share the scheduler gave them at the time, so "
                  "the ratio above measures the load, not DDP. Re-run `make bench` (or this script) on an idle "
                  "machine for a meaningful figure.", ""]
    write_section(Path(args.out), "ddp_throughput", "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
