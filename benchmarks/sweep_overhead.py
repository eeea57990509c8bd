#!/usr/bin/env python
"""Per-run overhead of the sweep runner's local execution modes (``normlab.experiments.sweepdir``).

A sweep of ``--runs`` tiny runs (the ``tiny`` preset, ``--steps`` steps: training itself takes a fraction of a
second, so what is measured is nearly all overhead) is trained three ways, one worker and one torch thread each:

- ``process per run``: ``python -m normlab.experiments.worker SWEEP_DIR RUN_ID`` once per run, one after another
  (how the runner trained every run before persistent workers);
- ``persistent worker``: ``run_sweep(workers=1)``: one ``worker --serve`` process trains every run
  (normlab.experiments.pool; ``compare`` and ``claims --workers N``);
- ``in process``: ``run_sweep(workers=1, inline=True)`` (``claims`` with one worker).

The modes run alternately, round by round (order reversed every round), each in a fresh sweep directory with the
token cache already built. Reported: wall seconds and CPU seconds (this process + its children) per run, medians
over rounds, and the ratio to ``process per run``.

    python benchmarks/sweep_overhead.py [--out docs/benchmarks.md] [--runs 8] [--steps 4] [--rounds 3]
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sections import write_section  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from normlab.experiments.sweepdir import registration, run_sweep  # noqa: E402
from normlab.experiments.scheduling import worker_env  # noqa: E402
from normlab.experiments.store import Store  # noqa: E402
from normlab.experiments.sweep import parse_sweep  # noqa: E402

MODES = ("process per run", "persistent worker", "in process")


def cpu_s() -> float:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def one(mode: str, sweep, root: Path) -> tuple[float, float]:
    d = Path(tempfile.mkdtemp(dir=root))
    quiet = lambda s: None  # noqa: E731
    t0, c0 = time.perf_counter(), cpu_s()
    if mode == "process per run":
        store = Store(d / "results.sqlite")
        store.create(sweep.name, sweep.hash)
        store.register(registration(sweep))
        env = worker_env(1)
        for r in sweep.runs:
            subprocess.run([sys.executable, "-m", "normlab.experiments.worker", str(d), r.run_id, "--threads", "1"],
                           env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    else:
        run_sweep(sweep, d, workers=1, threads=1, inline=mode == "in process", log=quiet)
    wall, cpu = time.perf_counter() - t0, cpu_s() - c0
    rows = Store(d / "results.sqlite").runs()
    assert len(rows) == len(sweep.runs) and all(r["status"] == "completed" for r in rows), rows
    shutil.rmtree(d)
    return wall / len(sweep.runs), cpu / len(sweep.runs)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="docs/benchmarks.md")
    p.add_argument("--runs", type=int, default=8)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    root = Path(tempfile.mkdtemp(prefix="sweep-overhead-"))
    os.environ.setdefault("NORMLAB_CACHE_DIR", str(root / "cache"))
    sweep = parse_sweep({"name": "overhead", "base": "tiny", "seeds": list(range(args.runs)),
                         "set": {"train.steps": args.steps, "train.eval_every": args.steps,
                                 "train.checkpoint_every": args.steps, "train.eval_batches": 2}})
    one("in process", sweep, root)  # builds the token cache, warms the disk cache
    res: dict[str, list[tuple[float, float]]] = {m: [] for m in MODES}
    for k in range(args.rounds):
        for mode in (MODES if k % 2 == 0 else MODES[::-1]):
            res[mode].append(one(mode, sweep, root))
            print(f"round {k + 1} {mode}: {res[mode][-1][0]:.2f} s wall, {res[mode][-1][1]:.2f} CPU-s per run",
                  file=sys.stderr)
    shutil.rmtree(root, ignore_errors=True)
    med = {m: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v)) for m, v in res.items()}
    base = med["process per run"]
    rows = [f"| {m} | {w:.2f} | {c:.2f} | {w / base[0]:.2f} | {c / base[1]:.2f} |" for m, (w, c) in med.items()]
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    body = "\n".join([
        "## Sweep runner overhead per run (`benchmarks/sweep_overhead.py`)", "",
        f"{args.runs} runs of the `tiny` preset, {args.steps} steps each "
        "(training itself is a fraction of a second, so "
        "this is the runner's cost per run), one worker, one torch thread; medians over "
        f"{args.rounds} alternating rounds. Written {_dt.datetime.now():%Y-%m-%d %H:%M} on "
        f"{platform.platform()}, {os.cpu_count()} cores, load average {load[0]:.2f} at the end" if load else "", "",
        "| mode | wall s / run | CPU s / run | wall vs process per run | CPU vs process per run |",
        "|---|---|---|---|---|", *rows, "",
        "`compare` and `claims --workers N` use persistent workers (one `import torch` per worker, not per run); "
        "`claims` with one worker trains in its own process. Command: `python benchmarks/sweep_overhead.py`.", ""])
    write_section(Path(args.out), "sweep_overhead", body)
    print(body)


if __name__ == "__main__":
    main()
