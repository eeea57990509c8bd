"""A command's progress through its stages on stderr (``normlab export``, ``quantize``, ``claims``), for a person
at a terminal only.

On a terminal (``stages_visible``: stderr is a TTY) each stage prints one line, ``what [i/N] stage (elapsed)``,
above a rich progress bar of the stages done, the time elapsed and, once the first stage finished, the ETA (the
remaining stages at the mean time of the finished ones: ``normlab.experiments.progress.sweep_eta_s``). Piped or
redirected, nothing is printed, so that a refused input stays the one line on stderr that scripts and logs read.
The bar starts with the first stage, so a command whose earlier part draws its own bar (the claims' training
sweep) shows one bar at a time.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from normlab.experiments.progress import _fmt_s, sweep_eta_s


def stages_visible() -> bool:
    """Whether stage lines and the bar are shown: stderr is a terminal."""
    return sys.stderr.isatty()


class StageProgress:
    """``with StageProgress("export", 5) as say: say("loading the run"); ...``: ``say(stage)`` as each of ``total``
    stages starts (a ``progress`` callback of normlab.interop.export / normlab.surgery.run_quantize); the ``with``
    block's end finishes the bar (all stages done, unless it raised). ``unit``: what a stage is called in the ETA
    text; ``console``: where to draw (default: stderr)."""

    def __init__(self, what: str, total: int, *, unit: str = "stage", console: Console | None = None):
        self.what, self.total, self.unit = what, total, unit
        self.visible = stages_visible()
        self.console = console
        self.n = 0
        self.t0 = time.monotonic()
        self._bar: tuple[Progress, Any] | None = None

    def __enter__(self) -> "StageProgress":
        return self

    def __exit__(self, exc_type: Any, *_: Any) -> None:
        if self._bar is not None:
            p, task = self._bar
            if exc_type is None:
                p.update(task, completed=self.total, eta="done", description="")
            p.stop()
            self._bar = None

    def eta_text(self, done: int) -> str:
        eta = sweep_eta_s(done, self.total, time.monotonic() - self.t0)
        return f"ETA {_fmt_s(eta)}" if eta is not None else f"ETA after the first {self.unit} finishes"

    def _start(self) -> None:
        console = self.console or Console(file=sys.stderr)
        if not console.is_terminal:  # stderr claims a terminal but rich cannot draw there: the lines alone
            self.console = console
            return
        p = Progress(TextColumn(self.what), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                     TextColumn("{task.fields[eta]}"), TextColumn("{task.description}"), console=console,
                     transient=True)
        p.start()
        self._bar = (p, p.add_task("", total=self.total, eta=self.eta_text(0)))
        self.console = console

    def __call__(self, stage: str) -> None:
        if not self.visible:
            return
        if self.n == 0:
            self._start()
        self.n += 1
        assert self.console is not None
        self.console.print(f"{self.what} [{self.n}/{self.total}] {stage} ({time.monotonic() - self.t0:.1f}s)",
                           markup=False, highlight=False, soft_wrap=True)
        if self._bar is not None:
            p, task = self._bar
            p.update(task, completed=self.n - 1, eta=self.eta_text(self.n - 1), description=stage)


class CountProgress:
    """``with CountProgress("eval", "tokens") as tick: evaluate(..., progress=tick)``: a bar of ``done / total``
    units with the time elapsed and an ETA, on stderr when it is a terminal (``stages_visible``), redrawn at most
    every ``REDRAW_S`` seconds; nothing otherwise (stdout, ``--json`` included, is never touched)."""

    REDRAW_S = 0.2

    def __init__(self, what: str, unit: str, *, console: Console | None = None):
        self.what, self.unit, self.console = what, unit, console
        self.visible = stages_visible()
        self.t0 = self.last = time.monotonic()
        self._bar: tuple[Progress, Any] | None = None

    def __enter__(self) -> "CountProgress":
        return self

    def __exit__(self, *_: Any) -> None:
        if self._bar is not None:
            self._bar[0].stop()
            self._bar = None

    def eta_text(self, done: int, total: int) -> str:
        eta = sweep_eta_s(done, total, time.monotonic() - self.t0)
        return f"ETA {_fmt_s(eta)}" if eta is not None else ""

    def __call__(self, done: int, total: int) -> None:
        if not self.visible:
            return
        now = time.monotonic()
        if self._bar is None:
            console = self.console or Console(file=sys.stderr)
            if not console.is_terminal:
                self.visible = False
                return
            p = Progress(TextColumn(self.what), BarColumn(), MofNCompleteColumn(), TextColumn(self.unit),
                         TimeElapsedColumn(), TextColumn("{task.fields[eta]}"), console=console, transient=True)
            p.start()
            self._bar = (p, p.add_task("", total=total, eta=""))
        elif now - self.last < self.REDRAW_S and done < total:
            return
        self.last = now
        p, task = self._bar
        p.update(task, completed=done, total=total, eta=self.eta_text(done, total))
