"""normlab.train.threads: the ``train.threads: auto`` rule on constructed CPU budgets (load, affinity, cgroup
quota), the cgroup readers on constructed files, the wait policy, the FLOP estimate against a built model, and
the record a run leaves."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from torch import nn

from normlab.config import load_config
from normlab.model import build_model
from normlab.train.threads import (
    FLOPS_PER_THREAD,
    PRESSURE_BUSY,
    SPINCOUNT,
    CpuBudget,
    cgroup_quota,
    decide_cpu_plan,
    decide_threads,
    read_budget,
    read_pressure,
    resolve_threads,
    set_wait_policy,
    step_flops,
)
from tests.helpers import assert_bad_input, cli_env, run_inproc

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


PSI = "some avg10={some:.2f} avg60=1.00 avg300=1.00 total=123\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n"


def _machine(tmp_path, monkeypatch, *, running: int, pressure: float | None, avg1: float = 0.0,
             cores: int = 2) -> CpuBudget:
    """A budget read from constructed ``/proc/pressure/cpu`` and ``/proc/loadavg`` (``running`` tasks runnable
    besides this process), with ``cores`` cores in the affinity mask and no quota."""
    from normlab.train import threads as T

    monkeypatch.setattr(T, "_OWN", [0.0, 0.0])
    monkeypatch.setattr(T.os, "cpu_count", lambda: cores)
    monkeypatch.setattr(T.os, "sched_getaffinity", lambda pid: set(range(cores)))
    monkeypatch.setattr(T, "cgroup_quota", lambda root=None: None)
    monkeypatch.setattr(T.os, "getloadavg", lambda: (avg1, avg1, avg1))
    psi, loadavg = tmp_path / "cpu", tmp_path / "loadavg"
    if pressure is not None:
        psi.write_text(PSI.format(some=pressure))
    loadavg.write_text(f"{avg1:.2f} 0.00 0.00 {running + 1}/300 4242\n")
    return read_budget(pressure_path=str(psi), loadavg_path=str(loadavg))


def test_read_pressure(tmp_path):
    f = tmp_path / "cpu"
    f.write_text(PSI.format(some=37.5))
    assert read_pressure(str(f)) == 37.5
    assert read_pressure(str(tmp_path / "missing")) is None  # a kernel without PSI
    f.write_text("some garbage\n")
    assert read_pressure(str(f)) is None


@pytest.mark.parametrize("running, pressure, avg1, cores, want", [
    # idle: every usable core free and no CPU pressure -> a bounded spin and every core
    (0, 0.0, 0.0, 2, (2, True)),
    (0, None, 0.0, 2, (2, True)),  # no PSI: the load average decides
    (0, 3.0, 1.9, 2, (2, True)),   # PSI present: a 1-minute average left by a run that just ended does not count
    (0, 0.0, 0.0, 16, (16, True)),
    # contended -> passive and fewer threads
    (2, 0.0, 0.0, 2, (1, False)),   # a spinner per core: nothing free
    (1, 0.0, 0.0, 2, (1, False)),   # one core taken
    (0, PRESSURE_BUSY + 1, 0.0, 2, (1, False)),  # nothing runnable this instant, but tasks waited for a CPU
    (0, None, 1.7, 2, (1, False)),  # no PSI: the average says a core is taken (and none of it is this process's)
    (4, 0.0, 0.0, 16, (12, False)),
    (0, 50.0, 0.0, 16, (15, False)),
])
def test_cpu_plan_from_pressure_and_load(tmp_path, monkeypatch, running, pressure, avg1, cores, want):
    budget = _machine(tmp_path, monkeypatch, running=running, pressure=pressure, avg1=avg1, cores=cores)
    assert budget.pressure == pressure
    plan = decide_cpu_plan(budget, {})
    assert (plan.threads, plan.spin) == want
    if plan.spin:
        assert plan.env == {"GOMP_SPINCOUNT": str(SPINCOUNT)} and plan.reason.startswith(f"GOMP_SPINCOUNT={SPINCOUNT}")
        assert "idle" in plan.reason
    else:
        assert plan.env == {"OMP_WAIT_POLICY": "PASSIVE"} and "contended" in plan.reason
    assert f"load {budget.load:.1f}" in plan.reason and f"up to {plan.threads} thread(s)" in plan.reason
    assert plan.encode() == f"{want[0]} {'spin' if want[1] else 'passive'}"


@pytest.mark.parametrize("user, spin", [
    ({"OMP_WAIT_POLICY": "PASSIVE"}, False), ({"OMP_WAIT_POLICY": "active"}, True),
    ({"GOMP_SPINCOUNT": "0"}, False), ({"GOMP_SPINCOUNT": "1000000"}, True),
])
def test_the_users_openmp_settings_win(user, spin):
    for budget in (CpuBudget(2, 2, None, 0.0, 0.0), CpuBudget(2, 2, None, 2.0, 80.0)):  # idle, busy
        env = dict(user)
        note = set_wait_policy(budget, env)
        assert "from the environment" in note and "set by normlab" not in note
        assert {k: env[k] for k in user} == user
        assert not ({"OMP_WAIT_POLICY", "GOMP_SPINCOUNT"} - set(user)) & set(env)  # nothing of normlab's added
        assert env["NORMLAB_CPU_PLAN"] == f"{decide_cpu_plan(budget, {}).threads} {'spin' if spin else 'passive'}"


def test_set_wait_policy_writes_the_plan_and_keeps_a_parents():
    idle, busy = CpuBudget(2, 2, None, 0.0, 0.0), CpuBudget(2, 2, None, 2.0, 0.0)
    env: dict[str, str] = {}
    note = set_wait_policy(idle, env)
    assert env == {"GOMP_SPINCOUNT": str(SPINCOUNT), "NORMLAB_CPU_PLAN": "2 spin", "NORMLAB_WAIT_POLICY_NOTE": note}
    env = {}
    note = set_wait_policy(busy, env)
    assert env == {"OMP_WAIT_POLICY": "PASSIVE", "NORMLAB_CPU_PLAN": "1 passive", "NORMLAB_WAIT_POLICY_NOTE": note}
    child = dict(env)  # a child of that process (a sweep worker, a DDP rank) keeps its parent's decision
    assert set_wait_policy(idle, child) == note and child == env


CHILD = ("import os, sys, json; before = 'torch' in sys.modules; import torch; "
         "print(json.dumps({'before': before, **{k: os.environ.get(k) for k in "
         "('OMP_WAIT_POLICY', 'GOMP_SPINCOUNT', 'NORMLAB_CPU_PLAN', 'NORMLAB_WAIT_POLICY_NOTE')}}))")
PARENT = ("import os, sys, json, subprocess; from normlab.cli import set_process_policies; "
          "assert 'torch' not in sys.modules; set_process_policies(); "
          f"out = subprocess.run([sys.executable, '-c', {CHILD!r}], capture_output=True, text=True, check=True); "
          "print(json.dumps({'torch_in_parent': 'torch' in sys.modules, 'child': json.loads(out.stdout), "
          "**{k: os.environ.get(k) for k in ('OMP_WAIT_POLICY', 'GOMP_SPINCOUNT', 'NORMLAB_CPU_PLAN')}}))")


def test_a_child_process_inherits_the_plan_before_torch_is_imported():
    """The entry point's policies run before torch is imported; a child started afterwards (a sweep worker) has
    the variables in its environment before it imports torch (libgomp reads them then)."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT") and not k.startswith("NORMLAB_")}
    r = subprocess.run([sys.executable, "-c", PARENT], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    plan, kid = got["NORMLAB_CPU_PLAN"], got["child"]
    assert not got["torch_in_parent"] and not kid["before"]
    assert kid["NORMLAB_CPU_PLAN"] == plan and "set by normlab" in kid["NORMLAB_WAIT_POLICY_NOTE"]
    if plan.endswith(" spin"):
        assert kid["GOMP_SPINCOUNT"] == str(SPINCOUNT) and kid["OMP_WAIT_POLICY"] is None
    else:
        assert kid["OMP_WAIT_POLICY"] == "PASSIVE" and kid["GOMP_SPINCOUNT"] is None
    # the user's own setting reaches the child unchanged
    r = subprocess.run([sys.executable, "-c", PARENT], capture_output=True, text=True, timeout=300,
                       env={**env, "OMP_WAIT_POLICY": "ACTIVE"})
    assert r.returncode == 0, r.stderr
    kid = json.loads(r.stdout)["child"]
    assert kid["OMP_WAIT_POLICY"] == "ACTIVE" and kid["GOMP_SPINCOUNT"] is None
    assert "OMP_WAIT_POLICY=ACTIVE (from the environment)" in kid["NORMLAB_WAIT_POLICY_NOTE"]


def test_resolve_threads_precedence(capsys):
    budget = CpuBudget(2, 2, None, 0.0)
    assert resolve_threads("auto", BIG, budget, override=3, environ={})[0] == 3  # a sweep's packing
    assert resolve_threads(1, BIG, budget, override=2, environ={}, usable=2) == (1, "set in the config")  # not 2
    assert resolve_threads("auto", BIG, budget, environ={"OMP_NUM_THREADS": "1"}) == (
        1, "auto: OMP_NUM_THREADS in the environment")
    assert resolve_threads("auto", BIG, budget, environ={})[0] == 2
    assert resolve_threads(2, BIG, budget, environ={}, usable=2) == (2, "set in the config")
    assert resolve_threads(None, BIG, budget, environ={})[0] is None
    # the start's plan bounds auto (read without a budget: the plan was made at start)
    assert resolve_threads("auto", BIG, environ={"NORMLAB_CPU_PLAN": "1 passive"})[0] == 1
    n, why = resolve_threads("auto", BIG, environ={"NORMLAB_CPU_PLAN": "2 spin"})
    assert n == 2 and "2 core(s) planned at start" in why
    assert resolve_threads("auto", SMALL, environ={"NORMLAB_CPU_PLAN": "2 spin"})[0] == 1  # the size cap
    assert capsys.readouterr().err == ""
    # more threads than usable cores: clamped, with one warning line
    n, why = resolve_threads(4096, BIG, budget, environ={}, usable=2)
    assert (n, why) == (2, "set in the config (4096), clamped to the 2 usable core(s)")
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("warning: train.threads=4096 is more than the 2 usable core(s)")


def test_packing_never_overrides_an_explicit_thread_count(tmp_path, cache, monkeypatch):
    """A sweep worker hands its packing's count to the loop (``threads=2``, what ``--workers 1`` plans on 2 cores):
    ``train.threads: 1`` keeps 1 (the summary and the thread count the run used), ``auto`` takes the packing."""
    import torch

    from normlab.train.loop import train

    monkeypatch.setenv("NORMLAB_CACHE_DIR", str(cache))
    base = ["train.steps=2", "model.width=32", "model.context=32", "train.eval_batches=1", "diag.every=0"]
    n = torch.get_num_threads()
    try:
        one = train(load_config("tiny", [*base, "train.threads=1"]), tmp_path / "one", quiet=True, threads=2)
        assert one["threads"] == 1 and one["threads_reason"].startswith("set in the config")
        auto = train(load_config("tiny", [*base, "train.threads=auto"]), tmp_path / "auto", quiet=True, threads=2)
        assert auto["threads"] == 2 and auto["threads_reason"].startswith("auto: set by the sweep's packing")
    finally:
        torch.set_num_threads(n)


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
                   "--out", str(out), "--verbose", cache=cache)
    assert r.returncode == 0, r.stderr
    assert "threads 1 (set in the config" in r.stderr
    s = json.loads((out / "summary.json").read_text())
    assert s["threads"] == 1 and s["threads_reason"].startswith("set in the config")
    assert "threads: 1" in (out / "config.yaml").read_text()
    bad = run_inproc("train", "tiny", "--set", "train.threads=many", "--out", str(tmp_path / "bad"), cache=cache)
    assert bad.returncode == 2 and "train.threads" in bad.stderr and not (tmp_path / "bad").exists()


