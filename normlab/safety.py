"""Turning every failure a user can cause into the one-line error contract (docs/cli.md, "Errors").

:func:`guarded` runs a command and maps what escapes it to one line on stderr and an exit status:
``NormlabError`` (bad input, exit 2), operating-system errors (read-only file system, no space left, permission
denied, a file where a directory should be: exit 2, naming the path), memory exhaustion (exit 2, with what to
lower), Ctrl-C (exit 130, no traceback) and a closed stdout pipe (exit 0). ``--debug`` re-raises instead.
"""

from __future__ import annotations

import errno
import re
import shlex
import sys
from typing import Callable

from normlab.errors import EXIT_BAD_INPUT, EXIT_INTERRUPTED, NormlabError, clip
from normlab.errors import printable as printable  # defined on errors' floor, so markdown shares it


def shell_quote(text: object) -> str:
    """``text`` as one shell word on one line: ``shlex.quote`` (POSIX sh; ``shlex.split`` gives ``text`` back), or,
    when ``text`` holds a control character (a newline in a directory name), bash's ANSI-C quoting ``$'...'`` with
    the character escaped, so a copied command can neither run a second command nor span two lines."""
    s = str(text)
    if s.isprintable():
        return shlex.quote(s)
    return "$'" + "".join("\\\\" if c == "\\" else "\\'" if c == "'" else c if c.isprintable()
                          else f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}" for c in s) + "'"


RESUME_HINTS = {  # what re-running a command after a full disk does (docs/cli.md, "Errors")
    "train": "free some space on that file system, then 'normlab train --resume RUN_DIR' continues from the last "
             "checkpoint",
    "compare": "free some space on that file system, then re-run the same command: it keeps the finished runs and "
               "resumes the others",
    "claims": "free some space on that file system, then re-run the same command: it keeps the finished runs",
}


def one_line(message: object) -> str:
    """An error message as the one line ``guarded`` prints: printable (:func:`printable`), every run of more than
    ``LONG_WORD`` non-blank characters (a pasted blob as a config value, a 3,000-character path) shortened to its
    start and end with its length (:func:`normlab.errors.clip`), whichever command or module echoed it."""
    return re.sub(rf"\S{{{LONG_WORD + 1},}}", lambda m: clip(m.group(), LONG_WORD), printable(message))


LONG_WORD = 240


def os_error_line(e: OSError, command: str | None = None) -> str:
    """``PATH: No space left on device (free some space ...)`` style text naming the path; ``command`` (the
    subcommand that failed) chooses the way out of a full disk (``RESUME_HINTS``)."""
    path = e.filename if e.filename is not None else ""
    if e.filename2 is not None:
        path = f"{path} -> {e.filename2}"
    text = str(e).strip().splitlines()
    reason = e.strerror or (f"{e.__class__.__name__}: {text[0][:200]}" if text else e.__class__.__name__)
    if e.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        reason += " (check the directory's permissions, or choose another --out)"
    elif e.errno in (errno.ENOSPC, errno.EDQUOT):
        default = ("free some space on that file system and re-run the command" if command else
                   "free some space and re-run; train --resume RUN_DIR continues from the last checkpoint")
        reason += f" ({RESUME_HINTS.get(command or '', default)})"
    elif e.errno in (errno.ENOTDIR, errno.EISDIR, errno.EEXIST):
        reason += " (a file or directory is in the way; move it)"
    elif e.errno == errno.ENAMETOOLONG:
        reason += " (the file system allows 255 bytes per name; give a shorter path)"
    return f"{path}: {reason}" if path else f"{reason}"


def _alloc_error(e: BaseException) -> bool:
    text = str(e)
    return isinstance(e, MemoryError) or ("can't allocate memory" in text or "not enough memory" in text
                                          or "out of memory" in text.lower())


def guarded(run: Callable[[], int], *, debug: bool = False, command: str | None = None) -> int:
    """Run ``run()`` and apply the error contract (see the module docstring); returns the exit status. ``command``:
    the subcommand, for the way out of a full disk (:func:`os_error_line`)."""
    try:
        return run()
    except BrokenPipeError:  # an OSError: before the bad-input clause
        return 0
    except (NormlabError, OSError) as e:
        if debug:
            raise
        print(f"error: {one_line(e if isinstance(e, NormlabError) else os_error_line(e, command))}",
              file=sys.stderr)
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
        first = printable(str(e).splitlines()[0][:160]) if str(e) else "MemoryError"
        print(f"error: out of memory ({first}); lower the batch size, model size or context", file=sys.stderr)
        return EXIT_BAD_INPUT
