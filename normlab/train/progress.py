"""Training progress display: a rich progress bar on a terminal, plain lines otherwise (both on stderr)."""

from __future__ import annotations

import sys
import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn


class ProgressReporter:
    """``update(step, loss, tok_s)`` every log step; ``message(text)`` for one-off lines. ``quiet`` disables all."""

    def __init__(self, total: int, start: int = 0, quiet: bool = False):
        self.quiet = quiet
        self.console = Console(stderr=True)
        self.live = not quiet and sys.stderr.isatty()
        self.total, self.t0 = total, time.time()
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
            print(f"step {step}/{self.total} loss {loss:.4f} {tok_s:,.0f} tok/s", file=sys.stderr, flush=True)

    def message(self, text: str) -> None:
        if self.quiet:
            return
        if self.progress is not None:
            self.progress.console.print(text, markup=False)  # run dirs and names print literally
        else:
            print(text, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()
