"""The C heap of a training process: keep freed memory for reuse instead of handing it back to the kernel.

A training step allocates and frees the same activation tensors every step (torch's CPU allocator calls the C
library's ``posix_memalign`` / ``free``, with no cache of its own). glibc's malloc serves a request above its mmap
threshold (128 KiB at start, raised on the fly up to 32 MiB) with fresh pages from ``mmap`` and returns them on
``free``, and gives the top of its heap back above ``M_TRIM_THRESHOLD``: the next step's tensors then arrive as new
pages that the kernel faults in and zeroes on first touch, every step. Raising both thresholds keeps freed memory in
the heap, where the next step reuses it (``benchmarks/heap_policy.py`` measures the page faults and the speed of
``normlab train`` with and without, docs/benchmarks.md). The cost: a process's resident memory stays near its peak
instead of shrinking after it -- the right trade for a training or evaluation process, whose peak recurs every step.

``set_heap_policy`` (the ``normlab`` entry point calls it first, beside the OpenMP wait policy) applies it to this
process with ``mallopt`` and puts ``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_TRIM_THRESHOLD_`` in the environment, which
glibc reads when a process starts, so sweep workers, DDP ranks and other child processes get it too. Kept as the
user set it: either variable (or ``glibc.malloc.*`` in ``GLIBC_TUNABLES``) in the environment;
``NORMLAB_MALLOC=default`` turns it off (and keeps normlab's variables from the process's children).
Elsewhere (not glibc: macOS, musl) nothing is changed.
"""

from __future__ import annotations

import ctypes
import os
import platform

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3   # glibc's malloc.h parameter numbers
THRESHOLD = 1 << 30   # bytes: requests below 1 GiB come from the heap; up to 1 GiB of free heap top is kept
ENV = {"MALLOC_MMAP_THRESHOLD_": str(THRESHOLD), "MALLOC_TRIM_THRESHOLD_": str(THRESHOLD)}
USER_VARS = (*ENV, "GLIBC_TUNABLES")


def set_heap_policy(environ: dict[str, str] | None = None, apply: bool = True) -> str:
    """Keep freed memory in this process's heap (``mallopt``, when ``apply``) and in its children's (the variables
    in ``environ``, default ``os.environ``); returns a one-line account for the run's log."""
    env = os.environ if environ is None else environ
    if env.get("NORMLAB_MALLOC") == "default":
        for var, value in ENV.items():  # a parent normlab process's settings stop here (not passed further down)
            if env.get(var) == value:
                del env[var]
        return "malloc defaults (NORMLAB_MALLOC=default)"
    for var in USER_VARS:
        if env.get(var) and (var != "GLIBC_TUNABLES" or "glibc.malloc." in env[var]):
            return f"malloc {var}={env[var]} (from the environment)"
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return "malloc defaults (not glibc)"
    if apply:
        try:
            libc = ctypes.CDLL(None)
            ok = libc.mallopt(M_MMAP_THRESHOLD, THRESHOLD) == 1 and libc.mallopt(M_TRIM_THRESHOLD, THRESHOLD) == 1
        except (OSError, AttributeError):
            ok = False
        if not ok:
            return "malloc defaults (mallopt refused the thresholds)"
    env.update(ENV)
    return "malloc keeps freed memory for reuse (mmap and trim thresholds 1 GiB, set by normlab)"


def heap_policy_note() -> str:
    """The account ``set_heap_policy`` left in ``NORMLAB_HEAP_NOTE``, else what the environment says."""
    if os.environ.get("NORMLAB_HEAP_NOTE"):
        return os.environ["NORMLAB_HEAP_NOTE"]
    set_vars = [f"{v}={os.environ[v]}" for v in USER_VARS if os.environ.get(v)]
    return "malloc " + (", ".join(set_vars) if set_vars else "defaults")
