"""normlab.train.threads: the ``train.threads: auto`` rule on constructed CPU budgets (load, affinity, cgroup
quota), the cgroup readers on constructed files, the wait policy, the FLOP estimate against a built model, and
the record a run leaves."""

from __future__ import annotations

import json

import pytest
from torch import nn

from normlab.config import load_config
from normlab.model import build_model
from normlab.train.threads import (
    FLOPS_PER_THREAD,
    CpuBudget,
    cgroup_quota,
    decide_threads,
    resolve_threads,
    set_wait_policy,
    step_flops,
)
from tests.helpers import run_inproc

BIG = 100 * FLOPS_PER_THREAD  # a step large enough for 100 threads
SMALL = 0.5 * FLOPS_PER_THREAD


@pytest.mark.parametrize("budget, flops, want", [
    (CpuBudget(cores=2, affinity=2, quota=None, load=0.1), SMALL, 1),  # idle laptop, small model
    (CpuBudget(cores=2, affinity=2, quota=None, load=0.1), BIG, 2),  # idle laptop, big model: every core
    (CpuBudget(cores=2, affinity=2, quota=None, load=12.0), BIG, 1),  # busy: nothing free
    (CpuBudget(cores=2, affinity=2, quota=None, load=1.2), BIG, 1),  # one core taken
    (CpuBudget(cores=16, affinity=16, quota=None, load=0.0), 3 * FLOPS_PER_THREAD, 3),  # size caps
    (CpuBudget(cores=64, affinity=4, quota=None, load=0.0), BIG, 4),  # affinity mask
    (CpuBudget(cores=64, affinity=64, quota=2.5, load=0.0), BIG, 2),  # cgroup quota 2.5 CPUs
    (CpuBudget(cores=64, affinity=64, quota=0.5, load=0.0), BIG, 1),  # fractional quota: still one thread
    (CpuBudget(cores=64, affinity=8, quota=None, load=61.0), BIG, 3),  # 3 cores free on a loaded server
])
def test_decide_threads(budget, flops, want):
    n, why = decide_threads(flops, budget)
    assert n == want
    assert why.startswith("auto: ") and f"load {budget.load:.1f}" in why and f"{budget.free} free" in why


