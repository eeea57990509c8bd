#!/usr/bin/env python
"""Does bf16 change what the lab concludes? The demo's shape trained in fp32 and in bf16, several seeds.

Takes one variant of the demo sweep (``normlab compare --preset quick``; default its Pre-LN run), trains it with
``train.precision: fp32`` and ``bf16`` for each seed (same seed = same init and data order in both), and reports
the final validation bits/byte per seed, the paired bf16 - fp32 difference, and the seed spread (standard deviation
of the fp32 runs over seeds). bf16 passes when the mean paired difference is well inside the seed spread
(``|mean diff| < 0.5 x seed std``).

    python benchmarks/precision_numerics.py [--seeds 3] [--steps N] [--variant Pre-LN] [--out docs/benchmarks.md]
"""

from __future__ import annotations

import argparse
import copy
import datetime as _dt
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sections import write_section  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from normlab.config import config_from_dict  # noqa: E402
from normlab.experiments.sweep import load_sweep  # noqa: E402
from normlab.train import precision as P  # noqa: E402
from normlab.train.loop import train  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=None, help="train.steps (default: the preset's)")
    ap.add_argument("--variant", default="Pre-LN")
    ap.add_argument("--preset", default="quick")
    ap.add_argument(
        "--config", default=None, help="a run config or preset (e.g. tiny) instead of the sweep preset's run"
    )
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks.md")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.config:
        from normlab.config import load_config

        base, what = load_config(args.config).to_dict(), f"config `{args.config}`"
    else:
        sweep = load_sweep(preset=args.preset)
        run = next((r for r in sweep.runs if r.variant == args.variant), sweep.runs[0])
        base, what = copy.deepcopy(run.config), f"variant `{run.variant}` of `--preset {args.preset}` (the demo)"
    if args.steps:
        base.setdefault("train", {})["steps"] = args.steps
    work = Path(tempfile.mkdtemp(prefix="precision_numerics_"))
    rows: dict[str, dict[int, float]] = {"fp32": {}, "bf16": {}}
    secs: dict[str, float] = {"fp32": 0.0, "bf16": 0.0}
    load = [os.getloadavg()[0]]
    for seed in range(args.seeds):
        for prec in ("fp32", "bf16"):
            d = copy.deepcopy(base)
            d["seed"] = seed
            d.setdefault("train", {})["precision"] = prec
            d["train"]["threads"] = args.threads
            t = time.perf_counter()
            s = train(config_from_dict(d), work / f"{prec}-s{seed}", quiet=True)
            secs[prec] += time.perf_counter() - t
            rows[prec][seed] = s["val_bpb"] if s["status"] == "completed" else float("nan")
            print(f"seed {seed} {prec}: {s['status']}, val {rows[prec][seed]:.4f} bits/byte, "
                  f"{s['tokens_per_s']:,.0f} tokens/s", flush=True)
            load.append(os.getloadavg()[0])
    seeds = list(range(args.seeds))
    diffs = [rows["bf16"][s] - rows["fp32"][s] for s in seeds]
    spread = statistics.stdev(rows["fp32"].values()) if args.seeds > 1 else float("nan")
    mean_diff = statistics.mean(diffs)
    ok = abs(mean_diff) < 0.5 * spread
    cfg = config_from_dict(copy.deepcopy(base))
    m, tc = cfg.model, cfg.train
    why = P.fast_bf16("cpu")[1]
    lines = [
        "<!-- precision_numerics:start -->", "## bf16 numerics: does bf16 change the conclusions?", "",
        f"`python benchmarks/precision_numerics.py --seeds {args.seeds}"
        + (f" --steps {args.steps}" if args.steps else "")
        + (f" --config {args.config}" if args.config else f" --variant {args.variant}") + "` -- "
        f"{_dt.datetime.now(_dt.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}, {P.cpu_name()} ({why}), "
        f"{args.threads} threads, load average {min(load):.1f}-{max(load):.1f}"
        + (" (shared machine)" if max(load) > 1.5 else "") + ".", "",
        f"{what}: {m.norm} / {m.placement}, depth {m.depth}, width "
        f"{m.width}, context {m.context}, batch {tc.batch_size}, {tc.steps} steps, lr {tc.lr:g}, "
        f"{m.vocab_size}-token vocabulary ({cfg.data.source}, {cfg.data.tokenizer}). Training time: fp32 "
        f"{secs['fp32']:.0f} s, bf16 {secs['bf16']:.0f} s in total.", "",
        "| seed | fp32 val bits/byte | bf16 val bits/byte | bf16 - fp32 |", "|---:|---:|---:|---:|"]
    for s in seeds:
        lines.append(f"| {s} | {rows['fp32'][s]:.5f} | {rows['bf16'][s]:.5f} | {diffs[s]:+.5f} |")
    lines += ["", f"Mean paired difference {mean_diff:+.5f} bits/byte (range {min(diffs):+.5f} to {max(diffs):+.5f}); "
              f"seed spread (std of fp32 over seeds) {spread:.5f} bits/byte: the difference is "
              f"{abs(mean_diff) / spread:.2f}x the spread -- **{'well inside' if ok else 'NOT well inside'} it** "
              "(criterion: below 0.5x).", "<!-- precision_numerics:end -->"]
    write_section(args.out, "precision_numerics", "\n".join(lines) + "\n")
    print("\n".join(lines[-2:]))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
