"""How long a sweep would take on this machine, and the refusal of a CUDA sweep where there is no CUDA device.

A sweep whose runs ask for ``device: cuda`` (the ``scale`` preset) cannot train on a CPU-only machine; rather than
failing run by run, ``normlab compare`` refuses it before anything is written, in one line with the time it would take
here. The estimate:

    seconds = sum over runs of steps x step FLOPs  /  this machine's measured fp32 matmul rate

- step FLOPs: ``normlab.train.threads.step_flops``, nanoGPT's count (Karpathy; Chinchilla's appendix F, Hoffmann et
  al. 2022): ``6 N`` per token for the matrix parameters of the blocks and the LM head plus ``12 L d T`` for
  attention, times the step's tokens;
- the rate: :func:`matmul_rate`, square fp32 matrix products (``2 n^3`` FLOPs each) timed here for a fraction of a
  second at the current torch thread count.

A training step reaches well below a bare matmul's rate (norms, attention, the optimizer, small shapes), so the
estimate is a lower bound on the time, stated as such.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from normlab.config import stored_config
from normlab.errors import NormlabError
from normlab.train.threads import step_flops

PROBE_N = 512  # the probe's matrix size: square fp32 products of this size


def sweep_flops(configs: list[dict[str, Any]]) -> float:
    """Training FLOPs of the runs ``configs`` (full config dicts): sum of ``steps x step_flops``."""
    total = 0.0
    for c in configs:
        cfg = stored_config(c, "a planned run's config")
        total += cfg.train.steps * step_flops(cfg)
    return total


def matmul_rate(seconds: float = 0.3, n: int = PROBE_N) -> float:
    """FLOP/s of ``n x n`` fp32 matrix products on this CPU at the current torch thread count (after one warm-up
    product; at least 3 products, about ``seconds`` of them)."""
    with torch.random.fork_rng():
        torch.manual_seed(0)
        a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    reps, t0 = 0, time.perf_counter()
    while reps < 3 or time.perf_counter() - t0 < seconds:
        a @ b
        reps += 1
    return 2.0 * n ** 3 * reps / (time.perf_counter() - t0)


def human_time(seconds: float) -> str:
    """``3 h 20 min``, ``45 min``, ``2 d 4 h``."""
    m = seconds / 60
    if m < 60:
        return f"{max(m, 1):.0f} min"
    h = m / 60
    if h < 48:
        return f"{int(h)} h {int(m - 60 * int(h))} min"
    return f"{int(h // 24)} d {int(h % 24)} h"


def cuda_present() -> bool:
    """Whether torch sees a CUDA device (False without asking torch's CUDA runtime where no NVIDIA device node
    exists)."""
    if not any(Path("/dev").glob("nvidia[0-9]*")):
        return False
    return torch.cuda.is_available()


def check_device(name: str, configs: list[dict[str, Any]], *, rate: float | None = None) -> None:
    """Refuse (one-line NormlabError) a sweep named ``name`` whose runs ``configs`` ask for ``device: cuda`` when
    there is no CUDA device, with its estimated time on this CPU; nothing otherwise. ``rate``: FLOP/s to use instead
    of measuring (tests)."""
    cuda = [c for c in configs if c.get("device") == "cuda"]
    if not cuda or cuda_present():
        return
    flops = sweep_flops(configs)
    rate = rate or matmul_rate()
    raise NormlabError(
        f"sweep '{name}' asks for device: cuda ({len(cuda)} of {len(configs)} runs) and this machine has no CUDA "
        f"device; on this CPU it would take at least {human_time(flops / rate)} (estimated: {flops:.3g} training "
        f"FLOPs by the 6N + 12LdT count over {rate / 1e9:.1f} GFLOP/s, the fp32 rate of {PROBE_N}x{PROBE_N} matrix "
        f"products measured here at {torch.get_num_threads()} threads; training runs below that rate); run it on a "
        "machine with a GPU")
