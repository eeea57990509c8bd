"""normlab generate (commands/generate.py): a prompt that is not valid UTF-8 streams as bytes."""

from __future__ import annotations


import pytest

from tests.helpers import run_inproc

pytestmark = pytest.mark.usefixtures("one_thread")


def test_generate_streams_undecodable_prompt(run, cache):
    """``generate --prompt $'\\xff\\xfe'`` streams (the prompt shown with U+FFFD), no UnicodeEncodeError."""
    proc = run_inproc("generate", str(run), "--prompt", "\udcff\udcfe", "--max-new-tokens", "2", cache=cache)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("\ufffd\ufffd")
