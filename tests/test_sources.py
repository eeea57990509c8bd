"""normlab.data.sources: inputs that hung or exploded -- a fifo or device as a corpus is refused, not read
forever."""

from __future__ import annotations

import os

import pytest

from tests.helpers import assert_bad_input, run_inproc

pytestmark = pytest.mark.usefixtures("one_thread")


def test_fifo_and_device_sources_are_refused(tmp_path, cache):
    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    for src in (str(fifo), "/dev/zero"):
        out = tmp_path / "o"
        assert_bad_input(run_inproc("train", "tiny", "--set", f"data.source={src}", "--out", str(out), cache=cache),
                         "not a regular file or directory", src)
        assert not out.exists()
