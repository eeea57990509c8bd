"""normlab.interrupt: the one SIGINT/SIGTERM handling (checked by sending the process real signals)."""

import os
import signal
import threading

import pytest

from normlab.interrupt import StopFlag, handle_signals


def test_stop_flag_sets_then_raises_and_restores_the_old_handlers():
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    with StopFlag() as flag:
        os.kill(os.getpid(), signal.SIGTERM)
        assert flag.stop and flag.signals == 1 and flag.signum == signal.SIGTERM
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    assert {s: signal.getsignal(s) for s in before} == before


def test_count_mode_never_raises():
    with StopFlag(repeat="count") as flag:
        for _ in range(3):
            os.kill(os.getpid(), signal.SIGINT)
    assert flag.stop and flag.signals == 3


def test_handlers_are_restored_after_an_exception():
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(RuntimeError), handle_signals(lambda *_: None):
        raise RuntimeError("inside")
    assert signal.getsignal(signal.SIGINT) is before


def test_outside_the_main_thread_nothing_is_installed():
    seen = []

    def body():
        with handle_signals(lambda *_: None) as installed:
            seen.append(installed)

    t = threading.Thread(target=body)
    t.start()
    t.join()
    assert seen == [False]
