"""Error types and exit codes shared by the library and the CLI.

Exit codes (documented in docs/cli.md):
  0  success
  2  bad input (unknown key, wrong type, missing file, corrupt checkpoint, ...)
  3  the training run diverged (a result, recorded in summary.json)
  130 interrupted by Ctrl-C (state saved, resumable)
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
# normlab/__init__.py imports this module before normlab/__main__.py drops the current directory from sys.path, so a
# same-named file there would shadow what it imports: keep it to these two (tests/interop/test_hf_import.py plants
# typing.py, yaml.py, transformers.py and torch.py)

EXIT_OK = 0
EXIT_FAILED = 1  # an unexpected error (a bug, or the machine): the traceback is in the log
EXIT_BAD_INPUT = 2
EXIT_DIVERGED = 3
EXIT_INTERRUPTED = 130


class NormlabError(Exception):
    """A user-facing error: one line naming what is wrong and what is allowed.

    The CLI prints ``error: <message>`` and exits with status 2 (no traceback).
    """


def _fold(s: str) -> str:
    return s.lower().replace("-", "").replace("_", "")


def did_you_mean(name: str, allowed: Iterable[str]) -> str:
    """Return `` (did you mean 'x'?)`` for the allowed name equal up to case and ``-``/``_`` (``RMSNorm`` ->
    ``rmsnorm``, ``Pre-LN`` spellings), else the closest spelling, or an empty string."""
    allowed = list(allowed)
    same = [a for a in allowed if _fold(a) == _fold(str(name))]
    if same:
        return f" (did you mean '{same[0]}'?)"
    close = difflib.get_close_matches(name, allowed, n=1, cutoff=0.5)
    return f" (did you mean '{close[0]}'?)" if close else ""


def check_keys(mapping: Iterable[object], allowed: Iterable[str], where: str) -> None:
    """Refuse the first key of ``mapping`` that is not in ``allowed``: ``WHERE: unknown key 'k' (did you mean
    ...?); allowed: a, b`` (the one wording for every mapping a user writes: sweep files, their sections, claims)."""
    allowed = list(allowed)
    for k in mapping:
        if k not in allowed:
            raise NormlabError(f"{where}: unknown key '{k}'{did_you_mean(str(k), allowed)}; allowed: "
                               f"{', '.join(allowed)}")


def unknown(kind: str, name: str, allowed: Iterable[str]) -> NormlabError:
    """Build the standard 'unknown X' error listing the allowed values."""
    allowed = sorted(allowed)
    return NormlabError(
        f"unknown {kind} '{name}'{did_you_mean(name, allowed)}; allowed: {', '.join(allowed)}"
    )


def printable(text: object) -> str:
    """``text`` as one printable line: every control character (C0 and C1: ANSI escapes, newlines, carriage returns,
    tabs, DEL) and every other non-printable code point written as its Python escape (``\\x1b``, ``\\n``,
    ``\\u2028``), so a string from a user or a file can neither move the cursor nor split a one-line message."""
    s = str(text)
    if s.isprintable():
        return s
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in s)


def clip(text: object, limit: int = 240) -> str:
    """``text`` (printable, as :func:`printable`) shortened to about ``limit`` characters for an error message: its
    start and end around ``...`` with the full length, so a pasted blob echoed in a one-line error stays one
    readable line."""
    s = printable(text)
    if len(s) <= limit:
        return s
    head, tail = limit * 2 // 3, limit // 3
    return f"{s[:head]}...{s[-tail:]} ({len(s)} characters)"