def test_more_threads_than_usable_cores_are_clamped_with_a_warning(tmp_path, cache):
    """``train.threads=4096`` on a machine of a few cores used to start 4096 OpenMP threads (and stall)."""
    from normlab.train.threads import usable_cores

    out, cap = tmp_path / "run", usable_cores()
    r = run_inproc("train", "tiny", "--set", "train.steps=2", "--set", "model.width=32", "--set", "model.context=32",
                   "--set", "train.eval_batches=1", "--set", "diag.every=0", "--set", "train.threads=4096",
                   "--out", str(out), cache=cache)
    assert r.returncode == 0, r.stderr
    warning = [ln for ln in r.stderr.splitlines() if ln.startswith("warning: train.threads")]
    assert warning == [f"warning: train.threads=4096 is more than the {cap} usable core(s) of this process; "
                       f"using {cap}"]
    s = json.loads((out / "summary.json").read_text())
    assert s["threads"] == cap and s["threads_reason"].startswith(f"set in the config (4096), clamped to the {cap}")


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
    note = s["threads_reason"].split("; ", 1)[1]  # the start's plan: passive or a bounded spin, and why
    assert note.startswith(("OMP_WAIT_POLICY=PASSIVE (set by normlab: contended", f"GOMP_SPINCOUNT={SPINCOUNT} "
                            "(set by normlab: idle")) or "(from the environment)" in note, note
    assert "threads: auto" in (out / "config.yaml").read_text()  # decided anew on every start and resume


