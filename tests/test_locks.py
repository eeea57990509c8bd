"""normlab.locks: the one lock (an exclusive flock holding its holder's pid), checked with a second process that
holds it: refused in one line naming the holder, released when the holder dies, a waiting lock entered only after
the holder lets go, and a FIFO or directory in the lock's place one line, never a hang."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from normlab.errors import NormlabError
from normlab.locks import exclusive_lock, lock_taken
from tests.helpers import cli_env


HOLDER = """
import sys, time
from pathlib import Path
from normlab.locks import exclusive_lock
lock, marker = Path(sys.argv[1]), Path(sys.argv[2])
with exclusive_lock(lock, "the test cache"):
    print("held", flush=True)
    time.sleep(float(sys.argv[3]))
    marker.write_text("released")  # the last thing before the lock is let go
"""


def _hold(lock: Path, marker: Path, seconds: float) -> subprocess.Popen:
    """Another process holding ``exclusive_lock(lock)`` for ``seconds``; returns once it holds it."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(lock), str(marker), str(seconds)],
                            stdout=subprocess.PIPE, text=True, env=cli_env(lock.parent / "cache"))
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_taken_lock_is_refused_in_one_line_naming_its_holder_and_pid(tmp_path):
    lock = tmp_path / ".compare.lock"
    assert not lock_taken(lock) and not lock.exists()  # never created by the probe
    proc = _hold(lock, tmp_path / "marker", 30)
    try:
        assert lock_taken(lock)
        with pytest.raises(NormlabError, match=rf"^sweep is in use by another normlab compare \(pid {proc.pid}, "):
            with exclusive_lock(lock, "sweep", holder="normlab compare"):
                pass
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert not lock_taken(lock)  # released when its holder dies
    with exclusive_lock(lock, "sweep"):
        assert lock.read_text() == str(os.getpid())


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_a_lock_that_is_not_a_regular_file_is_one_line_not_a_hang(tmp_path, kind):
    """A FIFO (its open would wait for a writer without O_NONBLOCK) or a directory in a lock's place: one line
    naming the path, for taking the lock and for asking whether it is taken."""
    lock = tmp_path / ".train.lock"
    os.mkfifo(lock) if kind == "fifo" else lock.mkdir()
    with pytest.raises(NormlabError, match=r"^(the lock .* is not a regular file|cannot open the lock )"):
        with exclusive_lock(lock, "run"):
            pass
    with pytest.raises(NormlabError, match=str(lock)):
        lock_taken(lock)


def test_a_waiting_lock_is_entered_only_after_its_holder_lets_go(tmp_path):
    lock, marker = tmp_path / "cache.lock", tmp_path / "marker"
    proc = _hold(lock, marker, 1.0)
    try:
        with exclusive_lock(lock, "the test cache", wait=True):
            assert marker.read_text() == "released"  # not entered while the holder slept
    finally:
        proc.wait(timeout=30)
