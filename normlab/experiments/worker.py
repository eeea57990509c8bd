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
import contextlib
import math
import os
import resource
import shutil
import signal
import sys
import traceback
from pathlib import Path
from typing import Any, Iterator

from normlab.errors import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_INTERRUPTED, NormlabError
from normlab.interrupt import die_with_parent
from normlab.experiments.store import Store
from normlab.rundir.files import CONFIG_FILE, METRICS_FILE, MODEL_FILE, PROBES_FILE
from normlab.rundir.readers import STATUS_EXIT, open_config, read_metrics, read_summary
from normlab.io import disk_full, disk_full_note
from normlab.locks import exclusive_lock
from normlab.safety import os_error_line, printable


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def record(store: Store, sweep_dir: Path, run_id: str, summary: dict[str, Any], *, peak_mem_mb: float | None) -> None:
    """Write a run's result row and its curves (idempotent)."""
    run_dir = sweep_dir / "runs" / run_id
    curves = read_metrics(run_dir / METRICS_FILE)
    result = {
        "status": summary.get("status", "failed"), "step": summary.get("step"), "steps": summary.get("steps"),
        "val_bpb": _num(summary.get("val_bpb")), "best_val_bpb": _num(summary.get("best_val_bpb")),
        "final_val_loss": _num(summary.get("val_loss")), "train_loss": _num(summary.get("train_loss")),
        "entropy_floor_bpb": _num(summary.get("entropy_floor_bpb")), "tokens_per_s": _num(summary.get("tokens_per_s")),
        "wall_s": _num(summary.get("elapsed_s")), "params": summary.get("params"), "peak_mem_mb": peak_mem_mb,
        "error": summary.get("error"),  # a stacked group's failed member says why (normlab.train.stacked)
    }
    if result["status"] == "completed" and result["val_bpb"] is None:  # never a completed row without its metric
        result["status"] = "failed"
        result["error"] = "summary.json has no final val_bpb (stopped between its last checkpoint and summary?); re-run"
    store.finish(run_id, result, curves)


def probe_if_asked(run_dir: Path, config: dict[str, Any], summary: dict[str, Any] | None) -> None:
    """``diag.probes: true``: measure the in-context probes of a completed run once, into ``RUN/probes.json``
    (normlab.eval.probes.store_probes, ``normlab probe``'s defaults). A probe that fails leaves the run's result as
    it is (the traceback goes to the run's log)."""
    if not (summary and summary.get("status") == "completed" and (config.get("diag") or {}).get("probes")
            and not (run_dir / PROBES_FILE).is_file()):
        return
    try:
        from normlab.eval.probes import store_probes  # torch: only when asked

        store_probes(run_dir)
    except Exception:  # noqa: BLE001 - the run trained; its probes are missing, said in its log
        traceback.print_exc()


def _peak_mem_mb() -> float:
    """This process's peak resident memory since the last ``_reset_peak_mem`` (Linux ``VmHWM``), else since it
    started (``ru_maxrss``)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0  # kB
    except (OSError, ValueError, IndexError):
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def _reset_peak_mem() -> None:
    """Start a new peak-memory measurement (Linux: writing 5 to clear_refs resets VmHWM), so a worker that trains
    several runs records each run's own peak."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def train_run(run_dir: Path, config: dict[str, Any], threads: int | None = None,
              tb_dir: Path | None = None) -> dict[str, Any]:
    """Train ``config`` into ``run_dir``, or resume it when it holds a run; returns the summary (no store writes).
    ``tb_dir``: live TensorBoard scalars (default ``RUN_DIR/tb``)."""
    import torch

    from normlab.train.loop import train

    if threads:
        torch.set_num_threads(threads)
    cfg, resume = run_config(run_dir, config)
    # verbose: the run's log (logs/<run id>.log) keeps why each runtime choice was made
    return train(cfg, run_dir, resume=resume, quiet=False, tb_dir=tb_dir, threads=threads, verbose=True)


def train_group(run_dirs: list[Path], configs: list[dict[str, Any]], threads: int | None,
                tb_dirs: list[Path | None]) -> list[dict[str, Any]]:
    """Train ``configs`` into ``run_dirs`` as one stacked group (normlab.train.stacked.train_stacked), each member
    resumed when its directory holds a run (``tb_dirs``: live TensorBoard scalars, None: ``RUN_DIR/tb``); returns
    each member's summary (no store writes). The in-process stacked executor (``serve_group``) and a Ray task's
    trainer (normlab.experiments.executors) both train here."""
    from normlab.train.stacked import train_stacked  # torch: only where a group trains

    cfgs = [run_config(d, c)[0] for d, c in zip(run_dirs, configs)]
    return train_stacked(cfgs, run_dirs, resume=True, tb_dirs=tb_dirs, threads=threads)


