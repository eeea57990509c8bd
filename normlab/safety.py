"""Turning every failure a user can cause into the one-line error contract (docs/cli.md, "Errors").

:func:`guarded` runs a command and maps what escapes it to one line on stderr and an exit status:
``NormlabError`` (bad input, exit 2), operating-system errors (read-only file system, no space left, permission
denied, a file where a directory should be: exit 2, naming the path), memory exhaustion (exit 2, with what to
lower), Ctrl-C (exit 130, no traceback) and a closed stdout pipe (exit 0). ``--debug`` re-raises instead.
"""

from __future__ import annotations

import errno
import sys
from typing import Callable

from normlab.errors import EXIT_BAD_INPUT, EXIT_INTERRUPTED, NormlabError


def os_error_line(e: OSError) -> str:
    """``cannot write PATH: No space left on device`` style text naming the path."""
    path = e.filename if e.filename is not None else ""
    if e.filename2 is not None:
        path = f"{path} -> {e.filename2}"
    text = str(e).strip().splitlines()
    reason = e.strerror or (f"{e.__class__.__name__}: {text[0][:200]}" if text else e.__class__.__name__)
    if e.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        reason += " (check the directory's permissions, or choose another --out)"
    elif e.errno == errno.ENOSPC:
        reason += " (free some space and re-run; --resume continues from the last checkpoint)"
    elif e.errno in (errno.ENOTDIR, errno.EISDIR, errno.EEXIST):
        reason += " (a file or directory is in the way; move it)"
    return f"{path}: {reason}" if path else f"{reason}"


def _alloc_error(e: BaseException) -> bool:
    text = str(e)
    return isinstance(e, MemoryError) or ("can't allocate memory" in text or "not enough memory" in text
                                          or "out of memory" in text.lower())


def guarded(run: Callable[[], int], *, debug: bool = False) -> int:
    """Run ``run()`` and apply the error contract (see the module docstring); returns the exit status."""
    try:
        return run()
    except BrokenPipeError:  # an OSError: before the bad-input clause
        return 0
    except (NormlabError, OSError) as e:
        if debug:
            raise
        print(f"error: {e if isinstance(e, NormlabError) else os_error_line(e)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        if debug:
            raise
        print("interrupted (Ctrl-C); nothing half-written: re-run the command (train: --resume RUN_DIR)",
              file=sys.stderr)
        return EXIT_INTERRUPTED
    except (MemoryError, RuntimeError) as e:
        if debug or not _alloc_error(e):
            raise
        first = str(e).splitlines()[0][:160] if str(e) else "MemoryError"
        print(f"error: out of memory ({first}); lower the batch size, model size or context", file=sys.stderr)
        return EXIT_BAD_INPUT