@pytest.mark.parametrize("value, want", [("5000", None), ("99999", None), ("1", "1"), ("1,1", "1,1")])
def test_thread_variables_above_the_usable_cores_are_clamped_before_torch_loads(value, want):
    from normlab.train.threads import check_thread_variables, usable_cores

    env = {"OMP_NUM_THREADS": value, "MKL_NUM_THREADS": value}
    notes = check_thread_variables(env)
    cap = str(usable_cores())
    assert env["OMP_NUM_THREADS"] == (want or cap) and env["MKL_NUM_THREADS"] == (want or cap)
    assert len(notes) == (0 if want else 2) and all(f"is more than the {cap} usable core(s)" in n for n in notes)


@pytest.mark.parametrize("value", ["lots", "0", "-1", "2.5", "1" * 5001, "4,x"])
def test_a_thread_variable_that_is_no_positive_integer_is_refused(value):
    from normlab.errors import NormlabError
    from normlab.train.threads import check_thread_variables

    with pytest.raises(NormlabError, match="OMP_NUM_THREADS must be a positive integer") as e:
        check_thread_variables({"OMP_NUM_THREADS": value})
    assert "\n" not in str(e.value) and len(str(e.value)) < 200


def test_omp_num_threads_5000_trains_on_the_usable_cores_and_lots_is_refused(tmp_path, cache):
    """libgomp aborted ("Thread creation failed") or stalled on 5000 threads before normlab said anything: the
    command clamps the variable before torch is imported, says so in one line, and the run uses the usable cores;
    a value that is no number is one line and exit 2, nothing written."""
    from normlab.train.threads import usable_cores

    def go(value, out):
        env = {**cli_env(cache), "OMP_NUM_THREADS": value}
        return subprocess.run([sys.executable, "-m", "normlab", "train", "tiny", "--set", "train.steps=2",
                               "--set", "train.eval_every=2", "--out", str(out)], capture_output=True, text=True,
                              env=env, timeout=300)

    ok = go("5000", tmp_path / "ok")
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert f"note: OMP_NUM_THREADS=5000 is more than the {usable_cores()} usable core(s)" in ok.stderr
    assert json.loads((tmp_path / "ok" / "summary.json").read_text())["threads"] <= usable_cores()
    assert_bad_input(go("lots", tmp_path / "bad"), "OMP_NUM_THREADS must be a positive integer", "'lots'")
    assert not (tmp_path / "bad").exists()
