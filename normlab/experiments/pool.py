"""Persistent local sweep workers: ``python -m normlab.experiments.worker SWEEP_DIR --serve`` processes that each train
many runs one after another (``worker.serve``), instead of one process per run.

The runner writes a run id on a worker's stdin; the worker trains and records it (output in ``logs/<run id>.log``)
and answers ``<run id> <exit status>`` on a pipe of its own (its stdout/stderr between runs go to
``logs/workers.log``). A worker that dies while training a run (killed, crashed) leaves that run for the runner to
mark failed; the runner starts another worker for the runs still queued. Every worker starts in its own session, so
a terminal Ctrl-C reaches only the runner, which forwards it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path


class Worker:
    """One ``worker --serve`` process; ``run_id`` is the run it trains now (None: idle)."""

    def __init__(self, sweep_dir: Path, threads: int, env: dict[str, str]):
        r, w = os.pipe()
        self.logf = open(sweep_dir / "logs" / "workers.log", "ab")
        cmd = [sys.executable, "-m", "normlab.experiments.worker", str(sweep_dir), "--serve", "--threads", str(threads),
               "--results-fd", str(w)]
        try:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=self.logf, stderr=subprocess.STDOUT,
                                         env=env, start_new_session=True, pass_fds=(w,))
        finally:
            os.close(w)
        os.set_blocking(r, False)
        self.results, self.buf = r, b""
        self.run_id: str | None = None

    def assign(self, run_id: str) -> bool:
        """Send ``run_id`` to train; False when the worker is gone (the run stays unassigned)."""
        try:
            self.proc.stdin.write(f"{run_id}\n".encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            return False
        self.run_id = run_id
        return True

    def finished(self) -> tuple[str, int, bool] | None:
        """``(run id, exit status, worker died)`` once the current run is over, else None. A worker that exits
        without answering died during the run: its exit status is returned and the worker is unusable."""
        try:
            while True:
                chunk = os.read(self.results, 4096)
                if not chunk:
                    break
                self.buf += chunk
        except BlockingIOError:
            pass
        if b"\n" in self.buf:
            line, self.buf = self.buf.split(b"\n", 1)
            run_id, rc = line.decode().rsplit(" ", 1)
            self.run_id = None
            return run_id, int(rc), False
        rc = self.proc.poll()
        if rc is not None and self.run_id is not None:
            run_id, self.run_id = self.run_id, None
            return run_id, rc, True
        return None

    def alive(self) -> bool:
        return self.proc.poll() is None

    def interrupt(self, kill: bool = False) -> None:
        """Forward Ctrl-C to the run in training (SIGINT; SIGKILL with ``kill``); an idle worker is told to exit."""
        try:
            if kill:
                self.proc.kill()
            elif self.run_id is not None:
                self.proc.send_signal(signal.SIGINT)
            else:
                self.close_input()
        except ProcessLookupError:
            pass

    def close_input(self) -> None:
        try:
            self.proc.stdin.close()
        except OSError:
            pass

    def close(self, timeout: float = 60.0) -> None:
        """End of input, then wait for the worker to exit (killed after ``timeout`` seconds)."""
        self.close_input()
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self.results)
        self.logf.close()
