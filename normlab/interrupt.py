"""The one way normlab handles SIGINT (Ctrl-C) and SIGTERM (``kill``, a scheduler's pre-emption notice).

``handle_signals(handler)`` installs ``handler`` for both signals for the duration of a ``with`` block and puts the
previous handlers back after it, whatever happens inside. Signal handlers can only be installed from the main
thread; elsewhere (a Ray actor thread, a test's thread) the block runs with the handlers it found. ``StopFlag`` is
the common handler: the first signal sets ``stop`` (checked between steps or scheduling rounds, so nothing is
interrupted mid-write), and a repeated one either raises ``KeyboardInterrupt`` (``repeat="raise"``: a second Ctrl-C
stops at once) or only counts (``repeat="count"``: a DDP rank, which torchrun kills after its shutdown timeout).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any, Literal

SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def handle_signals(handler: Callable[[int, Any], None], signals: tuple[int, ...] = SIGNALS) -> Iterator[bool]:
    """Install ``handler`` for ``signals`` inside the block; yields whether it was installed (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield False
        return
    old = {s: signal.signal(s, handler) for s in signals}
    try:
        yield True
    finally:
        for s, h in old.items():
            if h is not None:  # None: a handler not installed from Python, which cannot be put back
                signal.signal(s, h)


class StopFlag:
    """A flag set by the first SIGINT/SIGTERM; ``signals`` counts them, ``signum`` is the last one received."""

    def __init__(self, repeat: Literal["raise", "count"] = "raise") -> None:
        self.stop = False
        self.signals = 0
        self.signum: int | None = None
        self.repeat = repeat
        self._block: contextlib.AbstractContextManager[bool] | None = None

    def __call__(self, signum: int, _frame: Any = None) -> None:
        self.signals += 1
        self.signum = signum
        if self.stop and self.repeat == "raise":
            raise KeyboardInterrupt
        self.stop = True

    def __enter__(self) -> "StopFlag":
        self._block = handle_signals(self)
        self._block.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        assert self._block is not None
        self._block.__exit__(*exc)
        self._block = None


def die_with_parent(sig: int = signal.SIGKILL, parent: int | None = None) -> None:
    """Linux: have the kernel send ``sig`` to this process when its parent dies (``prctl(PR_SET_PDEATHSIG)``), so
    a killed launcher leaves no orphan: SIGKILL for a DDP rank or a Ray trainer, SIGINT (checkpoint and stop) for a
    sweep worker. ``parent``: the parent's pid read before this call; if it is no longer the parent, it died before
    the request took effect and this process exits at once (137). Elsewhere (no libc ``prctl``) nothing happens."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, sig)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if parent is not None and os.getppid() != parent:
        os._exit(137)
