"""How many torch threads a training run uses (``train.threads: auto``), and the OpenMP wait policy.

A training step of a small model is thousands of small kernels; each one a parallel region when torch has more than
one thread. On a machine whose cores are busy with other processes, the second thread is rarely scheduled and every
region waits for it, while libgomp's idle threads spin (``benchmarks/omp_wait_policy.py``, docs/benchmarks.md:
200 small regions at 2 threads took 14.7 s with the default policy, 0.87 s with ``PASSIVE`` and 0.25 s at 1
thread, load 10 on 2 cores). So ``auto`` takes only the cores that are free, and more than one only when the
model's step is large enough to share.

- **usable cores**: the affinity mask (``os.sched_getaffinity``), capped by the cgroup CPU quota (cgroup v2
  ``cpu.max``, v1 ``cpu.cfs_quota_us / cpu.cfs_period_us``), at least 1.
- **free cores**: ``round(cores - load)`` over the machine's ``cores``, capped by the usable cores (0 when the
  machine is saturated); ``load`` is the larger of the 1-minute load average and the number of other tasks
  runnable right now (``/proc/loadavg``; the average lags a minute behind processes that just started). The
  average counts this process's own earlier runs too (a notebook that just trained, a benchmark): each run records
  its CPU use (``record_run``), and their share of the average -- the kernel's exponential average with a
  60-second time constant of a process that kept ``rate`` threads busy -- is taken off first (``own_load``).
- **size cap**: ``floor(flops_per_step / FLOPS_PER_THREAD)`` threads, at least 1 (``6 N`` FLOPs per token for
  ``N`` matrix parameters, nanoGPT's estimate, times the step's tokens).
- ``auto`` = ``max(1, min(free, usable, size cap))``.

OpenMP wait policy: after a parallel region libgomp's idle threads spin (for about 300k iterations by default)
before sleeping. Spinning pays only when every thread has a core to itself; on a busy machine the spinners take
the cores the other threads need (the numbers above). libgomp reads the variables once, when torch is imported,
so ``set_wait_policy`` must run before that: the ``normlab`` entry point calls it and sets ``PASSIVE``, also on a
machine that is idle at start, where it costs: at shape S, 30 training steps on 2 threads took 2.02 s with
``PASSIVE``, 1.26 s with libgomp's default spin and 1.35 s with a bounded spin (``GOMP_SPINCOUNT=30000``), against
2.05 s on one thread (idle 2-core AMD EPYC, ``benchmarks/omp_wait_policy.py --step S --spincount 30000`` and
``--threads 1``; docs/benchmarks.md). It stays passive because a run cannot know that the machine stays idle: with
two busy processes started beside it, the same 30 steps took 4.5 s passive, 5.3 s with the default spin and 16.3 s
with the bounded one (same command with ``--competitors 2``): spinning under contention is erratic and can
collapse. On a
machine you know stays dedicated, set ``GOMP_SPINCOUNT`` or ``OMP_WAIT_POLICY`` yourself: a value of either in the
environment is kept.
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path

# a thread beyond the first only for steps of at least this many FLOPs per thread. Measured on an idle 2-core AMD
# EPYC (benchmarks/nanogpt_speed.py's thread rows, docs/benchmarks.md, 2026-11-26, OMP_WAIT_POLICY=PASSIVE): at the
# demo shape (2.2 GFLOP per step) 2 threads ran 0.95x one thread, at S (4.1 GFLOP) 1.15x, at M (146 GFLOP) more.
# 1.5 GFLOP per thread puts the demo at one thread and S, M at two. (The earlier 1e9 came from a loaded machine.)
FLOPS_PER_THREAD = 1.5e9


@dataclass(frozen=True)
class CpuBudget:
    """What this process may use: ``cores`` on the machine, ``affinity`` cores in its mask, ``quota`` CPUs of
    cgroup quota (None: no limit) and the 1-minute ``load`` average."""

    cores: int
    affinity: int
    quota: float | None
    load: float

    @property
    def usable(self) -> int:
        cap = self.affinity if self.quota is None else min(self.affinity, math.floor(self.quota))
        return max(1, cap)

    @property
    def free(self) -> int:
        return max(0, min(self.usable, math.floor(self.cores - self.load + 0.5)))

    def text(self) -> str:
        quota = "none" if self.quota is None else f"{self.quota:g} CPUs"
        return (f"{self.usable} usable of {self.cores} cores (affinity {self.affinity}, cgroup quota {quota}), "
                f"load {self.load:.1f} -> {self.free} free")


def cgroup_quota(root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """CPUs this cgroup may use (cgroup v2 ``cpu.max`` "quota period", v1 ``cpu.cfs_quota_us`` /
    ``cpu.cfs_period_us``), or None when unlimited or unreadable."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        q = int((root / "cpu" / "cpu.cfs_quota_us").read_text())
        p = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return None if q <= 0 or p <= 0 else q / p
    except (OSError, ValueError):
        return None


def read_budget() -> CpuBudget:
    """This process's :class:`CpuBudget` now."""
    cores = os.cpu_count() or 1
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        affinity = cores
    return CpuBudget(cores, affinity, cgroup_quota(), current_load())


LOAD_TAU_S = 60.0  # the time constant of the kernel's 1-minute load average (an exponential average)
_OWN = [0.0, 0.0]  # this process's share of the 1-minute load average at a time: [value, time.monotonic()]


