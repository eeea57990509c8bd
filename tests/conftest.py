"""Fixtures shared by the test modules."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """A per-module token-cache directory (``NORMLAB_CACHE_DIR`` of the commands a module runs)."""
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def one_thread():
    """Small tensors: one intra-op thread is faster and immune to other jobs on the machine; restored after the
    module. Opt in with ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def run(tmp_path_factory, cache):
    """One finished tiny run per module (``helpers.SHORT``: 8 steps, checkpoints at 4 and 8), trained in-process."""
    from tests.helpers import SHORT, run_inproc

    out = tmp_path_factory.mktemp("run") / "r"
    run_inproc("train", "tiny", *SHORT, "--out", str(out), cache=cache, check=True)
    return out


@pytest.fixture()
def run_copy(run, tmp_path):
    """A private copy of the module's finished run that a test may damage."""
    import shutil

    dst = tmp_path / "rc"
    shutil.copytree(run, dst, symlinks=True)
    return dst
