"""Atomic file writing (temp file in the same directory, fsync, then ``os.replace``) and safe loading.

Nothing here unpickles: tensors are safetensors, metadata is JSON / YAML.
"""

from __future__ import annotations

import json
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from normlab.errors import NormlabError


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temp path beside ``path``; on success it replaces ``path`` atomically, on error it is removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_text(path: str | Path, text: str) -> None:
    """Atomically write ``text`` to ``path``."""
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def write_json(path: str | Path, obj: Any) -> None:
    """Atomically write ``obj`` as indented JSON."""
    write_text(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


def read_json(path: str | Path, what: str = "file") -> Any:
    """Read JSON; a missing or corrupt file is a one-line NormlabError."""
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise NormlabError(f"{what} {path} not found") from None
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise NormlabError(f"{what} {path} is truncated or corrupted (not valid JSON)") from None


def save_tensors(path: str | Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> None:
    """Atomically save a flat dict of tensors as safetensors (contiguous copies, shared storage split)."""
    flat = {k: v.detach().contiguous().clone() for k, v in tensors.items()}
    with atomic_path(path) as tmp:
        save_file(flat, str(tmp), metadata=metadata)


def load_tensors(path: str | Path, what: str = "checkpoint") -> dict[str, torch.Tensor]:
    """Load a safetensors file; missing, truncated or foreign files are one-line NormlabErrors."""
    path = Path(path)
    if not path.is_file():
        raise NormlabError(f"{what} {path} not found")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as e:
        raise NormlabError(f"{what} {path} is truncated or corrupted ({str(e).splitlines()[0][:80]})") from None


def safetensors_metadata(path: str | Path) -> dict[str, str]:
    """Header metadata of a safetensors file (empty dict when none)."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            return f.metadata() or {}
    except (SafetensorError, OSError, ValueError):
        raise NormlabError(f"checkpoint {path} is truncated or corrupted") from None
