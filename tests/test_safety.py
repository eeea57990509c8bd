"""The one-line error contract for operating-system errors (normlab.safety.os_error_line, guarded)."""

from __future__ import annotations

import errno

import pytest

from normlab.safety import guarded, os_error_line


def test_an_oserror_without_strerror_keeps_its_message(capsys):
    """A dependency's ``OSError("...")`` (no errno) used to print 'error: OSError' and nothing else."""
    e = OSError("model.safetensors is missing from DIR\nsecond line")
    assert os_error_line(e) == "OSError: model.safetensors is missing from DIR"

    def run() -> int:
        raise e

    assert guarded(run) == 2
    err = capsys.readouterr().err
    assert err == "error: OSError: model.safetensors is missing from DIR\n"


@pytest.mark.parametrize("e,expected", [
    (FileNotFoundError(errno.ENOENT, "No such file or directory", "/x/y"), "/x/y: No such file or directory"),
    (OSError(), "OSError"),
])
def test_errno_errors_name_the_path(e, expected):
    assert os_error_line(e) == expected