def record_run(wall_s: float, cpu_s: float, end: float | None = None) -> None:
    """Add a run of this process to its share of the load average: ``cpu_s`` CPU-seconds over ``wall_s`` seconds
    ending at ``end`` (``time.monotonic()``; default now) kept ``cpu_s / wall_s`` threads runnable. The kernel's
    average moves toward a constant load ``n`` as ``n (1 - exp(-t / 60))``, and decays by ``exp(-t / 60)`` after."""
    import time

    end = time.monotonic() if end is None else end
    if wall_s <= 0:
        return
    rate = max(0.0, cpu_s / wall_s)
    before = own_load(end - wall_s)
    decay = math.exp(-wall_s / LOAD_TAU_S)
    _OWN[0], _OWN[1] = before * decay + rate * (1.0 - decay), end


def own_load(at: float | None = None) -> float:
    """This process's share of the 1-minute load average at ``at`` (``time.monotonic()``; default now), from the
    runs ``record_run`` saw: 0 in a fresh process."""
    import time

    at = time.monotonic() if at is None else at
    return _OWN[0] * math.exp(-max(0.0, at - _OWN[1]) / LOAD_TAU_S)


def current_load(samples: int = 5, interval_s: float = 0.01, path: str = "/proc/loadavg") -> float:
    """The larger of the 1-minute load average less this process's own share (``own_load``) and the median number
    of *other* runnable tasks right now (``/proc/loadavg``'s ``running/total`` field, minus this process, over
    ``samples`` reads): the average lags a minute behind processes that just started."""
    import time

    try:
        avg, now = max(0.0, os.getloadavg()[0] - own_load()), []
        for i in range(samples):
            with open(path) as f:
                now.append(max(0, int(f.read().split()[3].split("/")[0]) - 1))
            if i + 1 < samples:
                time.sleep(interval_s)
        return max(avg, sorted(now)[len(now) // 2])
    except (AttributeError, OSError, ValueError, IndexError):
        try:
            return os.getloadavg()[0]
        except (AttributeError, OSError):
            return 0.0


def step_flops(cfg) -> float:
    """Approximate FLOPs of one training step of ``cfg`` (a RunConfig): ``6 N`` per token for the matrix
    parameters ``N`` of the blocks and the LM head (gated MLPs have three matrices), plus nanoGPT's attention term
    ``12 L d T``, times the step's tokens (``batch_size * grad_accum * context``)."""
    m, t = cfg.model, cfg.train
    hidden = m.mlp_hidden or int(m.mlp_ratio * m.width)
    if m.activation == "swiglu" and not m.mlp_hidden:  # 2/3 of the hidden size (normlab.model.blocks.MLP)
        hidden = int(2 * hidden / 3)
    mlp = (3 if m.activation == "swiglu" else 2) * m.width * hidden
    n = m.depth * (4 * m.width * m.width + mlp) + m.vocab_size * m.width
    tokens = t.batch_size * t.grad_accum * m.context
    return tokens * (6 * n + 12 * m.depth * m.width * m.context)


def decide_threads(flops: float, budget: CpuBudget) -> tuple[int, str]:
    """``(threads, reason)`` for a step of ``flops`` FLOPs under ``budget`` (the module docstring's rule)."""
    by_size = max(1, math.floor(flops / FLOPS_PER_THREAD))
    n = max(1, min(budget.free, budget.usable, by_size))
    if budget.free == 0:
        why = "no free core (one thread)"
    elif n < budget.free:
        why = f"the step is too small to share among more than {by_size} thread(s)"
    else:
        why = "one thread per free core"
    return n, f"auto: {why}; {budget.text()}; step {flops / 1e9:.1f} GFLOP"


def resolve_threads(value: int | str | None, flops: float, budget: CpuBudget | None = None,
                    override: int | None = None, environ: dict[str, str] | None = None) -> tuple[int | None, str]:
    """``train.threads`` -> ``(threads to set or None for torch's default, reason)``. ``override``: a count the
    caller planned (a sweep's workers x threads), which wins; with ``auto``, ``OMP_NUM_THREADS`` in the environment
    (a launcher's share, e.g. ``normlab train --nproc``) wins over the rule."""
    if override:
        return override, "set by the sweep's packing (workers x threads)"
    if value == "auto":
        env = (os.environ if environ is None else environ).get("OMP_NUM_THREADS", "")
        if env.strip().isdigit() and int(env) >= 1:
            return int(env), "auto: OMP_NUM_THREADS in the environment"
        return decide_threads(flops, budget or read_budget())
    if value is None:
        return None, "null: torch's default (every core)"
    return int(value), "set in the config"


def set_wait_policy(budget: CpuBudget | None = None, environ: dict[str, str] | None = None) -> str:
    """Set ``OMP_WAIT_POLICY=PASSIVE`` in ``environ`` (default ``os.environ``) unless the environment sets
    ``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT``; returns a one-line account. Effective only before torch is first
    imported. Passive also on a machine that is idle at start (the module docstring gives the measured cost and why)."""
    env = os.environ if environ is None else environ
    for var in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT"):
        if env.get(var):
            return f"{var}={env[var]} (from the environment)"
    budget = budget or read_budget()
    if environ is None and "torch" in sys.modules:
        return "OMP_WAIT_POLICY unset (torch was imported before normlab could set it)"
    env["OMP_WAIT_POLICY"] = "PASSIVE"
    return f"OMP_WAIT_POLICY=PASSIVE (set by normlab; {budget.free} of {budget.usable} usable cores free at start)"


def wait_policy_note() -> str:
    """The account ``set_wait_policy`` left in ``NORMLAB_WAIT_POLICY_NOTE``, else what the environment says."""
    set_vars = [f"{v}={os.environ[v]}" for v in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT") if os.environ.get(v)]
    return os.environ.get("NORMLAB_WAIT_POLICY_NOTE") or (", ".join(set_vars) or "OMP_WAIT_POLICY unset")
