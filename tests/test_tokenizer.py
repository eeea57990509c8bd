"""Tokenizer loading (normlab.data.tokenizer.load_tokenizer): a path that is not a tokenizer file says what it is
(issue 27 item 7: '/dev/zero' was reported as not existing)."""

from __future__ import annotations

import os

import pytest

from tests.helpers import assert_bad_input, run_inproc


@pytest.mark.parametrize("kind", ["device", "fifo", "empty-dir", "missing"])
def test_tokenizer_path_that_is_not_a_file(kind, tmp_path, cache):
    path = {"device": "/dev/zero", "fifo": str(tmp_path / "fifo.json"), "empty-dir": str(tmp_path / "d"),
            "missing": str(tmp_path / "none.json")}[kind]
    if kind == "fifo":
        os.mkfifo(path)
    if kind == "empty-dir":
        os.mkdir(path)
    expected = {"device": "is not a regular file", "fifo": "is not a regular file",
                "empty-dir": "has no tokenizer.json", "missing": "does not exist"}[kind]
    out = tmp_path / "out"
    proc = run_inproc("train", "tiny", "--set", f"data.tokenizer={path}", "--out", str(out), cache=cache)
    assert_bad_input(proc, f"'{path}'", expected)
    assert not out.exists()
