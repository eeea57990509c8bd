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
