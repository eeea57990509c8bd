"""Shared helper for benchmark scripts: replace one marked section of docs/benchmarks.md atomically."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_section(path: Path, name: str, body: str) -> None:
    """Replace the text between ``<!-- name:start -->`` and ``<!-- name:end -->`` (or append it); temp + rename."""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    section = f"{start}\n{body.rstrip()}\n{end}\n"
    old = path.read_text() if path.exists() else "# Benchmarks\n"
    if start in old and end in old:
        before, rest = old.split(start, 1)
        new = before + section + rest.split(end, 1)[1].lstrip("\n")
    else:
        new = old.rstrip("\n") + "\n\n" + section
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(new)
    os.replace(tmp, path)


def replace_marked(path: Path, start: str, end: str, section: str) -> None:
    """Like :func:`write_section` for a ``section`` that already carries its ``start``/``end`` markers."""
    old = path.read_text() if path.exists() else "# Benchmarks\n"
    if start in old and end in old and old.index(start) < old.index(end):
        before, rest = old.split(start, 1)
        after = rest.split(end, 1)[1].lstrip("\n")
        new = before + section.rstrip("\n") + "\n" + ("\n" + after if after else "")
    else:
        new = old.rstrip("\n") + "\n\n" + section.rstrip("\n") + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(new)
    os.replace(tmp, path)
