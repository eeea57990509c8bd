"""``normlab train``: new runs and ``--resume``; with ``--nproc N``, one run on N local processes (torchrun +
DistributedDataParallel, docs/distributed.md).

``--nproc``: the arguments and the run directory are checked here first (bad input is one line and exit 2 before
any rank starts); then torchrun's launcher, in this process, starts ``python -m normlab train ... --out RUN_DIR`` N
times. The exit status is the run's (0 completed, 3 diverged, 130 interrupted) read from the ``summary.json`` rank 0
wrote, or torchrun's when no rank recorded one.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from normlab.errors import NormlabError
from normlab.io import dumps
from normlab.names import SAMPLED_VAL_BPB
from normlab.presets import config_presets
from normlab.rundir.files import CONFIG_FILE, MODEL_FILE, SUMMARY_FILE
from normlab.rundir.readers import STATUS_EXIT, open_config, read_summary
from normlab.safety import printable, shell_quote
from normlab.stats.learning import DID_NOT_LEARN_MARGIN, did_not_learn
from normlab.validate import int_in

if TYPE_CHECKING:
    from normlab.config import RunConfig


TEMP_NAME = re.compile(r"^\..+\.[A-Za-z0-9_]{8}\.tmp$")  # normlab.io.atomic_path's .NAME.XXXXXXXX.tmp


def leftover_temps(run_dir: Path) -> list[Path]:
    """The entries of ``run_dir`` when every one is a temporary file of normlab's atomic writes (what a kill -9
    during a new run's first write, config.yaml, leaves behind), else an empty list."""
    if not run_dir.is_dir() or (run_dir / CONFIG_FILE).exists():
        return []
    entries = list(run_dir.iterdir())
    if entries and all(TEMP_NAME.match(p.name) and p.is_file() and not p.is_symlink() for p in entries):
        return sorted(entries)
    return []


def _diff_keys(a: dict, b: dict, prefix: str = "") -> list[str]:
    keys = []
    for k in sorted(set(a) | set(b)):
        va, vb = a.get(k), b.get(k)
        if isinstance(va, dict) and isinstance(vb, dict):
            keys += _diff_keys(va, vb, f"{prefix}{k}.")
        elif va != vb:
            keys.append(f"{prefix}{k}")
    return keys


def _resume_config(args: argparse.Namespace) -> tuple[RunConfig, Path]:
    from normlab.config import load_config  # torch: not loaded by `normlab --help`

    run_dir = Path(args.resume)
    temps = leftover_temps(run_dir)
    if temps:
        raise NormlabError(f"{run_dir} holds only temporary files ({', '.join(p.name for p in temps)}): a run killed "
                           "while it wrote its config.yaml, before anything was trained; start it again with "
                           f"'normlab train CONFIG --out {shell_quote(run_dir)}' (which removes them)")
    saved = open_config(run_dir)
    if args.config or args.overrides:
        # the config handed over, or the run's own config.yaml with --set, built as a new run's config is
        base = load_config(args.config or run_dir / CONFIG_FILE, args.overrides)
        from normlab.train.resolve import resumed

        resumed(base, saved)  # completed as the run's config.yaml was
        changed = _diff_keys(saved.to_dict(), base.to_dict())
        if changed:
            raise NormlabError(
                f"--resume {run_dir}: config differs from the run's config.yaml in {', '.join(changed)}; "
                "resume with the same config or start a new run with --out"
            )
    return saved, run_dir


def run_train(args: argparse.Namespace) -> int:
    from normlab.train.distributed import from_env

    if args.nproc is not None:
        return launch_train(args)
    ctx = from_env()  # a torchrun rank joins its process group; one process otherwise
    try:
        return _run_train(args, ctx)
    finally:
        ctx.close()


def plan_run(args: argparse.Namespace) -> tuple[RunConfig, Path, bool, dict | None]:
    """Check the arguments and the run directory: ``(config, run_dir, resume, summary)``, where ``summary`` is the
    stored summary of a run that is already complete (nothing left to train), else None."""
    from normlab.config import load_config

    if args.resume:
        if args.init_from:
            raise NormlabError("--init-from cannot be combined with --resume (a resumed run reloads its own source)")
        if args.out:
            raise NormlabError("--out cannot be combined with --resume (the run directory is RUN_DIR)")
        cfg, run_dir = _resume_config(args)
        summary = read_summary(run_dir)
        done = summary and summary.get("status") == "completed" and (run_dir / MODEL_FILE).is_file()
        return cfg, run_dir, True, summary if done else None
    if not args.config:
        raise NormlabError(f"train needs a CONFIG (YAML file or preset: {', '.join(config_presets())}) "
                           "or --resume RUN_DIR")
    cfg = load_config(args.config, args.overrides)  # completed by what needs no data or machine
    if args.init_from:  # checked here, before any rank starts or anything is written (train --nproc too)
        from normlab.train.init_from import check_source

        check_source(args.init_from, cfg)
    run_dir = Path(args.out) if args.out else Path("runs") / f"{Path(args.config).stem}-{cfg.hash()[:8]}"
    if run_dir.exists() and not run_dir.is_dir():
        raise NormlabError(f"--out {run_dir} is a file, not a directory; choose a new directory")
    if (run_dir / CONFIG_FILE).exists():
        raise NormlabError(f"{run_dir} already holds a run; use --resume {run_dir} or choose another --out")
    temps = leftover_temps(run_dir)
    if temps:  # a start killed while it wrote config.yaml: nothing was trained, the directory is free again
        for p in temps:
            p.unlink(missing_ok=True)

        print(printable(f"note: --out {run_dir} held only the temporary files of a killed start "
                        f"({', '.join(p.name for p in temps)}); removed them"), file=sys.stderr)
    if run_dir.exists() and any(run_dir.iterdir()):
        raise NormlabError(f"--out {run_dir} exists and is not empty; choose a new directory")
    return cfg, run_dir, False, None


