#!/usr/bin/env python
"""What OpenMP's wait policy costs on a busy machine: a training-like pattern (a small parallel kernel, then serial
Python work, repeated) at 2 torch threads, in fresh processes with ``OMP_WAIT_POLICY`` unset (libgomp spins after
each parallel region) and ``PASSIVE`` (its threads sleep), alternating. libgomp reads the variable when torch is
imported, so each setting needs its own process (normlab's entry point sets it before importing torch:
normlab.train.threads.set_wait_policy).

    python benchmarks/omp_wait_policy.py [--reps 3] [--threads 2] [--json]
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


def run(policy: str | None, threads: int) -> tuple[float, float]:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if policy:
        env["OMP_WAIT_POLICY"] = policy
    out = subprocess.run([sys.executable, "-c", CHILD, str(threads)], env=env, capture_output=True, text=True,
                         check=True).stdout.split()
    return float(out[0]), float(out[1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.reps < 1 or args.threads < 1:
        print("error: --reps and --threads must be >= 1", file=sys.stderr)
        return 2
    load = os.getloadavg()[0]
    res: dict[str, list[tuple[float, float]]] = {"unset": [], "PASSIVE": []}
    for i in range(args.reps):
        for policy in ("unset", "PASSIVE") if i % 2 == 0 else ("PASSIVE", "unset"):
            res[policy].append(run(None if policy == "unset" else policy, args.threads))
    row = {p: {"wall_s": statistics.median(w for w, _ in v), "cpu_s": statistics.median(c for _, c in v)}
           for p, v in res.items()}
    row |= {"threads": args.threads, "reps": args.reps, "load_before": load, "load_after": os.getloadavg()[0]}
    if args.json:
        print(json.dumps(row))
    else:
        print(f"{args.threads} threads, load {load:.1f}: 200 regions take {row['unset']['wall_s']:.2f} s with "
              f"OMP_WAIT_POLICY unset and {row['PASSIVE']['wall_s']:.2f} s with PASSIVE (median of {args.reps})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