def run_config(run_dir: Path, config: dict[str, Any]) -> tuple[Any, bool]:
    """``(RunConfig, resume)`` for training ``run_dir``: the config it holds (resumed), else ``config`` (the store's,
    a new run; a directory left by a run that died before writing its config is removed: it starts afresh)."""
    from normlab.config import stored_config  # torch: only where a run trains

    if (run_dir / CONFIG_FILE).is_file():
        return open_config(run_dir), True
    if run_dir.exists():
        shutil.rmtree(run_dir)
    return stored_config(config, f"sweep run {run_dir.name}"), False


def finished_summary(run_dir: Path) -> dict[str, Any] | None:
    """The summary of a run that needs no more training (completed with its model, or diverged), else None."""
    try:
        summary = read_summary(run_dir) if run_dir.is_dir() else None
    except NormlabError:
        return None
    done = bool(summary) and (summary.get("status") == "diverged" or (
        summary.get("status") == "completed" and (run_dir / MODEL_FILE).is_file()
        and summary.get("val_bpb") is not None))  # a completed summary without its metric is resumed (restored)
    return summary if done else None


def _shield() -> None:
    """Once training has returned, Ctrl-C must not interrupt the store write: Python's default handler (which
    raises) is replaced by SIG_IGN. A handler that only records the signal (the in-process runner's) stays."""
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, signal.SIG_IGN)


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
        _shield()
        store.update(run_id, status="interrupted", error="interrupted before a checkpoint could be taken")
        return EXIT_INTERRUPTED
    except NormlabError as e:
        _shield()
        store.update(run_id, status="failed", error=str(e))
        print(f"error: {printable(e)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except Exception as e:  # noqa: BLE001 - recorded, the sweep goes on
        _shield()
        full = disk_full(e)
        if full is not None:  # the sweep's command ends with the one disk-full line (disk_full_note read back)
            store.update(run_id, status="failed", error=disk_full_note(full))
            print(f"error: {printable(os_error_line(full))}", file=sys.stderr)
            return EXIT_BAD_INPUT
        traceback.print_exc()
        store.update(run_id, status="failed", error=f"{e.__class__.__name__}: {e}"[:500])
        return EXIT_FAILED
    _shield()
    peak = row.get("peak_mem_mb") if done and row.get("peak_mem_mb") else _peak_mem_mb()
    probe_if_asked(run_dir, row["config"], summary)
    record(store, sweep_dir, run_id, summary or {}, peak_mem_mb=peak)
    return STATUS_EXIT.get(summary.get("status", ""), EXIT_FAILED) if summary else EXIT_FAILED


def _run_lock(sweep_dir: Path, run_id: str) -> contextlib.AbstractContextManager[None]:
    """An exclusive lock on ``logs/<run id>.lock`` (locks.exclusive_lock): two processes never train the same run
    directory."""
    (sweep_dir / "logs").mkdir(exist_ok=True)
    return exclusive_lock(sweep_dir / "logs" / f"{run_id}.lock", f"run {run_id}")


def one_run(sweep_dir: Path, run_id: str, threads: int | None) -> int:
    """Lock, train/resume and record one run (``run_one``); a store failure or a taken run is exit status 2."""
    try:
        with _run_lock(sweep_dir, run_id):
            return run_one(sweep_dir, run_id, threads)
    except NormlabError as e:  # the store itself failed (locked, missing), or the run is taken
        print(f"error: {printable(e)}", file=sys.stderr)
        return EXIT_BAD_INPUT


def _fix_cublas_workspace() -> None:
    """This process may train several runs (a serving worker, the in-process runner): fix cuBLAS's workspace before
    the first (normlab.train.precision.fix_cublas_workspace)."""
    from normlab.train.precision import fix_cublas_workspace  # torch: only where runs train

    fix_cublas_workspace()


def _reset_compiler() -> None:
    """Forget torch.compile's caches before a run, as a fresh process would: Dynamo otherwise compiles a second model
    of another shape with dynamic dimensions and counts earlier runs' recompiles against its limit, so a run's compile
    time, speed and kernels would depend on what this worker trained before."""
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.compiler.reset()


def serve_one(sweep_dir: Path, run_id: str, threads: int | None, sigint: Any = signal.default_int_handler) -> int:
    """``one_run`` with this process's output (file descriptors 1 and 2) in ``logs/<run id>.log`` and its peak
    memory measured from the start of the run. ``sigint``: the SIGINT handler outside the trainer's own (default:
    Python's, which the previous run left ignored; the in-process runner passes one that records the signal)."""

    signal.signal(signal.SIGINT, sigint)
    _reset_peak_mem()
    _reset_compiler()
    _fix_cublas_workspace()
    with output_to(sweep_dir / "logs" / f"{run_id}.log"):
        try:
            return one_run(sweep_dir, run_id, threads)
        except KeyboardInterrupt:  # between run_one's store writes
            return EXIT_INTERRUPTED


@contextlib.contextmanager
def output_to(path: Path) -> Iterator[None]:
    """Point this process's stdout and stderr (file descriptors 1 and 2, so library and child output too) at
    ``path``, appended, for the block; the original descriptors are restored afterwards."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = (os.dup(1), os.dup(2))
    log = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])


def serve(sweep_dir: Path, threads: int | None, requests: Any, results: Any) -> int:
    """Train the runs whose ids arrive on ``requests`` (one per line) one after another in this process
    (``serve_one``), answering ``<run id> <exit status>`` on ``results`` after each; returns at end of input, or after
    an interrupted run (its answer sent). Saves the process start-up (``import torch``, first use: ~3 CPU-seconds
    on a loaded 2-core machine) that one process per run pays."""
    (sweep_dir / "logs").mkdir(exist_ok=True)
    while True:
        # a Ctrl-C the runner forwards right after sending the next run id must not be lost while this worker reads
        # it (the previous run left SIGINT ignored): from here on it raises KeyboardInterrupt, the run not started
        signal.signal(signal.SIGINT, signal.default_int_handler)
        line = requests.readline()
        if not line:
            break
        run_id = line.strip()
        if not run_id:
            continue
        rc = serve_one(sweep_dir, run_id, threads)
        results.write(f"{run_id} {rc}\n")
        results.flush()
        if rc == EXIT_INTERRUPTED:
            return rc
    return 0


STACK_CHOICES = ("auto", "on", "off")  # normlab compare --stack; train.stack


def plan_stacks(configs: dict[str, dict[str, Any]], stack: str | None,
                cuda: bool | None = None) -> tuple[list[list[str]], list[str], str]:
    """Which of the runs ``configs`` ({run id: config}) train stacked (normlab.train.stacked): ``(groups, alone,
    reason)``. ``stack``: ``--stack``, else each run's ``train.stack``. ``on`` stacks every group of two or more runs
    that can be stacked; ``auto`` does so where the runs' device is CUDA, and on a CPU not at all (it measured
    slower there, benchmarks/stack_speed.py: torch has no batching rule for CPU flash attention, which then runs
    member by member); ``off`` never. A group that cannot be stacked (dropout on CUDA, running-statistics norms)
    trains alone, with the reason in ``reason`` (judged for the device the group trains on). ``cuda``: whether a run
    of ``device: auto`` trains on CUDA where it trains (a Ray cluster's GPUs: normlab.experiments.executors); default:
    whether this machine has CUDA."""
    ids = list(configs)
    modes = {stack} if stack else {(configs[r].get("train") or {}).get("stack", "auto") for r in ids}
    gpu_here = cuda if cuda is not None else any(Path("/dev").glob("nvidia[0-9]*"))
    if modes <= {"off", False} or (modes <= {"auto"} and not gpu_here):
        why = "off" if modes <= {"off", False} else "auto: off on CPU (measured slower there)"
        return [], ids, f"stacking ({why}): every run alone"  # decided without importing torch
    import torch

    from normlab.config import stored_config
    from normlab.train.stackable import group_configs, stack_refusal

    cfgs = [stored_config(configs[r], f"sweep run {r}") for r in ids]
    has_cuda = cuda if cuda is not None else torch.cuda.is_available()
    groups, alone, notes = [], [], []
    for idx in group_configs(cfgs):
        first = cfgs[idx[0]]
        mode = stack or first.train.stack
        mode = {True: "on", False: "off"}.get(mode, mode)
        device = first.device if first.device != "auto" else ("cuda" if has_cuda else "cpu")
        why = stack_refusal(first, device) if len(idx) > 1 and mode != "off" else None
        if len(idx) > 1 and (mode == "on" or (mode == "auto" and device == "cuda")) and why is None:
            groups.append([ids[i] for i in idx])
        else:
            alone.extend(ids[i] for i in idx)
            if why:
                notes.append(f"{ids[idx[0]]} and {len(idx) - 1} more train alone: {why}")
    if stack == "auto" or (stack is None and all(c.train.stack == "auto" for c in cfgs)):
        head = "auto: " + ("a CUDA device" if has_cuda else "off on CPU (measured slower there)")
    else:
        head = stack or "train.stack"
    reason = f"stacking ({head}): {len(groups)} group(s) of {sum(map(len, groups))} runs stacked, {len(alone)} alone"
    return groups, alone, "; ".join([reason, *notes])


def serve_group(sweep_dir: Path, run_ids: list[str], threads: int | None) -> dict[str, int]:
    """Train (or resume) ``run_ids`` as one stacked group in this process (normlab.train.stacked) and record each,
    as ``run_one`` does for one run; returns ``{run id: exit status}``. The group's output goes to
    ``logs/<first run id>.log``; the other members' logs name it."""

    (sweep_dir / "logs").mkdir(exist_ok=True)
    _fix_cublas_workspace()
    store = Store(sweep_dir / "results.sqlite")
    with contextlib.ExitStack() as locks:
        for r in run_ids:
            locks.enter_context(_run_lock(sweep_dir, r))
        rows = {r: store.get(r) for r in run_ids}
        done = {r: s for r in run_ids if (s := finished_summary(sweep_dir / "runs" / r)) is not None}
        todo = [r for r in run_ids if r not in done]
        for r in run_ids:
            store.start(r, calls_trainer=r not in done)
        for r in todo[1:]:
            (sweep_dir / "logs" / f"{r}.log").write_text(f"trained in a stacked group; output in logs/{todo[0]}.log\n")
        summaries: dict[str, dict[str, Any]] = dict(done)
        codes: dict[str, int] = {}
        if todo:
            with output_to(sweep_dir / "logs" / f"{todo[0]}.log"):
                try:
                    out = train_group([sweep_dir / "runs" / r for r in todo], [rows[r]["config"] for r in todo],
                                      threads, [sweep_dir / "tb" / r for r in todo])
                    summaries.update(zip(todo, out))
                except KeyboardInterrupt:
                    _shield()
                    for r in todo:
                        store.update(r, status="interrupted", error="interrupted before a checkpoint could be taken")
                    return {r: EXIT_INTERRUPTED for r in run_ids}
                except NormlabError as e:
                    _shield()
                    print(f"error: {printable(e)}", file=sys.stderr)
                    for r in todo:
                        store.update(r, status="failed", error=str(e))
                    codes = {r: EXIT_BAD_INPUT for r in todo}
                except Exception as e:  # noqa: BLE001 - recorded, the sweep goes on
                    _shield()
                    traceback.print_exc()
                    for r in todo:
                        store.update(r, status="failed", error=f"{e.__class__.__name__}: {e}"[:500])
                    codes = {r: EXIT_FAILED for r in todo}
        _shield()
        peak = _peak_mem_mb()
        for r in run_ids:
            if r in codes:
                continue
            s = summaries.get(r) or {}
            probe_if_asked(sweep_dir / "runs" / r, rows[r]["config"], s)
            record(store, sweep_dir, r, s, peak_mem_mb=peak)  # the group's peak (one process trained them all)
            codes[r] = STATUS_EXIT.get(s.get("status", ""), EXIT_FAILED) if s else EXIT_FAILED
        return codes


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m normlab.experiments.worker")
    p.add_argument("sweep_dir")
    p.add_argument("run_id", nargs="?", help="the run to train; without it, --serve")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--serve", action="store_true", help="train the run ids read from stdin, one per line, answering "
                   "'<run id> <exit status>' on the file descriptor --results-fd")
    p.add_argument("--results-fd", type=int, default=None)
    args = p.parse_args(argv)
    bad = ("--serve needs --results-fd (the file descriptor to answer on)" if args.serve and args.results_fd is None
           else f"{args.sweep_dir} is not a sweep directory (no results.sqlite)"
           if not (Path(args.sweep_dir) / "results.sqlite").is_file() else None)
    if bad:  # one line, as every normlab command's bad input
        print(f"error: {printable(bad)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    die_with_parent(signal.SIGINT)  # the coordinating compare died without forwarding Ctrl-C: checkpoint, stop
    if args.serve:
        with os.fdopen(args.results_fd, "w") as results:
            try:
                return serve(Path(args.sweep_dir), args.threads, sys.stdin, results)
            except KeyboardInterrupt:  # Ctrl-C while waiting for the next run id
                return EXIT_INTERRUPTED
    if args.run_id is None:
        p.error("give a RUN_ID or --serve")
    return one_run(Path(args.sweep_dir), args.run_id, args.threads)


if __name__ == "__main__":
    sys.exit(main())
