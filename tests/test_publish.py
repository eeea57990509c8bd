"""normlab.io.publish_dir / check_new_dir: the one helper every command that writes a whole output directory
(convert, export, import, quantize, remove-norm) goes through. Checked against the file system itself."""

from __future__ import annotations

import subprocess
import sys

import pytest

from normlab.errors import NormlabError
from normlab.io import check_new_dir, publish_dir


def test_publish_dir_appears_only_complete(tmp_path):
    out = tmp_path / "sub" / "out"
    with publish_dir(out) as tmp:
        (tmp / "a.txt").write_text("x")
        assert not out.exists() and tmp.parent == out.parent and tmp.name.startswith(".out.")
    assert (out / "a.txt").read_text() == "x"
    assert sorted(p.name for p in out.parent.iterdir()) == ["out"]


def test_publish_dir_error_leaves_nothing_and_replaces_an_empty_dir(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(RuntimeError):
        with publish_dir(out) as tmp:
            (tmp / "half.bin").write_bytes(b"\0" * 10)
            raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []
    out.mkdir()  # an empty --out the user made is fine and is replaced
    with publish_dir(out) as tmp:
        (tmp / "b").write_text("y")
    assert [p.name for p in out.iterdir()] == ["b"]


def test_publish_dir_removes_stale_temps_of_its_name_only(tmp_path):
    stale = tmp_path / ".out.abcd1234"  # what a kill -9 leaves (mkdtemp's 8 random characters)
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"x")
    other = tmp_path / ".other.abcd1234"
    other.mkdir()
    with publish_dir(tmp_path / "out") as tmp:
        (tmp / "c").write_text("z")
    assert not stale.exists() and other.exists()


def test_check_new_dir_refuses_files_and_non_empty_dirs(tmp_path):
    f = tmp_path / "f"
    f.write_text("keep")
    d = tmp_path / "d"
    d.mkdir()
    (d / "x").write_text("keep")
    for p in (f, d):
        with pytest.raises(NormlabError, match="already exists and is not empty"):
            check_new_dir(p)
    assert f.read_text() == "keep" and (d / "x").read_text() == "keep"
    assert check_new_dir(tmp_path / "new") == tmp_path / "new" and not (tmp_path / "new").exists()


def test_io_does_not_import_torch():
    code = "import sys, normlab.io; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
