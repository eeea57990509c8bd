#!/usr/bin/env python
"""Stacked training against the same runs one after another (normlab.train.stacked), on this machine's device.

K runs of the demo's model (6 blocks, width 64, 4 heads, context 64, batch 16, byte vocabulary, ``pystdlib``; seeds
0..K-1, fp32, eager, diagnostics off) trained twice per round: one after another with ``normlab.train.loop.train``,
and together with ``train_stacked``. The time is each side's whole wall time (data, initial evaluation, steps, final
evaluation, checkpoints), so it is what a sweep would spend. The order alternates round by round; the ratio is the
median over rounds of the per-round ratio (load on a shared machine hits both sides alike). Writes the section
``stack-speed`` of docs/benchmarks.md.

    python benchmarks/stack_speed.py [--members 4] [--steps 40] [--rounds 3] [--threads 1] [--device cpu]
                                     [--out docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--members", type=int, default=4)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks.md")
    args = p.parse_args(argv)
    import torch

    from normlab.config import load_config
    from normlab.train.loop import train
    from normlab.train.precision import cpu_name
    from normlab.train.stacked import train_stacked

    warnings.filterwarnings("ignore", message=".*batching rule.*")  # CPU flash attention runs member by member
    torch.set_num_threads(args.threads)
    keys = [f"train.steps={args.steps}", f"train.eval_every={args.steps}", "train.eval_batches=1",
            f"train.checkpoint_every={args.steps}", "model.width=64", "model.depth=6", "model.heads=4",
            "model.context=64", "train.batch_size=16", "train.track=[]", "diag.every=0", "data.source=pystdlib",
            "train.precision=fp32", "train.compile=false", f"train.threads={args.threads}", f"device={args.device}"]

    def cfgs():
        return [load_config("small", [*keys, f"seed={s}"]) for s in range(args.members)]

    ratios, alone_s, stacked_s = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for rnd in range(args.rounds):
            times = {}
            for side in (("alone", "stacked") if rnd % 2 == 0 else ("stacked", "alone")):
                out = Path(tmp) / f"{rnd}-{side}"
                t = time.perf_counter()
                if side == "alone":
                    for i, c in enumerate(cfgs()):
                        train(c, out / f"r{i}", quiet=True)
                else:
                    train_stacked(cfgs(), [out / f"r{i}" for i in range(args.members)], quiet=True)
                times[side] = time.perf_counter() - t
            ratios.append(times["alone"] / times["stacked"])
            alone_s.append(times["alone"])
            stacked_s.append(times["stacked"])
            print(f"round {rnd}: alone {times['alone']:.1f} s, stacked {times['stacked']:.1f} s", flush=True)
    device = torch.cuda.get_device_name() if args.device == "cuda" else f"{cpu_name()}, {args.threads} thread(s)"
    body = "\n".join([
        "## Stacked training against runs one after another (`benchmarks/stack_speed.py`)", "",
        f"{device}; torch {torch.__version__}; {args.members} runs of the demo's model (L6 E64 T64 B16, fp32, eager, "
        f"diagnostics off), {args.steps} steps each, whole wall time per side, {args.rounds} rounds in alternating "
        f"order. Command: `python benchmarks/stack_speed.py --members {args.members} --steps {args.steps} --rounds "
        f"{args.rounds} --threads {args.threads} --device {args.device}`.", "",
        "| one after another (s, median) | stacked (s, median) | speed-up of stacking (median of per-round ratios) |",
        "|---:|---:|---:|",
        f"| {statistics.median(alone_s):.1f} | {statistics.median(stacked_s):.1f} | {statistics.median(ratios):.2f}x |",
    ])
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from sections import write_section

    write_section(args.out, "stack-speed", body)
    print(body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
