"""Training progress display: a rich progress bar on a terminal, plain lines otherwise (both on stderr).

Without a terminal (a log file, a batch job, ``nohup``) every ``train.log_every`` steps print one line with the
elapsed time of this process and the time left at the rate seen so far: ``step 40/200 loss 3.1234 2,345 tok/s
elapsed 0:00:12 eta 0:00:48`` (eta = (total - step) * elapsed / (step - first step of this process))."""

from __future__ import annotations

import sys
import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from normlab.safety import printable


class ProgressReporter:
    """``update(step, loss, tok_s)`` every log step; ``message(text)`` for one-off lines. ``quiet`` disables all."""

    def __init__(self, total: int, start: int = 0, quiet: bool = False):
        self.quiet = quiet
        self.console = Console(stderr=True)
        self.live = not quiet and sys.stderr.isatty()
        self.total, self.start, self.t0 = total, start, time.time()
        self.progress = None
        if self.live:
            self.progress = Progress(
                TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(),
                TextColumn("loss {task.fields[loss]}"), TextColumn("{task.fields[tok_s]} tok/s"),
                TimeRemainingColumn(), console=self.console, transient=False,
            )
            self.task = self.progress.add_task("train", total=total, completed=start, loss="-", tok_s="-")
            self.progress.start()

    def update(self, step: int, loss: float, tok_s: float) -> None:
        if self.quiet:
            return
        if self.progress is not None:
            self.progress.update(self.task, completed=step, loss=f"{loss:.4f}", tok_s=f"{tok_s:,.0f}")
        else:
            elapsed = time.time() - self.t0
            done = step - self.start
            eta = _hms((self.total - step) * elapsed / done) if done > 0 else "?"
            print(f"step {step}/{self.total} loss {loss:.4f} {tok_s:,.0f} tok/s elapsed {_hms(elapsed)} eta {eta}",
                  file=sys.stderr, flush=True)

    def message(self, text: str) -> None:
        """One line on stderr; control characters of the text (a run directory's name) printed as escapes."""
        if self.quiet:
            return
        text = printable(text)
        if self.progress is not None:
            self.progress.console.print(text, markup=False)  # run dirs and names print literally
        else:
            print(text, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()


def _hms(seconds: float) -> str:
    """``H:MM:SS`` (rounded to the second)."""
    s = int(round(max(seconds, 0.0)))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"
