"""``normlab train --nproc N``: one run on N local processes (torchrun + DistributedDataParallel, docs/distributed.md).

The arguments and the run directory are checked here first (bad input is one line and exit 2 before any rank
starts); then torchrun's launcher, in this process, starts ``python -m normlab train ... --out RUN_DIR`` N times.
The exit status is the run's (0 completed, 3 diverged, 130 interrupted) read from the ``summary.json`` rank 0 wrote,
or torchrun's when no rank recorded one.
"""

from __future__ import annotations

import argparse
import time

from normlab.errors import NormlabError
from normlab.io import dumps


def rank_argv(args: argparse.Namespace, run_dir: str, resume: bool) -> list[str]:
    """The ``normlab`` arguments every rank gets (the same run, with its run directory spelled out)."""
    argv = ["train"]
    if resume:
        argv += ["--resume", run_dir]
        if args.config:
            argv.insert(1, args.config)
    else:
        argv += [args.config, "--out", run_dir]
        if args.init_from:
            argv += ["--init-from", args.init_from]
    for o in args.overrides:
        argv += ["--set", o]
    if args.json:
        argv.append("--json")
    return argv


def launch_train(args: argparse.Namespace) -> int:
    from normlab.commands.train import plan_run, print_summary
    from normlab.train.distributed import launch
    from normlab.rundir import STATUS_EXIT, read_summary

    if args.nproc < 1:
        raise NormlabError(f"--nproc must be >= 1, got {args.nproc}")
    cfg, run_dir, resume, done = plan_run(args)
    if done is not None:  # a complete run: nothing left to do
        print(dumps(done)) if args.json else print_summary(done)
        return STATUS_EXIT[done["status"]]
    if cfg.train.batch_size < args.nproc:
        raise NormlabError(f"--nproc {args.nproc} is more than train.batch_size ({cfg.train.batch_size}): every "
                           "process needs at least one row of the global batch")
    t0 = time.time()
    rc = launch(args.nproc, rank_argv(args, str(run_dir), resume))
    path = run_dir / "summary.json"
    if path.is_file() and path.stat().st_mtime >= t0 - 1:
        summary = read_summary(run_dir) or {}
        return STATUS_EXIT.get(summary.get("status"), rc or 1)
    return rc or 1
