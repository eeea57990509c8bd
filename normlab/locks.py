"""normlab's one lock: an exclusive ``flock`` on a lock file holding its holder's pid (``exclusive_lock``: a run
directory's trainer, a sweep directory's compare, a sweep's run, a shared cache), and whether one is taken now
(``lock_taken``). A lock file that is not a regular file (a FIFO, a directory) is one line, never a hang."""

from __future__ import annotations

import os
import stat
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from normlab.errors import NormlabError


def _open_lock(path: Path, flags: int) -> int:
    """A lock file's descriptor (``O_NONBLOCK``: a FIFO in its place does not hang the open); anything but a regular
    file, or a file that cannot be opened, is one line (a missing one raises ``FileNotFoundError`` without
    ``O_CREAT``)."""
    try:
        fd = os.open(path, flags | os.O_NONBLOCK, 0o644)
    except FileNotFoundError:
        if not flags & os.O_CREAT:
            raise
        raise NormlabError(f"cannot create the lock {path}: its directory does not exist") from None
    except OSError as e:
        raise NormlabError(f"cannot open the lock {path}: {e.strerror}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise NormlabError(f"the lock {path} is not a regular file (a FIFO, a device or a directory?); remove it, "
                           "normlab makes it")
    return fd


@contextmanager
def exclusive_lock(path: str | Path, what: str, *, holder: str = "normlab process",
                   wait: bool = False) -> Iterator[None]:
    """An exclusive ``flock`` on ``path`` for the ``with`` block, with this process's pid written in the file (the
    one lock of normlab: a run directory's trainer, a sweep directory's compare, a sweep's run, a shared cache).
    Taken already: one line naming ``what``, the ``holder`` and its pid; ``wait=True`` waits for it instead (a cache
    the workers of a sweep starting together fill once). Released when the block ends or the process dies."""
    import fcntl

    path = Path(path)
    f = os.fdopen(_open_lock(path, os.O_RDWR | os.O_CREAT | os.O_APPEND), "a+")
    try:
        try:
            fcntl.flock(f, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.seek(0)
            pid = f.read().strip() or "?"
            raise NormlabError(f"{what} is in use by another {holder} (pid {pid}, lock {path}); wait for it "
                               "or stop it") from None
        f.seek(0)
        f.truncate()
        f.write(str(os.getpid()))
        f.flush()
        yield
    finally:
        f.close()


def lock_taken(path: str | Path) -> bool:
    """Whether another process holds an :func:`exclusive_lock` on ``path`` now (a lock file that does not exist is
    free; read-only, never created, so a directory it cannot write is read as it is; taken and released at once)."""
    import fcntl

    try:
        fd = _open_lock(Path(path), os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)
