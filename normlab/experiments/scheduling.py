"""The one scheduling loop of a sweep (``drive``) and the executors that train its runs on this machine.

An executor trains *jobs*: a job is one run id, or a stacked group's run ids (normlab.train.stacked). It implements
``Executor``: ``start`` a job while ``in_flight() < slots``, report ``finished()`` runs as ``(run id, exit status)``,
``interrupt(n)`` on the n-th SIGINT/SIGTERM, ``wait()`` between polls and ``close()``. ``drive`` is the rest, the same
for every executor: the queue, the one signal handler (``normlab.interrupt``), the finish step (a row the trainer
left ``running`` / ``pending`` is recorded ``interrupted`` or ``failed`` with the exit status), the ``[k/N] RUN_ID:
...`` log line and the stop rule (after a signal no job starts; the jobs in flight finish). Implementations:

- ``Processes``: persistent worker processes (``normlab.experiments.pool``), ``slots`` of them, one run each at a
  time; a signal is forwarded to them (the first: checkpoint and stop; the second: stop at once; the third: kill).
- ``Inline``: one run after another in this process (``worker.serve_one``; no process start-up per run).
- ``Stacked``: one stacked group after another in this process (``worker.serve_group``).
- ``RayTasks`` (normlab.experiments.executors): one Ray task per job (a run, or a stacked group) on a cluster.

In this process (``Inline``, ``Stacked``) the trainer's own handler takes a signal during training (it checkpoints
and returns ``interrupted``); the loop's handler takes one between runs. Either way no further job starts.
"""

from __future__ import annotations

import os
import signal
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from normlab.errors import EXIT_FAILED, EXIT_INTERRUPTED, NormlabError
from normlab.experiments.pool import Worker
from normlab.experiments.progress import SweepProgress, describe_row, run_unigram, stopping_message
from normlab.experiments.store import Store
from normlab.experiments.worker import serve_group, serve_one
from normlab.interrupt import StopFlag, handle_signals

Handler = Callable[[int, Any], None]


class Executor(Protocol):
    """Where a sweep's jobs train (module docstring). ``in_process``: the jobs train in this process, so a run that
    ended ``interrupted`` means this process got the signal (its trainer took it): the sweep stops. ``announces``:
    the first signal logs ``stopping_message`` (the runs in flight go on to their checkpoints). ``tag``: after the
    count in the log line (`` stacked``); ``exited``: how the finish step names a trainer that left its row open."""

    slots: int
    in_process: bool
    announces: bool
    tag: str
    exited: str

    def start(self, job: list[str], on_signal: Handler) -> bool: ...
    def finished(self) -> list[tuple[str, int | None]]: ...
    def in_flight(self) -> int: ...
    def interrupt(self, signals: int) -> None: ...
    def wait(self) -> None: ...
    def close(self) -> None: ...
    def log_of(self, run_id: str) -> Path: ...
    def progress_line(self, done: int) -> str: ...


def drive(executor: Executor, store: Store, jobs: list[list[str]], log: Callable[[str], None],
          trained: list[str]) -> str:
    """Train ``jobs`` with ``executor`` (module docstring); the run ids started are appended to ``trained``.
    Returns ``completed`` (nothing left) or ``interrupted``."""
    total = sum(map(len, jobs))
    queue = deque(jobs)
    done = 0
    flag = StopFlag(repeat="count")

    def on_signal(signum: int, frame: Any) -> None:
        flag(signum, frame)
        if flag.signals == 1 and executor.announces:
            log(stopping_message(executor.in_flight()))
        executor.interrupt(flag.signals)

    with handle_signals(on_signal):
        try:
            while executor.in_flight() or (queue and not flag.stop):
                while queue and not flag.stop and executor.in_flight() < executor.slots:
                    if not executor.start(queue[0], on_signal):
                        break
                    trained.extend(queue.popleft())
                for run_id, rc in executor.finished():
                    row = store.get(run_id)
                    if row["status"] in ("running", "pending"):  # the trainer stopped without recording
                        status = "interrupted" if rc == EXIT_INTERRUPTED or flag.stop else "failed"
                        store.update(run_id, status=status, error=f"{executor.exited} with status {rc}; "
                                                                  f"see logs/{executor.log_of(run_id).name}")
                        row = store.get(run_id)
                    # an interrupted run is not done: it resumes on the next run of the command
                    counted = row["status"] != "interrupted"
                    done += counted
                    unigram = run_unigram(store.path.parent, run_id) if row["status"] == "completed" else None
                    log(f"[{done if counted else '–'}/{total}{executor.tag}] {run_id}: {describe_row(row, unigram)}"
                        + (f" (log: {executor.log_of(run_id)})" if row["status"] == "failed" else "")
                        + executor.progress_line(done))
                    if executor.in_process and row["status"] == "interrupted":
                        flag.stop = True
                if executor.in_flight():
                    executor.wait()
        finally:
            executor.close()
    return "interrupted" if flag.stop else "completed"


