"""normlab.commands.eval: a run directory whose name holds an ANSI escape (a shared runs/ folder, a glob) is
echoed with the escape written out (safety.printable: ``\\x1b``), never as the raw byte that would drive the
terminal; markup in the name is shown as text."""

from __future__ import annotations

import shutil

from tests.helpers import run_inproc

ARGS = ("--max-tokens", "256")
NAME = "r\x1b[2J[red]x"


def test_the_run_name_is_echoed_without_raw_control_characters(run, tmp_path, cache):
    odd = tmp_path / NAME
    shutil.copytree(run, odd)
    proc = run_inproc("eval", str(odd), *ARGS, cache=cache)
    assert proc.returncode == 0, proc.stderr
    assert "\x1b" not in proc.stdout + proc.stderr
    assert "r\\x1b[2J[red]x" in "".join(proc.stdout.split())  # a table may wrap its title
