"""Which normlab produced a file: the package version and, when normlab runs from a git checkout, the commit.

Recorded in every run directory (``RUN_DIR/provenance.json``) and printed by ``normlab --version``.
"""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path

from normlab.version import __version__


@functools.lru_cache(maxsize=1)
def git_commit() -> str | None:
    """HEAD of the checkout normlab is imported from, or None (an installed wheel, no git, not a checkout)."""
    root = Path(__file__).resolve().parent.parent
    if not (root / ".git").exists():
        return None
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    commit = out.stdout.strip()
    return commit if out.returncode == 0 and len(commit) == 40 else None


def version_info() -> dict[str, str | None]:
    """``{"normlab_version": "0.1.0", "git_commit": "<40 hex>" | None}``."""
    return {"normlab_version": __version__, "git_commit": git_commit()}


def version_string() -> str:
    c = git_commit()
    return __version__ + (f" (git {c[:12]})" if c else "")
