"""normlab.commands.eval: a run directory whose name holds an ANSI escape (a shared runs/ folder, a glob) is
echoed with the escape written out (safety.printable: ``\\x1b``), never as the raw byte that would drive the
terminal; markup in the name is shown as text."""

from __future__ import annotations

from tests.helpers import assert_name_echoed_printable


def test_the_run_name_is_echoed_without_raw_control_characters(run, tmp_path, cache):
    assert_name_echoed_printable("eval", run, tmp_path, cache, "--max-tokens", "256")