def worker_env(threads: int) -> dict[str, str]:
    """The environment of a worker process: this package first on ``PYTHONPATH``, ``threads`` OpenMP/MKL threads."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update({"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1"})
    return env


class _InProcess:
    """What ``Inline`` and ``Stacked`` share: a job trains inside ``start``; its runs are reported next poll."""

    in_process, announces, exited = True, False, "exited"

    def __init__(self, sweep_dir: Path, threads: int, log: Callable[[str], None]):
        self.sweep_dir, self.threads, self.log = sweep_dir, threads, log
        self.slots = 1
        self.ready: list[tuple[str, int | None]] = []
        (sweep_dir / "logs").mkdir(exist_ok=True)

    def finished(self) -> list[tuple[str, int | None]]:
        out, self.ready = self.ready, []
        return out

    def in_flight(self) -> int:
        return len(self.ready)

    def interrupt(self, signals: int) -> None:
        """Nothing to forward: during training the trainer's own handler has the signal."""

    def wait(self) -> None:
        """Nothing runs between polls."""

    def close(self) -> None:
        """Nothing to stop."""

    def log_of(self, run_id: str) -> Path:
        return self.sweep_dir / "logs" / f"{run_id}.log"

    def progress_line(self, done: int) -> str:
        return ""


class Inline(_InProcess):
    """One run after another in this process (``worker.serve_one``: its output in ``logs/<run id>.log``), for many
    tiny runs whose process start-up (~3 s: docs/benchmarks.md, sweep overhead) would dominate."""

    tag = ""

    def start(self, job: list[str], on_signal: Handler) -> bool:
        (run_id,) = job
        with handle_signals(on_signal, (signal.SIGINT,)):  # and back after it, whatever the run left
            self.ready.append((run_id, serve_one(self.sweep_dir, run_id, self.threads, sigint=on_signal)))
        return True


class Stacked(_InProcess):
    """Each group trains as one stacked model in this process (``worker.serve_group``: output in ``logs/<first run
    id>.log``, which the other members' logs name), one group after another."""

    tag = " stacked"

    def __init__(self, sweep_dir: Path, threads: int, log: Callable[[str], None]):
        super().__init__(sweep_dir, threads, log)
        self.group_of: dict[str, str] = {}

    def start(self, job: list[str], on_signal: Handler) -> bool:
        self.group_of.update({r: job[0] for r in job})
        with handle_signals(signal.default_int_handler, (signal.SIGINT,)):  # the trainer installs its own
            try:
                codes = serve_group(self.sweep_dir, job, self.threads)
            except NormlabError as e:  # a run of the group is being trained by another process
                self.log(f"stacked group {job[0]} ...: {e}")
                codes = {r: EXIT_FAILED for r in job}
        self.ready.extend((r, codes.get(r)) for r in job)
        return True

    def log_of(self, run_id: str) -> Path:
        return self.sweep_dir / "logs" / f"{self.group_of.get(run_id, run_id)}.log"


class Processes:
    """``slots`` persistent worker processes (normlab.experiments.pool), each training one run at a time with
    ``threads`` torch threads. A worker that died idle is replaced; one whose run ended with an unexpected error
    (exit status 1) is closed, since the error may leave the process unfit (a poisoned CUDA context, a fragmented
    allocator): the next run gets a new one. The sweep's progress (a bar on a terminal, a line per running run every
    ``NORMLAB_PROGRESS_EVERY`` seconds) comes with it."""

    in_process, announces, tag, exited = False, True, "", "worker exited"

    def __init__(self, sweep_dir: Path, slots: int, threads: int, log: Callable[[str], None], store: Store,
                 total: int):
        self.sweep_dir, self.slots, self.threads, self.store = sweep_dir, slots, threads, store
        self.workers: list[Worker] = []
        (sweep_dir / "logs").mkdir(exist_ok=True)
        self.env = worker_env(threads)
        self.progress = SweepProgress(sweep_dir, log, total=total)  # sweep ETA; per-run step / ETA / log path
        log(f"worker logs: {sweep_dir / 'logs'}/<run id>.log")
        self._bar = self.progress.bar()  # a progress bar of the sweep's runs on a terminal; nothing otherwise
        self._bar.__enter__()

    def _busy(self) -> list[Worker]:
        return [w for w in self.workers if w.run_id is not None]

    def in_flight(self) -> int:
        return len(self._busy())

    def start(self, job: list[str], on_signal: Handler) -> bool:
        (run_id,) = job
        while True:
            idle = next((w for w in self.workers if w.run_id is None and w.alive()), None)
            if idle is None and sum(w.alive() for w in self.workers) >= self.slots:
                return False
            if idle is None:
                idle = Worker(self.sweep_dir, self.threads, self.env)
                self.workers.append(idle)
            if idle.assign(run_id):  # else it died idle: another worker takes the run
                break
        steps = int((self.store.get(run_id).get("config") or {}).get("train", {}).get("steps", 0))
        self.progress.started(run_id, steps)
        return True

    def finished(self) -> list[tuple[str, int | None]]:
        out = []
        for w in list(self.workers):
            if w.run_id is None:
                if not w.alive():
                    w.close()
                    self.workers.remove(w)
                continue
            end = w.finished()
            if end is None:
                continue
            run_id, rc, died = end
            self.progress.finished(run_id)
            out.append((run_id, rc))
            if rc == EXIT_FAILED and not died:
                w.close()
                self.workers.remove(w)
        return out

    def interrupt(self, signals: int) -> None:
        for w in self.workers:
            w.interrupt(kill=signals >= 3)

    def wait(self) -> None:
        self.progress.tick([w.run_id for w in self._busy()])
        time.sleep(0.2)

    def close(self) -> None:
        self._bar.__exit__(None, None, None)
        for w in self.workers:
            w.close()

    def log_of(self, run_id: str) -> Path:
        return self.sweep_dir / "logs" / f"{run_id}.log"

    def progress_line(self, done: int) -> str:
        return f"; {self.progress.sweep_line(done).removeprefix('sweep: ')}"
