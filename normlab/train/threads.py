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
- ``auto`` = ``max(1, min(planned, size cap))``, ``planned`` the cores of the start's plan below.
- a number is the count, clamped to the usable cores with a one-line warning (thousands of threads on two cores
  stall); a sweep's packing (workers x threads) replaces ``auto`` only, never a number.

OpenMP wait policy and thread count, decided together once, before torch is imported (``set_wait_policy``, which the
``normlab`` entry point calls): after a parallel region libgomp's idle threads spin (about 300k iterations by
default) before sleeping. Spinning pays only when every thread has a core to itself: at shape S on an idle 2-core
machine, 30 training steps on 2 threads took 1.26 s with libgomp's spin, 1.35 s with a bounded one
(``GOMP_SPINCOUNT=30000``) and 2.02 s passive, against 2.05 s on one thread; on a busy machine the spinners take the
cores the other threads need (200 small regions: 14.7 s spinning, 0.87 s passive, 0.25 s on one thread), and under
two competitors spinning was erratic (``benchmarks/omp_wait_policy.py``, docs/benchmarks.md). So, from what the
machine is doing at start (``decide_cpu_plan``):

- **idle** -- every usable core free (the runnable count above) and, where the kernel reports it
  (``/proc/pressure/cpu``, PSI), no task waited for a CPU more than ``PRESSURE_BUSY`` percent of the last 10 s:
  a bounded spin (``GOMP_SPINCOUNT=SPINCOUNT``) and every usable core for ``auto``;
- **contended** -- ``OMP_WAIT_POLICY=PASSIVE`` and fewer threads: the free cores, at most ``usable - 1``, at least 1.

