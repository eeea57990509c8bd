"""Files and directories normlab writes honour the umask exactly as ``open()`` / ``mkdir()`` do (issue 29 item 2):
the reference is the mode of a file and a directory created the ordinary way under the same umask."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from normlab.io import atomic_path, current_umask, publish_dir, write_json
from tests.helpers import cli_env


def _reference_modes(where: Path) -> tuple[int, int]:
    """(file mode, directory mode) that plain ``open(..., "w")`` and ``mkdir`` give under the current umask."""
    f, d = where / "ref-file", where / "ref-dir"
    with open(f, "w") as h:
        h.write("x")
    d.mkdir()
    modes = stat.S_IMODE(f.stat().st_mode), stat.S_IMODE(d.stat().st_mode)
    f.unlink()
    d.rmdir()
    return modes


@pytest.mark.parametrize("mask", [0o022, 0o077, 0o027])
def test_atomic_writes_and_published_dirs_get_open_modes(tmp_path, mask):
    old = os.umask(mask)
    try:
        assert current_umask() == mask
        fmode, dmode = _reference_modes(tmp_path)
        write_json(tmp_path / "a.json", {"x": 1})
        with atomic_path(tmp_path / "b.bin") as tmp:
            tmp.write_bytes(b"\0")
        with publish_dir(tmp_path / "out") as d:
            (d / "inner.txt").write_text("y")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "a.json").stat().st_mode) == fmode
    assert stat.S_IMODE((tmp_path / "b.bin").stat().st_mode) == fmode
    assert stat.S_IMODE((tmp_path / "out").stat().st_mode) == dmode
    assert stat.S_IMODE((tmp_path / "out" / "inner.txt").stat().st_mode) == fmode


def _modes_under(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): stat.S_IMODE(p.stat().st_mode) for p in [root, *root.rglob("*")]}


def _check_tree(root: Path, fmode: int, dmode: int) -> None:
    bad = {k: oct(m) for k, m in _modes_under(root).items()
           if m != (dmode if (root / k).is_dir() else fmode)}
    assert not bad, f"modes differ from open()/mkdir() ({oct(fmode)}/{oct(dmode)}): {bad}"


@pytest.mark.parametrize("mask", [0o022, 0o077])
def test_a_run_and_its_hf_export_honour_the_umask(tmp_path, cache, mask):
    env = cli_env(cache)
    run = tmp_path / "run"
    subprocess.run([sys.executable, "-m", "normlab", "train", "tiny", "--set", "train.steps=2", "--set",
                    "train.eval_every=2", "--set", "train.checkpoint_every=2", "--set", "model.context=16",
                    "--out", str(run)], env=env, umask=mask, check=True, capture_output=True)
    old = os.umask(mask)
    try:
        fmode, dmode = _reference_modes(tmp_path)
    finally:
        os.umask(old)
    _check_tree(run, fmode, dmode)
    if mask == 0o022:  # the export's weights too (transformers writes config.json itself)
        pytest.importorskip("transformers")
        exp = tmp_path / "hf"
        subprocess.run([sys.executable, "-m", "normlab", "export", str(run), "--to", "hf", "--out", str(exp)],
                       env=env, umask=mask, check=True, capture_output=True)
        _check_tree(exp, fmode, dmode)
