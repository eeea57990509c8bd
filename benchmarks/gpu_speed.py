#!/usr/bin/env python
"""GPU training speed: karpathy/nanoGPT's own ``train.py`` against ``normlab train``, and ``make demo`` on the GPU.

Two shapes, byte vocabulary (256), bf16:

- ``issue``: GPT-2-small body, 12 blocks, width 768, 12 heads, context 1024, batch 16;
- ``demo``: the ``quick`` preset's model, 6 blocks, width 64, 4 heads, context 64, batch 16.

Rows per shape, each a fresh process training ``--steps`` steps (median steady-state tokens/s after the first
``SKIP`` steps, so compile time is excluded):

- nanoGPT ``train.py`` (a checkout given by ``--nanogpt DIR``; nothing of it is vendored), ``--compile=True`` and
  ``--compile=False``, ``--dtype=bfloat16``, in a scratch directory with the data layout it expects;
- ``normlab train tiny`` at the shape with normlab's defaults (precision auto, compile auto, deterministic auto: off
  on CUDA, the preset's ``diag.every``), compiled and eager, and then with one cost switched at a time:
  ``train.deterministic=true`` (what exact resume costs), ``diag.every=0``, ``model.positions=learned`` (RoPE's cost);
- ``make demo`` on the GPU (``normlab compare --preset quick``, its wall time), unless ``--no-demo``.

On a machine without a CUDA device it prints one line saying so and exits with status 2, before anything else.
The results go to docs/benchmarks.md's section ``gpu-speed`` (the card, torch and CUDA versions named).

    python benchmarks/gpu_speed.py --nanogpt DIR [--out docs/benchmarks.md] [--steps 200] [--shapes issue,demo]
                                   [--no-demo] [--costs defaults,...] [--modes compiled,eager]

Each row is printed as it is measured; a row that fails prints one line naming its error and reads "failed" in the
table, and the others are still measured and written.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SKIP = 30  # steady state: steps after the first SKIP (compile and warm-up excluded)
LR = 6e-4


@dataclass(frozen=True)
class Shape:
    name: str
    depth: int
    width: int
    heads: int
    context: int
    batch: int
    vocab: int = 256


SHAPES = {"issue": Shape("issue", 12, 768, 12, 1024, 16), "demo": Shape("demo", 6, 64, 4, 64, 16)}
COSTS = [("defaults", []), ("train.deterministic=true", ["train.deterministic=true"]),
         ("diag.every=0", ["diag.every=0"]), ("model.positions=learned", ["model.positions=learned"])]


def no_cuda_line() -> str | None:
    """The one line to print where this machine has no CUDA device (None where it has one)."""
    try:
        import torch
    except ImportError:
        return "gpu_speed.py: torch is not installed; this benchmark needs torch with a CUDA device"
    if not torch.cuda.is_available():
        return (f"gpu_speed.py: no CUDA device (torch {torch.__version__} sees none); this benchmark measures GPU "
                "training speed and needs one")
    return None


def nanogpt_rate(shape: Shape, nanogpt: Path, work: Path, steps: int, compiled: bool) -> float:
    """tokens/s of nanoGPT's train.py at ``shape`` (median per-iteration time after SKIP iterations)."""
    import numpy as np

    root = work / f"nanogpt-{shape.name}-{int(compiled)}"
    data = root / "data" / "normlab_bench"
    data.mkdir(parents=True, exist_ok=True)
    tokens = np.random.default_rng(0).integers(0, shape.vocab, 2_000_000, dtype=np.uint16)
    tokens.tofile(data / "train.bin")
    tokens[:200_000].tofile(data / "val.bin")
    with open(data / "meta.pkl", "wb") as f:  # written here, read by nanoGPT's script (its vocabulary size)
        pickle.dump({"vocab_size": shape.vocab}, f)
    shutil.copy(nanogpt / "configurator.py", root / "configurator.py")
    argv = [sys.executable, str(nanogpt / "train.py"), "--dataset=normlab_bench", f"--out_dir={root / 'out'}",
            "--device=cuda", f"--compile={compiled}", "--dtype=bfloat16", f"--batch_size={shape.batch}",
            f"--block_size={shape.context}", f"--n_layer={shape.depth}", f"--n_head={shape.heads}",
            f"--n_embd={shape.width}", "--bias=False", "--dropout=0.0", "--gradient_accumulation_steps=1",
            f"--max_iters={steps}", "--eval_interval=1000000", "--eval_iters=1", "--log_interval=1",
            "--always_save_checkpoint=False", f"--learning_rate={LR}", "--warmup_iters=20",
            f"--lr_decay_iters={steps}", f"--min_lr={LR / 10}"]
    res = subprocess.run(argv, cwd=root, capture_output=True, text=True, timeout=3600)
    if res.returncode != 0:
        raise RuntimeError(f"nanoGPT train.py failed: {res.stderr.strip().splitlines()[-1:]}")
    dts = [float(m) for m in re.findall(r"time ([0-9.]+)ms", res.stdout)]
    return shape.batch * shape.context / (statistics.median(dts[SKIP:] or dts) / 1e3)