def test_cgroup_quota_v2_and_v1(tmp_path):
    (tmp_path / "cpu.max").write_text("250000 100000\n")
    assert cgroup_quota(tmp_path) == 2.5
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert cgroup_quota(tmp_path) is None
    v1 = tmp_path / "v1"
    (v1 / "cpu").mkdir(parents=True)
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("150000\n")
    (v1 / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert cgroup_quota(v1) == 1.5
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    assert cgroup_quota(v1) is None
    assert cgroup_quota(tmp_path / "missing") is None


def test_wait_policy():
    busy, idle = CpuBudget(2, 2, None, 9.0), CpuBudget(2, 2, None, 0.2)
    env: dict[str, str] = {}
    assert "PASSIVE" in set_wait_policy(busy, env) and env == {"OMP_WAIT_POLICY": "PASSIVE"}
    env = {}
    assert "PASSIVE" in set_wait_policy(idle, env) and env == {"OMP_WAIT_POLICY": "PASSIVE"}  # idle now, not later
    for var, value in (("OMP_WAIT_POLICY", "ACTIVE"), ("GOMP_SPINCOUNT", "30000")):  # the user's choice is kept
        env = {var: value}
        assert "from the environment" in set_wait_policy(idle, env) and env == {var: value}


def test_resolve_threads_precedence():
    budget = CpuBudget(2, 2, None, 0.0)
    assert resolve_threads("auto", BIG, budget, override=3, environ={})[0] == 3  # a sweep's packing
    assert resolve_threads("auto", BIG, budget, environ={"OMP_NUM_THREADS": "1"}) == (
        1, "auto: OMP_NUM_THREADS in the environment")
    assert resolve_threads("auto", BIG, budget, environ={})[0] == 2
    assert resolve_threads(5, BIG, budget, environ={}) == (5, "set in the config")
    assert resolve_threads(None, BIG, budget, environ={})[0] is None


@pytest.mark.parametrize("activation", ["gelu", "swiglu"])
def test_step_flops_counts_the_built_models_matrices(activation):
    """6 x (every nn.Linear weight of the blocks + the LM head) per token + 12 L d T, times the step's tokens."""
    cfg = load_config("tiny", [f"model.activation={activation}", "model.vocab_size=50", "train.grad_accum=2"])
    model = build_model(cfg.model)
    n = sum(m.weight.numel() for name, m in model.named_modules() if isinstance(m, nn.Linear) and "blocks" in name)
    n += cfg.model.vocab_size * cfg.model.width
    m, t = cfg.model, cfg.train
    want = t.batch_size * 2 * m.context * (6 * n + 12 * m.depth * m.width * m.context)
    assert step_flops(cfg) == want


def test_run_records_threads(tmp_path, cache):
    out = tmp_path / "run"
    r = run_inproc("train", "tiny", "--set", "train.steps=2", "--set", "model.width=32", "--set", "model.context=32",
                   "--set", "train.eval_batches=1", "--set", "diag.every=0", "--set", "train.threads=1",
                   "--out", str(out), cache=cache)
    assert r.returncode == 0, r.stderr
    assert "threads 1 (set in the config" in r.stderr
    s = json.loads((out / "summary.json").read_text())
    assert s["threads"] == 1 and s["threads_reason"].startswith("set in the config")
    assert "threads: 1" in (out / "config.yaml").read_text()
    bad = run_inproc("train", "tiny", "--set", "train.threads=many", "--out", str(tmp_path / "bad"), cache=cache)
    assert bad.returncode == 2 and "train.threads" in bad.stderr and not (tmp_path / "bad").exists()


def test_current_load_reads_the_runnable_count(tmp_path, monkeypatch):
    """The instantaneous runnable count (minus this process) counts when it exceeds the 1-minute average."""
    import os

    from normlab.train import threads as T
    from normlab.train.threads import current_load

    monkeypatch.setattr(T, "_OWN", [0.0, 0.0])  # no earlier run of this process to take off
    f = tmp_path / "loadavg"
    f.write_text("0.00 0.00 0.00 1000/2000 12345\n")
    assert current_load(samples=3, interval_s=0.0, path=str(f)) == 999
    f.write_text("0.00 0.00 0.00 1/2000 12345\n")  # only this process runnable: the average decides
    assert current_load(samples=1, interval_s=0.0, path=str(f)) == os.getloadavg()[0]


def test_own_runs_are_taken_off_the_load_average(tmp_path, monkeypatch):
    """This process's earlier runs leave their share of the 1-minute load average, which the kernel updates every
    5 s as ``L = L e^(-5/60) + n (1 - e^(-5/60))`` (kernel/sched/loadavg.c, n = runnable tasks): ``own_load`` is that
    average for this process's runs alone, and ``current_load`` takes it off."""
    import math

    from normlab.train import threads as T

    monkeypatch.setattr(T, "_OWN", [0.0, 0.0])
    sim, e, want = 0.0, math.exp(-5 / 60), {}
    for t in range(945, 1151, 5):           # the kernel's update at every 5-second tick
        n = 1 if t <= 1000 else (2 if 1060 < t <= 1090 else 0)
        sim = sim * e + n * (1 - e)
        want[t] = sim
    T.record_run(60.0, 60.0, end=1000.0)    # one thread busy from 940 to 1000 s
    assert T.own_load(1000.0) == pytest.approx(want[1000], rel=1e-9)
    assert T.own_load(1060.0) == pytest.approx(want[1060], rel=1e-9)
    T.record_run(30.0, 60.0, end=1090.0)    # idle until 1060 s, then two threads for 30 s
    assert T.own_load(1090.0) == pytest.approx(want[1090], rel=1e-9)
    assert T.own_load(1150.0) == pytest.approx(want[1150], rel=1e-9)
    # a machine whose only load was this process's last run: the thread decision sees it free again
    f = tmp_path / "loadavg"
    f.write_text("0.00 0.00 0.00 1/2000 12345\n")
    monkeypatch.setattr(T, "own_load", lambda at=None: 0.8)
    monkeypatch.setattr(T.os, "getloadavg", lambda: (1.3, 1.0, 0.5))
    assert T.current_load(samples=1, interval_s=0.0, path=str(f)) == pytest.approx(0.5)
    monkeypatch.setattr(T, "own_load", lambda at=None: 2.0)
    assert T.current_load(samples=1, interval_s=0.0, path=str(f)) == 0.0


def test_cli_run_records_auto_threads_and_wait_policy(tmp_path, cache):
    """``normlab train`` (the entry point) with ``train.threads: auto`` under ``OMP_NUM_THREADS=1`` (the test
    environment): one thread, the reason says why, and the wait policy's account is in the reason."""
    from tests.helpers import normlab

    out = tmp_path / "run"
    normlab("train", "tiny", "--set", "train.steps=2", "--set", "model.width=32", "--set", "model.context=32",
            "--set", "train.eval_batches=1", "--set", "diag.every=0", "--out", str(out), cache=cache, check=True)
    s = json.loads((out / "summary.json").read_text())
    assert s["threads"] == 1 and s["threads_reason"].startswith("auto: OMP_NUM_THREADS in the environment")
    assert "OMP_WAIT_POLICY" in s["threads_reason"]
    assert "threads: auto" in (out / "config.yaml").read_text()  # decided anew on every start and resume