With PSI the load is the runnable count now (PSI sees the contention the 1-minute average would report a minute late,
and not a normlab run that just ended); without it, the 1-minute average less this process's own runs as above.
``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT`` in the environment is kept (the user's choice), and so is
``OMP_NUM_THREADS`` for ``auto``. The decision travels to the run and to child processes (sweep workers, DDP ranks)
in ``NORMLAB_CPU_PLAN`` (``"<threads> spin|passive"``) and its account in ``NORMLAB_WAIT_POLICY_NOTE``; the run's
log line and ``summary.json`` (``threads_reason``) carry both. A decision lasts the process: libgomp reads the
variables once, so a machine that becomes busy later keeps the bounded spin.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from normlab.errors import NormlabError

# a thread beyond the first only for steps of at least this many FLOPs per thread. Measured on an idle 2-core AMD
# EPYC (benchmarks/nanogpt_speed.py's thread rows, docs/benchmarks.md, 2026-11-26, OMP_WAIT_POLICY=PASSIVE): at the
# demo shape (2.2 GFLOP per step) 2 threads ran 0.95x one thread, at S (4.1 GFLOP) 1.15x, at M (146 GFLOP) more.
# 1.5 GFLOP per thread puts the demo at one thread and S, M at two. (The earlier 1e9 came from a loaded machine.)
FLOPS_PER_THREAD = 1.5e9


@dataclass(frozen=True)
class CpuBudget:
    """What this process may use: ``cores`` on the machine, ``affinity`` cores in its mask, ``quota`` CPUs of
    cgroup quota (None: no limit), the ``load`` (tasks of others runnable, see the module docstring) and
    ``pressure``, PSI's ``some avg10`` (percent of the last 10 s some task waited for a CPU; None: not reported)."""

    cores: int
    affinity: int
    quota: float | None
    load: float
    pressure: float | None = None

    @property
    def usable(self) -> int:
        cap = self.affinity if self.quota is None else min(self.affinity, math.floor(self.quota))
        return max(1, cap)

    @property
    def free(self) -> int:
        return max(0, min(self.usable, math.floor(self.cores - self.load + 0.5)))

    def text(self) -> str:
        quota = "none" if self.quota is None else f"{self.quota:g} CPUs"
        psi = "" if self.pressure is None else f", cpu pressure {self.pressure:.0f}%"
        return (f"{self.usable} usable of {self.cores} cores (affinity {self.affinity}, cgroup quota {quota}), "
                f"load {self.load:.1f} -> {self.free} free{psi}")


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


def read_pressure(path: str = "/proc/pressure/cpu") -> float | None:
    """PSI's ``some avg10`` for the CPU (percent of the last 10 s in which some runnable task waited for a CPU;
    Linux >= 4.20 with PSI on), or None where the file is missing or unreadable."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("some "):
                    value = float(dict(kv.split("=", 1) for kv in line.split()[1:])["avg10"])
                    return value if math.isfinite(value) and value >= 0 else None
    except (OSError, ValueError, KeyError):
        pass
    return None


def read_budget(pressure_path: str = "/proc/pressure/cpu", loadavg_path: str = "/proc/loadavg") -> CpuBudget:
    """This process's :class:`CpuBudget` now: with PSI the load is the runnable count of other tasks now, else
    ``current_load`` (the 1-minute average less this process's own runs, or the runnable count if larger)."""
    pressure = read_pressure(pressure_path)
    load = current_load(path=loadavg_path, average=pressure is None)
    return dataclasses.replace(static_budget(), load=load, pressure=pressure)


def static_budget() -> CpuBudget:
    """This process's cores, affinity and quota, with no load read (``load`` 0)."""
    cores = os.cpu_count() or 1
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        affinity = cores
    return CpuBudget(cores, affinity, cgroup_quota(), 0.0)


def usable_cores() -> int:
    """The cores this process may use (affinity mask capped by the cgroup quota), without reading the load."""
    return static_budget().usable


THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")  # read by libgomp / MKL when torch loads them


def check_thread_variables(environ: dict[str, str] | None = None) -> list[str]:
    """Before torch is imported (libgomp starts its pool from these then): ``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS``
    must be positive integers (OpenMP's comma list of them allowed); anything else is a one-line NormlabError. A
    first value above this process's usable cores is clamped to them in ``environ`` (default ``os.environ``, so
    child processes inherit it), as ``train.threads`` is: thousands of threads on a few cores stall, and libgomp
    aborts creating ~5000. Returns the one-line notes to print, one per clamped variable."""
    env = os.environ if environ is None else environ
    notes = []
    for name in THREAD_VARS:
        text = env.get(name, "").strip()
        if not text:
            continue
        parts = text.split(",")
        if not all(p.strip().isdigit() and len(p.strip()) <= 6 and int(p) >= 1 for p in parts):
            raise NormlabError(f"{name} must be a positive integer (or OpenMP's comma list of them) of at most "
                               f"6 digits, got {text[:40]!r}")
        cap = usable_cores()
        if int(parts[0]) > cap:
            env[name] = ",".join([str(cap), *parts[1:]])
            notes.append(f"note: {name}={int(parts[0])} is more than the {cap} usable core(s) of this process; "
                         f"using {cap}")
    return notes


LOAD_TAU_S = 60.0  # the time constant of the kernel's 1-minute load average (an exponential average)
_OWN = [0.0, 0.0]  # this process's share of the 1-minute load average at a time: [value, time.monotonic()]


def record_run(wall_s: float, cpu_s: float, end: float | None = None) -> None:
    """Add a run of this process to its share of the load average: ``cpu_s`` CPU-seconds over ``wall_s`` seconds
    ending at ``end`` (``time.monotonic()``; default now) kept ``cpu_s / wall_s`` threads runnable. The kernel's
    average moves toward a constant load ``n`` as ``n (1 - exp(-t / 60))``, and decays by ``exp(-t / 60)`` after."""
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
    at = time.monotonic() if at is None else at
    return _OWN[0] * math.exp(-max(0.0, at - _OWN[1]) / LOAD_TAU_S)


def current_load(samples: int = 5, interval_s: float = 0.01, path: str = "/proc/loadavg",
                 average: bool = True) -> float:
    """The larger of the 1-minute load average less this process's own share (``own_load``) and the median number
    of *other* runnable tasks right now (``/proc/loadavg``'s ``running/total`` field, minus this process, over
    ``samples`` reads): the average lags a minute behind processes that just started. ``average=False``: the
    runnable count alone (where PSI reports contention)."""
    try:
        avg, now = (max(0.0, os.getloadavg()[0] - own_load()) if average else 0.0), []
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


PRESSURE_BUSY = 10.0
"""PSI ``some avg10`` (percent) at or above which the CPU counts as contended even when no core looks taken."""
SPINCOUNT = 30000
"""libgomp's spin iterations before an idle thread sleeps, when normlab chooses to spin (its default is 300k)."""
WAIT_VARS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


@dataclass(frozen=True)
class CpuPlan:
    """The start's decision: ``threads`` the most ``auto`` uses, ``spin`` whether idle OpenMP threads spin,
    ``env`` the variables normlab sets (empty when the environment's win) and ``reason`` the account."""

    threads: int
    spin: bool
    env: dict[str, str]
    reason: str

    def encode(self) -> str:
        """``NORMLAB_CPU_PLAN``'s value: ``"<threads> spin|passive"``."""
        return f"{self.threads} {'spin' if self.spin else 'passive'}"


def parse_plan(text: str) -> tuple[int, bool] | None:
    """``(threads, spin)`` from ``NORMLAB_CPU_PLAN``'s value, or None when it is not ``"<n >= 1> spin|passive"``."""
    parts = text.split()
    if len(parts) != 2 or not parts[0].isdigit() or int(parts[0]) < 1 or parts[1] not in ("spin", "passive"):
        return None
    return int(parts[0]), parts[1] == "spin"


def decide_cpu_plan(budget: CpuBudget, environ: dict[str, str]) -> CpuPlan:
    """The wait policy and the most threads ``auto`` takes, for ``budget`` (the module docstring's rule). A
    ``OMP_WAIT_POLICY`` / ``GOMP_SPINCOUNT`` in ``environ`` wins: nothing is set and the threads follow the same
    rule. Pure: reads nothing but its arguments, sets nothing."""
    busy_psi = budget.pressure is not None and budget.pressure >= PRESSURE_BUSY
    idle = budget.free >= budget.usable and not busy_psi
    threads = budget.usable if idle else max(1, min(budget.free, budget.usable - 1))
    why = (f"idle: {budget.text()}" if idle else
           f"contended ({'cpu pressure' if busy_psi and budget.free >= budget.usable else 'cores taken'}): "
           f"{budget.text()}")
    user = [f"{v}={environ[v]}" for v in WAIT_VARS if environ.get(v)]
    if user:
        policy = environ.get("OMP_WAIT_POLICY", "").strip().upper()
        spin = policy != "PASSIVE" and environ.get("GOMP_SPINCOUNT", "").strip() != "0"
        return CpuPlan(threads, spin, {}, f"{', '.join(user)} (from the environment); {why}")
    if idle:
        env = {"GOMP_SPINCOUNT": str(SPINCOUNT)}
    else:
        env = {"OMP_WAIT_POLICY": "PASSIVE"}
    setting = ", ".join(f"{k}={v}" for k, v in env.items())
    return CpuPlan(threads, idle, env, f"{setting} (set by normlab: {why}; up to {threads} thread(s))")


def set_wait_policy(budget: CpuBudget | None = None, environ: dict[str, str] | None = None) -> str:
    """Decide the start's :class:`CpuPlan` (``decide_cpu_plan`` on ``budget``, default read now) and put it in
    ``environ`` (default ``os.environ``, so child processes inherit it): its variables, ``NORMLAB_CPU_PLAN`` and the
    account in ``NORMLAB_WAIT_POLICY_NOTE``, which it returns. Effective only before torch is first imported; a plan
    already in the environment (a normlab parent's) is kept."""
    env = os.environ if environ is None else environ
    if env.get("NORMLAB_CPU_PLAN") and parse_plan(env["NORMLAB_CPU_PLAN"]) and env.get("NORMLAB_WAIT_POLICY_NOTE"):
        return env["NORMLAB_WAIT_POLICY_NOTE"]
    plan = decide_cpu_plan(budget or read_budget(), env)
    note = plan.reason
    if environ is None and "torch" in sys.modules:
        note = f"wait policy unchanged (torch was imported before normlab could set it); {plan.reason}"
    else:
        env.update(plan.env)
    env["NORMLAB_CPU_PLAN"] = plan.encode()
    env["NORMLAB_WAIT_POLICY_NOTE"] = note
    return note


def decide_threads(flops: float, budget: CpuBudget, planned: int | None = None) -> tuple[int, str]:
    """``(threads, reason)`` for a step of ``flops`` FLOPs: at most ``planned`` (the start's plan; default the
    plan ``decide_cpu_plan`` makes for ``budget``) and the size cap (the module docstring's rule)."""
    by_size = max(1, math.floor(flops / FLOPS_PER_THREAD))
    cores = decide_cpu_plan(budget, {}).threads if planned is None else planned
    n = max(1, min(cores, by_size))
    if n < cores:
        why = f"the step is too small to share among more than {by_size} thread(s)"
    elif cores == 1:
        why = "one core planned (one thread)"
    else:
        why = "one thread per planned core"
    where = budget.text() if planned is None else f"{planned} core(s) planned at start"
    return n, f"auto: {why}; {where}; step {flops / 1e9:.1f} GFLOP"


def resolve_threads(value: int | str | None, flops: float, budget: CpuBudget | None = None,
                    override: int | None = None, environ: dict[str, str] | None = None,
                    usable: int | None = None) -> tuple[int | None, str]:
    """``train.threads`` -> ``(threads to set or None for torch's default, reason)``. A number is kept, clamped to
    the ``usable`` cores (default: this process's; a one-line warning on stderr). ``override``: a count the caller
    planned (a sweep's workers x threads), which replaces ``auto`` only. With ``auto``, ``OMP_NUM_THREADS`` in the
    environment (a launcher's share, e.g. ``normlab train --nproc``) wins over the rule, and the start's plan
    (``NORMLAB_CPU_PLAN``) bounds it; without a plan the budget is read now."""
    env = os.environ if environ is None else environ
    if value == "auto":
        if override:
            return override, "auto: set by the sweep's packing (workers x threads)"
        omp = env.get("OMP_NUM_THREADS", "")
        if omp.strip().isdigit() and int(omp) >= 1:
            return int(omp), "auto: OMP_NUM_THREADS in the environment"
        plan = parse_plan(env.get("NORMLAB_CPU_PLAN", ""))
        if plan is not None and budget is None:
            return decide_threads(flops, static_budget(), planned=plan[0])
        return decide_threads(flops, budget or read_budget())
    if value is None:
        return None, "null: torch's default"
    n, cap = int(value), usable or usable_cores()
    if n > cap:
        print(f"warning: train.threads={n} is more than the {cap} usable core(s) of this process; using {cap}",
              file=sys.stderr)
        return cap, f"set in the config ({n}), clamped to the {cap} usable core(s)"
    return n, "set in the config"


def wait_policy_note() -> str:
    """The account ``set_wait_policy`` left in ``NORMLAB_WAIT_POLICY_NOTE``, else what the environment says."""
    set_vars = [f"{v}={os.environ[v]}" for v in WAIT_VARS if os.environ.get(v)]
    return os.environ.get("NORMLAB_WAIT_POLICY_NOTE") or (", ".join(set_vars) or "OMP_WAIT_POLICY unset")
