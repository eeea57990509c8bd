"""Progress of a sweep between run completions: every ``NORMLAB_PROGRESS_EVERY`` seconds (default 30; 0 turns it
off) ``normlab compare`` prints one line per running run with its step, the rate since it started, an ETA and where
its log is. The step is the last record of the run's ``metrics.jsonl`` (written by the worker as it trains)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from normlab.errors import NormlabError
from normlab.rundir.files import METRICS_FILE
from normlab.rundir.readers import last_step, read_summary
from normlab.stats.learning import learning_note
from normlab.validate import env_value

DEFAULT_EVERY_S = 30.0


def stopping_message(running: int) -> str:
    """What a sweep says on the first Ctrl-C / SIGTERM (local and Ray executors)."""
    return (f"stopping: {running} running run(s) checkpoint and stop; re-run the same command to resume "
            "(Ctrl-C again to stop without waiting for checkpoints)")


def describe_row(row: dict[str, Any], unigram_bpb: float | None = None) -> str:
    """One finished row of the store as the runner logs it: status, sampled val bits/byte, speed and wall time; a
    run that did not learn (normlab.stats.learning, against the training split's ``unigram_bpb``) says so beside its
    number."""
    st = row["status"]
    if st == "completed":
        val = f"{row['val_bpb']:.4f}" if isinstance(row.get("val_bpb"), (int, float)) else "n/a"
        note = learning_note(row.get("val_bpb"), unigram_bpb)
        return (f"completed, sampled val {val} bits/byte{f' -- {note}' if note else ''}, "
                f"{row.get('tokens_per_s') or 0:,.0f} tok/s, {row.get('wall_s') or 0:.0f}s")
    if st == "diverged":
        return f"diverged at step {row['step']}"
    if st == "interrupted":
        return f"interrupted at step {row['step'] or 0} (resumable)"
    return f"{st}: {row.get('error') or ''}".strip()


def run_unigram(sweep_dir: Path, run_id: str) -> float | None:
    """The unigram bits/byte a finished run of the sweep recorded in its ``summary.json`` (None when it has none,
    or the file cannot be read: the log line then carries no did-not-learn flag)."""
    try:
        summary = read_summary(sweep_dir / "runs" / run_id)
    except NormlabError:
        return None
    u = (summary or {}).get("unigram_bpb")
    return float(u) if isinstance(u, (int, float)) and not isinstance(u, bool) else None


def report_every() -> float:
    return env_value("NORMLAB_PROGRESS_EVERY", DEFAULT_EVERY_S)  # a bad value: one line (normlab.validate)


def eta_s(step: int, steps: int, first_step: int, elapsed_s: float) -> float | None:
    """Seconds left at the rate observed since this process saw ``first_step``: ``(steps - step) * elapsed /
    (step - first_step)``; None before any progress."""
    done = step - first_step
    return (steps - step) * elapsed_s / done if done > 0 and elapsed_s > 0 else None


def _fmt_s(s: float) -> str:
    s = int(round(s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else (f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s")


def sweep_eta_s(done: int, total: int, elapsed_s: float) -> float | None:
    """Seconds until the sweep's ``total`` runs are done at the rate its first ``done`` finished runs took (runs per
    second over the whole sweep, so parallel workers count): ``(total - done) * elapsed / done``; None before the
    first run finished."""
    return (total - done) * elapsed_s / done if done > 0 and elapsed_s > 0 else None


class SweepProgress:
    """``started(run_id, steps)`` when a worker starts, ``tick(running_ids)`` in the wait loop (prints at most
    every ``every`` seconds: the sweep's runs done and its ETA, then one line per running run), ``finished(run_id)``;
    ``total`` runs to train, ``sweep_line(done)`` the sweep's own progress."""

    def __init__(self, sweep_dir: Path, log, every: float | None = None, total: int = 0):
        self.sweep_dir, self.log = sweep_dir, log
        self.every = report_every() if every is None else every
        self.runs: dict[str, dict] = {}
        self.last = self.t0 = time.monotonic()
        self.total, self.done = total, 0

    @contextmanager
    def bar(self, console: Any = None) -> Iterator[None]:
        """On a terminal (stderr), a rich progress bar of the sweep's runs for the ``with`` block: runs done of
        ``total``, elapsed, and the ETA once the first run finished (``sweep_eta_s``); log lines print above it.
        Off a terminal, nothing (the lines above carry the same)."""
        console = console or Console(stderr=True)
        if not console.is_terminal or not self.total:
            yield
            return
        with Progress(TextColumn("sweep"), BarColumn(), MofNCompleteColumn(), TextColumn("runs"),
                      TimeElapsedColumn(), TextColumn("{task.fields[eta]}"), console=console) as p:
            self._bar = (p, p.add_task("sweep", total=self.total, eta="ETA after the first run finishes"))
            try:
                yield
            finally:
                self._bar = None

    def sweep_line(self, done: int) -> str:
        """``sweep: k/N runs done, ETA ...`` (the ETA once the first run finished); advances the bar."""
        self.done = done
        eta = sweep_eta_s(done, self.total, time.monotonic() - self.t0)
        if getattr(self, "_bar", None) is not None:
            self._bar[0].update(self._bar[1], completed=done,
                                eta=f"ETA {_fmt_s(eta)}" if eta is not None else "ETA after the first run finishes")
        return (f"sweep: {done}/{self.total} runs done, {_fmt_s(time.monotonic() - self.t0)} elapsed, "
                + (f"ETA {_fmt_s(eta)}" if eta is not None else "ETA after the first run finishes"))

    def _step(self, run_id: str) -> int | None:
        """The run's last recorded step (its ``metrics.jsonl``), None before the first."""
        return last_step(self.sweep_dir / "runs" / run_id / METRICS_FILE)

    def started(self, run_id: str, steps: int) -> None:
        first = self._step(run_id) or 0  # resumed runs start later
        self.runs[run_id] = {"steps": steps, "first": first, "t0": time.monotonic(), "t_first": None}

    def finished(self, run_id: str) -> None:
        self.runs.pop(run_id, None)

    def line(self, run_id: str) -> str:
        r = self.runs[run_id]
        logf = self.sweep_dir / "logs" / f"{run_id}.log"
        step = self._step(run_id)
        if step is None:
            return f"  {run_id}: starting ({_fmt_s(time.monotonic() - r['t0'])}; log: {logf})"
        if r["t_first"] is None or step <= r["first"]:  # rate measured from the first step this process saw
            r["t_first"], r["first"] = time.monotonic(), step
        eta = eta_s(step, r["steps"], r["first"], time.monotonic() - r["t_first"])
        return (f"  {run_id}: step {step}/{r['steps']}, ETA {_fmt_s(eta) if eta is not None else 'n/a'} "
                f"(log: {logf})")

    def tick(self, running: list[str]) -> None:
        if not self.every or not running or time.monotonic() - self.last < self.every:
            return
        self.last = time.monotonic()
        if self.total:
            self.log(self.sweep_line(self.done))
        for run_id in running:
            if run_id in self.runs:
                self.log(self.line(run_id))