def _run_train(args: argparse.Namespace, ctx) -> int:
    from normlab.train.loop import train

    cfg, run_dir, resume, summary = plan_run(args)
    if summary is None:  # (a complete run: nothing left to do; report the stored summary)
        ctx.barrier()  # every rank has checked the run directory before rank 0 writes to it
        summary = train(cfg, run_dir, resume=resume, quiet=False, dist=ctx, verbose=args.verbose,
                        init_from=None if resume else args.init_from)
    if not ctx.is_main:
        return STATUS_EXIT[summary["status"]]
    if args.json:
        print(dumps(summary))
    else:
        print_summary(summary)
    return STATUS_EXIT[summary["status"]]


def print_summary(s: dict) -> None:
    parts = [f"status {s['status']} at step {s['step']}/{s['steps']}"]
    if s.get("val_bpb") is not None:
        sample = (f" on {s['val_sample_tokens']:,} validation tokens" if isinstance(s.get("val_sample_tokens"), int)
                  else "")
        parts.append(f"val loss {s['val_loss']:.4f} nats/token, {SAMPLED_VAL_BPB} {s['val_bpb']:.4f}{sample} "
                     "('normlab eval RUN_DIR' scores the whole split)")
        if s.get("unigram_bpb") is not None:  # the one did-not-learn rule (normlab.stats.learning), flagged here too
            flag = (f" -- DID NOT LEARN (not below the unigram level - {DID_NOT_LEARN_MARGIN:g})"
                    if did_not_learn(s["val_bpb"], s["unigram_bpb"]) else "")
            parts.append(f"unigram level {s['unigram_bpb']:.4f} bits/byte{flag}")
    if s.get("gap_bpb") is not None:
        parts.append(f"entropy floor {s['entropy_floor_bpb']:.4f} bits/byte, gap {s['gap_bpb']:.4f}")
    parts.append(f"{s['tokens_per_s']:,.0f} tokens/s, {s['elapsed_s']:.1f}s")
    if s.get("precision"):
        parts.append(
            f"{s['device']} {s['precision']}" + (f", compiled in {s['compile_s']:.1f}s" if s.get("compile_s") else "")
        )

    print(printable(f"run {s['run_dir']}: " + "; ".join(parts)))  # a stored status or a directory name: escaped


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
    if getattr(args, "verbose", False):
        argv.append("--verbose")
    return argv


def launch_train(args: argparse.Namespace) -> int:
    from normlab.train.distributed import launch

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
    path = run_dir / SUMMARY_FILE
    if path.is_file() and path.stat().st_mtime >= t0 - 1:
        summary = read_summary(run_dir) or {}
        return STATUS_EXIT.get(summary.get("status"), rc or 1)
    return rc or 1


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``normlab train`` with their flags (called by ``normlab.cli.build_parser``)."""
    t = sub.add_parser("train", help="train a model from a YAML config or preset")
    t.add_argument("config", nargs="?",
                   help=f"YAML file or preset name (shipped in normlab/configs/: {', '.join(config_presets())})")
    t.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key, e.g. --set model.norm=rmsnorm (repeatable)")
    t.add_argument("--out", help="run directory (default: runs/<config>-<hash>)")
    t.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its last checkpoint")
    t.add_argument("--init-from", metavar="RUN_DIR",
                   help="start from RUN_DIR's weights (fine-tune / continue with a changed config of equal shapes)")
    t.add_argument("--nproc", type=int_in(1, 4096), metavar="N",
                   help="data-parallel on N local processes (torchrun + DDP; docs/distributed.md)")
    t.add_argument("--verbose", action="store_true",
                   help="also print why each runtime choice was made (device, precision, compile, threads, OpenMP, "
                   "malloc), the weight-decay groups and the keys away from their defaults (the reasons are in "
                   "summary.json's runtime_notes either way)")
    t.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    t.set_defaults(func=run_train)
