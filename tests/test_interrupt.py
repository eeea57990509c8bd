"""normlab.interrupt: the one SIGINT/SIGTERM handling (checked by sending the process real signals)."""

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time

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


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_die_with_parent_the_kernel_signals_the_child_when_its_parent_dies():
    """A middle process starts a child that asks for SIGTERM on its parent's death, then the middle process is
    SIGKILLed: the child ends by SIGTERM (the kernel sent it), not after its 60 s sleep."""
    child = ("import signal, sys, time; from normlab.interrupt import die_with_parent; "
             "die_with_parent(signal.SIGTERM); print('ready', flush=True); time.sleep(60)")
    middle = ("import subprocess, sys; c = subprocess.Popen([sys.executable, '-c', sys.argv[1]], "
              "stdout=subprocess.PIPE, text=True); print(c.pid, flush=True); print(c.stdout.readline().strip(), "
              "flush=True); import time; time.sleep(60)")
    m = subprocess.Popen([sys.executable, "-c", middle, child], stdout=subprocess.PIPE, text=True)
    try:
        pid = int(m.stdout.readline())
        assert m.stdout.readline().strip() == "ready"
        m.kill()
        m.wait(timeout=10)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and _alive(pid):
            time.sleep(0.05)
        assert not _alive(pid), "the child outlived its parent"
    finally:
        m.kill()
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie reparented to init is reaped at once; /proc shows its state otherwise)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_die_with_parent_exits_at_once_when_the_parent_is_already_gone():
    """``parent`` read before the call is not the parent any more: the process exits 137 instead of orphaning."""
    code = ("import os; from normlab.interrupt import die_with_parent; "
            "die_with_parent(parent=os.getppid() + 1); print('survived')")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 137 and "survived" not in p.stdout
    q = subprocess.run([sys.executable, "-c", code.replace(" + 1", "")], capture_output=True, text=True, timeout=60)
    assert q.returncode == 0 and q.stdout.strip() == "survived"
