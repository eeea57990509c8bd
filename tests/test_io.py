"""Files and directories normlab writes honour the umask exactly as ``open()`` / ``mkdir()`` do (issue 29 item 2):
the reference is the mode of a file and a directory created the ordinary way under the same umask.

normlab.io.publish_dir / check_new_dir: the one helper every command that writes a whole output directory
(convert, export, import, quantize, remove-norm) goes through. Checked against the file system itself."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from normlab.errors import NormlabError
from normlab.io import atomic_path, check_new_dir, current_umask, publish_dir, write_json
from tests.helpers import SHORT, assert_bad_input, cli_env, run_inproc

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


pytestmark = pytest.mark.usefixtures("one_thread")


ALIAS_BOMB = """name: bomb
base: tiny
a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]
b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]
c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]
description: [*c, *c, *c, *c, *c, *c, *c, *c, *c]
"""


def test_yaml_alias_bomb_is_refused(tmp_path, cache):
    sweep = tmp_path / "bomb.yaml"
    sweep.write_text(ALIAS_BOMB)
    assert_bad_input(run_inproc("compare", str(sweep), "--out", str(tmp_path / "s"), cache=cache),
                     "YAML aliases", str(sweep))
    assert not (tmp_path / "s").exists()
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("seed: 0\nmodel: &m {width: 64}\ndata: *m\n")
    assert_bad_input(run_inproc("train", str(cfg), "--out", str(tmp_path / "o"), cache=cache), "YAML aliases", "cfg")


def test_out_an_existing_file(tmp_path, cache):
    f = tmp_path / "taken"
    f.write_text("keep me")
    assert_bad_input(run_inproc("train", "tiny", *SHORT, "--out", str(f), cache=cache), "is a file", str(f))
    assert f.read_text() == "keep me"


def test_strict_json_everywhere(tmp_path, cache):
    """A run that diverges on a NaN loss: summary.json, metrics.jsonl and --json hold null, never bare NaN."""
    from normlab.io import dumps, strict

    assert strict({"a": float("nan"), "b": [float("inf"), 1.0]}) == {"a": None, "b": [None, 1.0]}
    assert dumps({"x": float("-inf")}) == '{"x": null}'
    out = tmp_path / "d"
    proc = run_inproc("train", "tiny", *SHORT, "--set", "train.lr=1e30", "--set", "train.grad_clip=0",
                      "--set", "train.warmup_steps=0", "--out", str(out), "--json", cache=cache)
    assert proc.returncode == 3, proc.stderr

    def bad(c: str):
        raise AssertionError(f"bare {c} in JSON")

    s = json.loads(proc.stdout, parse_constant=bad)
    assert s["status"] == "diverged"
    json.loads((out / "summary.json").read_text(), parse_constant=bad)
    for line in (out / "metrics.jsonl").read_text().splitlines():
        json.loads(line, parse_constant=bad)


def test_stale_temp_dirs_are_cleaned_and_resume_is_locked(run_copy, cache):
    from normlab.io import exclusive_lock

    stale = run_copy / "checkpoints" / ".step_00000012.abcd1234"
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"partial")
    tmpfile = run_copy / ".summary.json.x1y2.tmp"
    tmpfile.write_text("{")
    (run_copy / "summary.json").unlink()  # so --resume really opens the run
    with exclusive_lock(run_copy / ".train.lock", "test"):
        assert_bad_input(run_inproc("train", "--resume", str(run_copy), cache=cache), "in use by another normlab",
                         str(run_copy))
    assert stale.exists()  # a refused resume touches nothing
    proc = run_inproc("train", "--resume", str(run_copy), "--json", cache=cache)
    assert proc.returncode == 0, proc.stderr
    assert not stale.exists() and not tmpfile.exists()


def test_convert_cleans_its_stale_temp_dir(run, tmp_path, cache):
    out = tmp_path / "conv"
    stale = tmp_path / ".conv.k9k9k9k9"
    stale.mkdir()
    (stale / "config.yaml").write_text("half")
    proc = run_inproc("convert", str(run), "--to", "rmsnorm", "--out", str(out), "--max-tokens", "256", cache=cache)
    assert proc.returncode == 0, proc.stderr
    assert not stale.exists() and (out / "model.safetensors").is_file()


# ---------------------------------------------------------------- publish_dir / check_new_dir
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
