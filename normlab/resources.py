"""The machine's resources as a process sees them: the cores it may use and how a number of runs shares them.

Torch-free and low in the layers (docs/architecture.md): the sweep runner, the Ray executor and torchrun's thread
default all ask here.
"""

from __future__ import annotations

import os

from normlab.errors import NormlabError


def available_cores() -> int:
    """The CPU cores this process may run on (its affinity mask on Linux, else ``os.cpu_count()``)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def plan_workers(n_runs: int, workers: int | None, cores: int | None = None) -> tuple[int, int]:
    """``(workers, threads per worker)`` with ``workers * threads <= cores`` (unless ``workers > cores``)."""
    cores = cores or available_cores()
    if workers is not None and workers < 1:
        raise NormlabError(f"--workers must be >= 1, got {workers}")
    w = max(1, min(workers or cores, max(n_runs, 1)))
    return w, max(1, cores // w)
