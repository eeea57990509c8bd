"""One sweep run in its own process: ``python -m normlab.experiments.worker SWEEP_DIR RUN_ID [--threads N]``.

The worker trains (or resumes) ``SWEEP_DIR/runs/RUN_ID`` with the config stored in the results store, then records
the result row and the per-step curves from ``metrics.jsonl``; the trainer writes TensorBoard scalars live to
``SWEEP_DIR/tb/RUN_ID`` (normlab.train.tracking).
A run whose ``summary.json`` already says completed/diverged is only (re-)recorded, not retrained.

Ctrl-C: the trainer's SIGINT handler checkpoints between steps and returns ``status: interrupted``; the worker
records it and exits 130. Once training has returned, SIGINT is ignored so the store write always completes.
Exit status: 0 completed, 3 diverged, 130 interrupted, 2 bad input (recorded as ``failed``), 1 unexpected error.
"""

from __future__ import annotations

import argparse
import math
import resource
import shutil
import signal
import sys
import traceback
from pathlib import Path
from typing import Any

from normlab.errors import EXIT_BAD_INPUT, EXIT_INTERRUPTED, NormlabError
from normlab.experiments.store import Store
from normlab.rundir import STATUS_EXIT, read_metrics


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def record(store: Store, sweep_dir: Path, run_id: str, summary: dict[str, Any], *, peak_mem_mb: float | None) -> None:
    """Write a run's result row and its curves (idempotent)."""
    run_dir = sweep_dir / "runs" / run_id
    curves = read_metrics(run_dir / "metrics.jsonl")
    result = {
        "status": summary.get("status", "failed"), "step": summary.get("step"), "steps": summary.get("steps"),
        "val_bpb": _num(summary.get("val_bpb")), "best_val_bpb": _num(summary.get("best_val_bpb")),
        "final_val_loss": _num(summary.get("val_loss")), "train_loss": _num(summary.get("train_loss")),
        "entropy_floor_bpb": _num(summary.get("entropy_floor_bpb")), "tokens_per_s": _num(summary.get("tokens_per_s")),
        "wall_s": _num(summary.get("elapsed_s")), "params": summary.get("params"), "peak_mem_mb": peak_mem_mb,
        "error": None,
    }
    if result["status"] == "completed" and result["val_bpb"] is None:  # never a completed row without its metric
        result["status"] = "failed"
        result["error"] = "summary.json has no final val_bpb (stopped between its last checkpoint and summary?); re-run"
    store.finish(run_id, result, curves)


def _peak_mem_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def train_run(run_dir: Path, config: dict[str, Any], threads: int | None = None,
              tb_dir: Path | None = None) -> dict[str, Any]:
    """Train ``config`` into ``run_dir``, or resume it when it holds a run; returns the summary (no store writes).
    ``tb_dir``: live TensorBoard scalars (default ``RUN_DIR/tb``)."""
    import torch

    from normlab.config import config_from_dict
    from normlab.rundir import open_config
    from normlab.train.loop import train

    if threads:
        torch.set_num_threads(threads)
    if (run_dir / "config.yaml").is_file():
        return train(open_config(run_dir), run_dir, resume=True, quiet=False, tb_dir=tb_dir)
    if run_dir.exists():  # a run that died before writing its config: start it afresh
        shutil.rmtree(run_dir)
    return train(config_from_dict(config), run_dir, resume=False, quiet=False, tb_dir=tb_dir)


def finished_summary(run_dir: Path) -> dict[str, Any] | None:
    """The summary of a run that needs no more training (completed with its model, or diverged), else None."""
    from normlab.rundir import read_summary

    try:
        summary = read_summary(run_dir) if run_dir.is_dir() else None
    except NormlabError:
        return None
    done = bool(summary) and (summary.get("status") == "diverged" or (
        summary.get("status") == "completed" and (run_dir / "model.safetensors").is_file()
        and summary.get("val_bpb") is not None))  # a completed summary without its metric is resumed (restored)
    return summary if done else None


def run_one(sweep_dir: Path, run_id: str, threads: int | None = None) -> int:
    """Train/resume and record one run; returns the exit status (see the module docstring)."""
    store = Store(sweep_dir / "results.sqlite")
    row = store.get(run_id)
    run_dir = sweep_dir / "runs" / run_id
    summary = finished_summary(run_dir)
    done = summary is not None
    store.start(run_id, calls_trainer=not done)
    try:
        if not done:
            summary = train_run(run_dir, row["config"], threads, tb_dir=sweep_dir / "tb" / run_id)
    except KeyboardInterrupt:  # SIGINT before the trainer's handler was installed, or a second Ctrl-C
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        store.update(run_id, status="interrupted", error="interrupted before a checkpoint could be taken")
        return EXIT_INTERRUPTED
    except NormlabError as e:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        store.update(run_id, status="failed", error=str(e))
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except Exception as e:  # noqa: BLE001 - recorded, the sweep goes on
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        traceback.print_exc()
        store.update(run_id, status="failed", error=f"{e.__class__.__name__}: {e}"[:500])
        return 1
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    peak = row.get("peak_mem_mb") if done and row.get("peak_mem_mb") else _peak_mem_mb()
    record(store, sweep_dir, run_id, summary or {}, peak_mem_mb=peak)
    return STATUS_EXIT.get(summary.get("status", ""), 1) if summary else 1


def _die_with_parent() -> None:
    """Linux: get SIGINT (checkpoint and stop) if the coordinating ``normlab compare`` dies without forwarding it."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGINT)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _run_lock(sweep_dir: Path, run_id: str):
    """An exclusive lock on ``logs/<run id>.lock``: two processes never train the same run directory."""
    import fcntl

    (sweep_dir / "logs").mkdir(exist_ok=True)
    f = open(sweep_dir / "logs" / f"{run_id}.lock", "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.close()
        raise NormlabError(f"run {run_id} is being trained by another process") from None
    return f


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m normlab.experiments.worker")
    p.add_argument("sweep_dir")
    p.add_argument("run_id")
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args(argv)
    _die_with_parent()
    try:
        lock = _run_lock(Path(args.sweep_dir), args.run_id)
        try:
            return run_one(Path(args.sweep_dir), args.run_id, args.threads)
        finally:
            lock.close()
    except NormlabError as e:  # the store itself failed (locked, missing), or the run is taken
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
