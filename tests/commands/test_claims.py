"""normlab.commands.claims: ``claims --render`` on a path that exists but is not a regular file (a FIFO, a
directory) is the safe reader's one line naming what it is, never 'no such file' (what it said before) and never a
blocking read of the FIFO; a missing path still says 'no such file'. The rendered table shows a stored claims.json's
control characters as escapes (``\x1b``) and its rich markup as text, so the file cannot drive the terminal."""

from __future__ import annotations

import json
import os
from pathlib import Path

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


def test_render_shows_control_characters_and_markup_as_text(tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "2000")  # no cell wrapped
    stored = json.loads((Path(__file__).parents[2] / "docs" / "claims-full-2026-11-26.json").read_text())
    c = stored["claims"][0]
    c["name"], c["paper"] = "N\x1b[2J[red]x[/red]", "P\x1b]0;title\x07"
    stored["budget"] = "B\x1b[5m[bold]"
    src = tmp_path / "claims.json"
    src.write_text(json.dumps(stored))
    proc = run_inproc("claims", "--render", str(src), cache=tmp_path / "c")
    assert proc.returncode == 0, proc.stderr
    assert "\x1b" not in proc.stdout and "\x07" not in proc.stdout  # no raw escape byte reaches the terminal
    for shown in ("N\\x1b[2J[red]x[/red]: ", "P\\x1b]0;title\\x07", "budget B\\x1b[5m[bold], "):
        assert shown in proc.stdout, shown
