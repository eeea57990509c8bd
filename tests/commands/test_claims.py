"""normlab.commands.claims: ``claims --render`` on a path that exists but is not a regular file (a FIFO, a
directory) is the safe reader's one line naming what it is, never 'no such file' (what it said before) and never a
blocking read of the FIFO; a missing path still says 'no such file'."""

from __future__ import annotations

import os

import pytest

from tests.helpers import assert_bad_input, run_inproc


@pytest.mark.parametrize("kind, says", [("fifo", "is a FIFO (named pipe), not a regular file"),
                                        ("dir", "is a directory, not a regular file")])
def test_render_names_what_is_in_the_way(tmp_path, kind, says):
    src = tmp_path / "claims.json"
    os.mkfifo(src) if kind == "fifo" else src.mkdir()
    proc = run_inproc("claims", "--render", str(src), cache=tmp_path / "c")
    assert_bad_input(proc, f"claims results {src} {says}")
    assert "no such file" not in proc.stderr


def test_render_of_a_missing_file_says_so(tmp_path):
    assert_bad_input(run_inproc("claims", "--render", str(tmp_path / "none.json"), cache=tmp_path / "c"),
                     f"--render {tmp_path / 'none.json'}: no such file")
