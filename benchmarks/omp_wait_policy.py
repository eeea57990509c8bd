#!/usr/bin/env python
"""What OpenMP's wait policy costs on a busy machine: a training-like pattern (a small parallel kernel, then serial
Python work, repeated) at 2 torch threads, in fresh processes with ``OMP_WAIT_POLICY`` unset (libgomp spins after
each parallel region) and ``PASSIVE`` (its threads sleep), alternating. libgomp reads the variable when torch is
imported, so each setting needs its own process (normlab's entry point sets it before importing torch:
normlab.train.threads.set_wait_policy).

``--step S`` times normlab's training step at benchmarks/nanogpt_speed.py's shape S (forward, backward, AdamW;
30 steps after 5 of warm-up) instead of the synthetic pattern: what the policy costs where it matters, e.g. on an
idle machine, where spinning could pay.

``--spincount N`` adds a third setting, ``OMP_WAIT_POLICY`` unset with ``GOMP_SPINCOUNT=N`` (libgomp spins N
iterations, then sleeps: what normlab sets when every core is free at start); ``--competitors K`` runs K busy
processes (one core each) during the measurement.

    python benchmarks/omp_wait_policy.py [--reps 3] [--threads 2] [--step S] [--spincount N] [--competitors K] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

CHILD = """
import os, resource, sys, time
import torch
torch.set_num_threads(int(sys.argv[1]))
a = torch.randn(256, 256)
t0, r0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
for _ in range(200):
    a @ a                      # one parallel region
    sum(range(20000))          # serial Python work between regions (the other threads idle)
r1, wall = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter() - t0
print(wall, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime))
"""


STEP_CHILD = """
import resource, sys, time
sys.path.insert(0, sys.argv[2])
import torch
import torch.nn.functional as F
from train_throughput import Shape, fixed_batch, model_config
from normlab.config import TrainConfig
from normlab.model import build_model
from normlab.train.optim import build_optimizer
torch.set_num_threads(int(sys.argv[1]))
shape = Shape("S", depth=4, width=128, heads=4, context=64, batch=12, vocab=256, target=0.0)
torch.manual_seed(0)
model = build_model(model_config(shape))
opt, _ = build_optimizer(model, TrainConfig())
x, y = fixed_batch(shape)
def step():
    logits = model(x)
    F.cross_entropy(logits.view(-1, logits.size(-1)), y.reshape(-1)).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
for _ in range(5):
    step()
t0, r0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
for _ in range(30):
    step()
r1, wall = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter() - t0
print(wall, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime))
"""


def run(policy: str | None, threads: int, step: bool = False) -> tuple[float, float]:
    """``policy``: None (libgomp's default), ``PASSIVE``, or ``spin=N`` (GOMP_SPINCOUNT=N, policy unset)."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    if policy and policy.startswith("spin="):
        env["GOMP_SPINCOUNT"] = policy[5:]
    elif policy:
        env["OMP_WAIT_POLICY"] = policy
    here = os.path.dirname(os.path.abspath(__file__))
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(here), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    code, extra = (STEP_CHILD, [here]) if step else (CHILD, [])
    out = subprocess.run([sys.executable, "-c", code, str(threads), *extra], env=env, capture_output=True, text=True,
                         check=True).stdout.split()
    return float(out[0]), float(out[1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--step", choices=["S"], default=None,
                    help="time normlab's training step at shape S instead of the synthetic pattern")
    ap.add_argument("--spincount", type=int, default=None, metavar="N",
                    help="also measure OMP_WAIT_POLICY unset with GOMP_SPINCOUNT=N")
    ap.add_argument("--competitors", type=int, default=0, metavar="K", help="busy processes during the measurement")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.reps < 1 or args.threads < 1 or args.competitors < 0 or (args.spincount is not None and args.spincount < 0):
        print("error: --reps and --threads must be >= 1, --competitors and --spincount >= 0", file=sys.stderr)
        return 2
    load = os.getloadavg()[0]
    arms = ["unset", "PASSIVE"] + ([f"spin={args.spincount}"] if args.spincount is not None else [])
    res: dict[str, list[tuple[float, float]]] = {a: [] for a in arms}
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.competitors)]
    try:
        for i in range(args.reps):
            for policy in arms if i % 2 == 0 else arms[::-1]:
                res[policy].append(run(None if policy == "unset" else policy, args.threads, bool(args.step)))
    finally:
        for b in busy:
            b.kill()
            b.wait()
    row = {p: {"wall_s": statistics.median(w for w, _ in v), "cpu_s": statistics.median(c for _, c in v)}
           for p, v in res.items()}
    row |= {"threads": args.threads, "reps": args.reps, "load_before": load, "load_after": os.getloadavg()[0],
            "work": "30 training steps at shape S" if args.step else "200 parallel regions",
            "competitors": args.competitors}
    if args.json:
        print(json.dumps(row))
    else:
        print(f"{args.threads} threads, load {load:.1f}: {row['work']} take {row['unset']['wall_s']:.2f} s with "
              f"OMP_WAIT_POLICY unset and {row['PASSIVE']['wall_s']:.2f} s with PASSIVE (median of {args.reps})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
