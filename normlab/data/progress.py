"""Progress for the slow, once-per-corpus steps of data preparation (reading a corpus, training a BPE tokenizer,
tokenizing the splits): a spinner with what is happening on a terminal (stderr), then a line saying how long it
took when it took at least ``MIN_REPORT_S``. Nothing is printed when stderr is not a terminal, so scripted use and
the one-line error contract are unchanged."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console

MIN_REPORT_S = 1.0


def _console():
    return Console(stderr=True)


@contextmanager
def stage(text: str) -> Iterator[None]:
    """``with stage("training BPE tokenizer (vocab 4096) on 12.3 MB"): ...``"""
    console = _console()
    if not console.is_terminal:
        yield
        return
    t0 = time.perf_counter()
    with console.status(f"{text} ..."):
        yield
    dt = time.perf_counter() - t0
    if dt >= MIN_REPORT_S:
        console.print(f"{text}: done in {dt:.1f}s")


def mb(n_bytes: int) -> str:
    return f"{n_bytes / 1e6:.1f} MB"
