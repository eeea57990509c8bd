#!/usr/bin/env python
"""What keeping freed memory in the C heap (normlab.train.heap) does to ``normlab train``: page faults and speed.

Each repetition runs the same ``normlab train`` command twice, alternating which goes first: as the ``normlab``
entry point runs it (mallopt: mmap and trim thresholds 1 GiB) and with ``NORMLAB_MALLOC=default`` (glibc's own
thresholds). Speed = the median of the loop's ``tokens_per_s`` records after the first (validation excluded);
page faults = the child process's minor faults (``os.wait4``'s rusage, start-up included: the difference between
the two, divided by the steps, is what each step saves). Shapes are nanoGPT's benchmark shapes
(benchmarks/nanogpt_speed.py: demo, S, M) on the bytes of a synthetic corpus, 1 torch thread, lr 6e-4, no
evaluation or checkpoint before the end. The final training losses must agree bit for bit (the heap changes where
memory comes from, never a number).

Results go to the ``heap_policy`` section of ``--out`` (default ``docs/benchmarks.md``), written atomically.

    python benchmarks/heap_policy.py [--out docs/benchmarks.md] [--shapes demo,S] [--steps 150] [--reps 4]
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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sections import write_section  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SHAPES = {"demo": (6, 64, 4, 64, 16), "S": (4, 128, 4, 64, 12), "M": (6, 384, 6, 256, 8)}  # depth width heads T B
SOURCE = "synthetic:markov?order=2&alphabet=16&length=300000&seed=0"


def train(shape: str, steps: int, out: Path, cache: Path, policy: bool) -> dict:
    depth, width, heads, context, batch = SHAPES[shape]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "NORMLAB_HEAP"))}
    env.update(PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), OMP_NUM_THREADS="1",
               NORMLAB_CACHE_DIR=str(cache))
    if not policy:
        env["NORMLAB_MALLOC"] = "default"
    sets = {"data.source": SOURCE, "model.depth": depth, "model.width": width, "model.heads": heads,
            "model.context": context, "train.batch_size": batch, "train.steps": steps, "train.lr": 6e-4,
            "train.log_every": 10, "train.eval_every": steps, "train.eval_batches": 1,
            "train.checkpoint_every": steps, "train.threads": 1, "diag.every": 0, "train.track": "[]"}
    cmd = [sys.executable, "-m", "normlab", "train", "tiny", "--out", str(out), "--json"]
    for k, v in sets.items():
        cmd += ["--set", f"{k}={v}"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(proc.pid, 0)
    stdout, stderr = proc.stdout.read(), proc.stderr.read()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"normlab train failed: {stderr.strip()[-2000:]}")
    summary = json.loads(stdout)
    recs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rates = [float(r["tokens_per_s"]) for r in recs if "tokens_per_s" in r][1:]
    return {"tok_s": statistics.median(rates), "minflt": usage.ru_minflt, "loss": summary["train_loss"]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks.md")
    p.add_argument("--shapes", default="demo,S")
    p.add_argument("--steps", type=int, default=150)
    p.add_argument("--reps", type=int, default=4)
    args = p.parse_args()
    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    bad = [s for s in shapes if s not in SHAPES]
    if bad or args.steps < 30 or args.reps < 1:
        print(f"heap_policy.py: shapes must be among {', '.join(SHAPES)}, --steps >= 30 and --reps >= 1 "
              f"(got {args.shapes!r}, {args.steps}, {args.reps})", file=sys.stderr)
        return 2
    load0 = os.getloadavg()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        cache = Path(tmp) / "cache"
        train(shapes[0], 30, Path(tmp) / "warm", cache, True)  # builds the token cache once
        for shape in shapes:
            res: dict[bool, list[dict]] = {True: [], False: []}
            for rep in range(args.reps):
                for policy in ((True, False) if rep % 2 == 0 else (False, True)):
                    out = Path(tmp) / f"{shape}-{rep}-{int(policy)}"
                    res[policy].append(train(shape, args.steps, out, cache, policy))
                    print(f"{shape} rep {rep} {'kept' if policy else 'glibc'}: {res[policy][-1]}", file=sys.stderr)
            same = {r["loss"] for r in res[True] + res[False]}
            ratios = sorted(a["tok_s"] / b["tok_s"] for a, b in zip(res[True], res[False]))
            ratio = statistics.median(ratios)
            rows.append((shape, statistics.median(r["tok_s"] for r in res[False]),
                         statistics.median(r["tok_s"] for r in res[True]), (ratio, ratios[0], ratios[-1]),
                         statistics.median(r["minflt"] for r in res[False]),
                         statistics.median(r["minflt"] for r in res[True]), len(same) == 1))
    load1 = os.getloadavg()
    when = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = ["## Keeping freed memory in the C heap (`benchmarks/heap_policy.py`)", "",
             f"{when} · {platform.machine()} ({os.cpu_count()} CPUs) · load average {load0[0]:.2f} before, "
             f"{load1[0]:.2f} after. `normlab train` at each shape for {args.steps} steps, 1 thread, {args.reps} "
             "repetitions alternating the order: as the `normlab` command runs it (normlab.train.heap: glibc's mmap "
             "and trim thresholds raised to 1 GiB) against `NORMLAB_MALLOC=default` (glibc's own). tokens/s = median "
             "of the loop's records after the first; minor page faults of the whole process (start-up included), "
             "median over repetitions. Command: `python benchmarks/heap_policy.py --shapes "
             f"{','.join(shapes)} --steps {args.steps} --reps {args.reps}`.", "",
             "| shape | tokens/s, glibc default | tokens/s, heap kept | ratio (paired median; min-max) | minor faults, "
             "default | minor faults, kept | faults saved per step | same final loss |",
             "|---|---|---|---|---|---|---|---|"]
    for shape, a, b, r, fa, fb, same in rows:
        lines.append(f"| {shape} | {a:,.0f} | {b:,.0f} | {r[0]:.3f}x ({r[1]:.3f}-{r[2]:.3f}) | {fa:,.0f} | {fb:,.0f} | "
                     f"{(fa - fb) / args.steps:,.0f} | {'yes' if same else 'NO'} |")
    body = "\n".join(lines) + "\n"
    write_section(args.out, "heap_policy", body)
    print(body)
    return 0 if all(r[-1] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
