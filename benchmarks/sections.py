"""Shared helper for benchmark scripts: replace one marked section of docs/benchmarks.md atomically."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_section(path: Path, name: str, body: str) -> None:
    """Replace the text between ``<!-- name:start -->`` and ``<!-- name:end -->`` of ``path`` (or append it),
    atomically; ``body`` may already carry the two markers."""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    replace_marked(path, start, end, body if start in body else f"{start}\n{body.rstrip()}\n{end}\n")


def replace_marked(path: Path, start: str, end: str, section: str) -> None:
    """Replace ``start``...``end`` of ``path`` with ``section`` (which carries both markers), or append it; temp
    file + rename, so a crash never leaves a half-written file."""
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
