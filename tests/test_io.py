"""normlab.io: YAML alias bombs refused, --out an existing file, strict JSON everywhere (no NaN), stale temp
directories cleaned and a run being trained locked, convert's stale temp directory cleaned."""

from __future__ import annotations

import json

import pytest

from tests.helpers import SHORT, assert_bad_input, run_inproc

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