def normlab_rate(shape: Shape, work: Path, steps: int, sets: list[str], compiled: bool) -> tuple[float, dict]:
    """tokens/s of ``normlab train tiny`` at ``shape`` (median of its ``tokens_per_s`` records after SKIP steps)
    and its summary."""
    out = work / f"normlab-{shape.name}-{len(os.listdir(work))}"
    keys = [f"model.depth={shape.depth}", f"model.width={shape.width}", f"model.heads={shape.heads}",
            f"model.context={shape.context}", f"train.batch_size={shape.batch}", f"train.steps={steps}",
            f"train.lr={LR}", "train.log_every=10", f"train.eval_every={steps}", "train.eval_batches=1",
            f"train.checkpoint_every={steps}", "train.track=[]", "data.source=pystdlib", "device=cuda",
            *([] if compiled else ["train.compile=false"]), *sets]
    argv = [sys.executable, "-m", "normlab", "train", "tiny", "--out", str(out)]
    for k in keys:
        argv += ["--set", k]
    res = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=3600)
    if res.returncode != 0:
        raise RuntimeError(f"normlab train failed: {res.stderr.strip().splitlines()[-1:]}")
    recs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rates = [r["tokens_per_s"] for r in recs if "tokens_per_s" in r and r["step"] > SKIP]
    return statistics.median(rates), json.loads((out / "summary.json").read_text())


def demo_seconds(work: Path) -> float:
    """Wall time of ``normlab compare --preset quick`` (what ``make demo`` runs) on this machine."""
    t0 = time.time()
    res = subprocess.run([sys.executable, "-m", "normlab", "compare", "--preset", "quick", "--out",
                          str(work / "demo")], cwd=ROOT, capture_output=True, text=True, timeout=7200)
    if res.returncode != 0:
        raise RuntimeError(f"normlab compare --preset quick failed: {res.stderr.strip().splitlines()[-1:]}")
    return time.time() - t0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nanogpt", required=True, type=Path, help="a karpathy/nanoGPT checkout (holds train.py)")
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks.md")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--shapes", default="issue,demo")
    p.add_argument("--no-demo", action="store_true")
    p.add_argument("--costs", default=",".join(label for label, _ in COSTS),
                   help="the normlab rows to run, comma-separated (default: all; the device script runs 'defaults')")
    p.add_argument("--modes", default="compiled,eager", help="compiled, eager or both (default: both)")
    args = p.parse_args(argv)
    line = no_cuda_line()
    if line:
        print(line, file=sys.stderr)
        return 2
    if not (args.nanogpt / "train.py").is_file():
        print(f"gpu_speed.py: --nanogpt {args.nanogpt} has no train.py (git clone https://github.com/karpathy/nanoGPT)",
              file=sys.stderr)
        return 2
    shapes = [SHAPES[s] for s in args.shapes.split(",") if s in SHAPES]
    costs = [(label, sets) for label, sets in COSTS if label in args.costs.split(",")]
    modes = [m == "compiled" for m in ("compiled", "eager") if m in args.modes.split(",")]
    if args.steps <= SKIP or not shapes or not costs or not modes:
        print(f"gpu_speed.py: --steps must exceed {SKIP}, --shapes name some of {', '.join(SHAPES)}, --costs some "
              f"of {', '.join(label for label, _ in COSTS)} and --modes compiled and/or eager", file=sys.stderr)
        return 2
    import torch

    card = torch.cuda.get_device_name()
    lines = ["## GPU training speed (`benchmarks/gpu_speed.py`)", "",
             f"{card}; torch {torch.__version__}, CUDA {torch.version.cuda}; {args.steps} steps per row, median "
             f"tokens/s after step {SKIP}; byte vocabulary, bf16, lr {LR:g}. Command: `python benchmarks/gpu_speed.py "
             f"--nanogpt DIR --steps {args.steps}`.", ""]
    def add(line: str) -> None:  # each row is printed as it is measured: a later failure or a kill loses none
        lines.append(line)
        print(line, flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for shape in shapes:
            add(f"### {shape.name}: L{shape.depth} E{shape.width} H{shape.heads} T{shape.context} B{shape.batch}")
            add("")
            add("| run | tokens/s | vs nanoGPT train.py (same mode) |")
            add("|---|---:|---:|")
            ref: dict[bool, float | None] = {}
            for c in modes:
                ref[c] = _row(lambda: nanogpt_rate(shape, args.nanogpt, work, args.steps, c))
                name = f"nanoGPT train.py, {'compiled' if c else 'eager'}"
                add(f"| {name} | {ref[c]:,.0f} | 1.00 |" if ref[c] else f"| {name} | failed | |")
            for compiled in modes:
                for label, sets in costs:
                    got = _row(lambda: normlab_rate(shape, work, args.steps, sets, compiled))
                    if got is None:
                        add(f"| normlab train, {'compiled' if compiled else 'eager'}, {label} | failed | |")
                        continue
                    rate, s = got
                    mode = "compiled" if s.get("compile") else "eager"
                    vs = f"{rate / ref[compiled]:.2f}" if ref.get(compiled) else "n/a"
                    add(f"| normlab train, {mode}, {label} ({s.get('precision')}) | {rate:,.0f} | {vs} |")
            add("")
        if not args.no_demo:
            wall = _row(lambda: demo_seconds(work))
            add("`make demo` (normlab compare --preset quick) on this GPU: "
                + (f"{wall:.0f} s wall." if wall is not None else "failed (its error is above)."))
            add("")
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from sections import write_section

    write_section(args.out, "gpu-speed", "\n".join(lines))
    return 0


def _row(measure):  # noqa: ANN001, ANN202 - a row's measurement, or None after one line naming its error
    try:
        return measure()
    except (RuntimeError, subprocess.TimeoutExpired, OSError, ValueError, KeyError) as e:
        print(f"gpu_speed.py: a row failed: {str(e).splitlines()[0] if str(e) else type(e).__name__}", file=sys.stderr,
              flush=True)
        return None


if __name__ == "__main__":
    sys.exit(main())
