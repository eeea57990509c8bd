"""The sweep executors without a cluster: bad input is one line, exit 2, nothing written; the Ray trainer child
takes the SIGINT its task forwards, and trains a stacked group as the in-process stacked executor does."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time

import pytest
import torch
import yaml

from normlab.api import make_config
from normlab.experiments.worker import train_group
from tests.helpers import assert_bad_input, cli_env, run_inproc, weights

FAST = {"train.steps": 2, "train.eval_every": 2, "train.log_every": 1}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def sweep_file(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump({"name": "b", "base": "tiny", "set": FAST, "seeds": [0]}))
    return f


def test_ray_missing_is_one_line(sweep_file, tmp_path, cache, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # as if Ray were not installed
    for cmd in (["compare", str(sweep_file), "--out", str(tmp_path / "o1")],
                ["claims", "--budget", "tiny", "--out", str(tmp_path / "o2")]):
        assert_bad_input(run_inproc(*cmd, "--executor", "ray", cache=cache), "pip install 'normlab[ray]'")
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o2").exists()


def test_bad_address_is_one_line(sweep_file, tmp_path, cache):
    assert_bad_input(run_inproc("compare", str(sweep_file), "--out", str(tmp_path / "o"), "--address", "127.0.0.1:1",
                                cache=cache), "--address needs --executor ray")
    pytest.importorskip("ray")
    port = _free_port()  # nothing listens there
    r = run_inproc("compare", str(sweep_file), "--out", str(tmp_path / "o"), "--executor", "ray", "--address",
                   f"127.0.0.1:{port}", cache=cache)
    assert_bad_input(r, "cannot reach a Ray cluster", f"127.0.0.1:{port}")
    assert_bad_input(run_inproc("compare", str(sweep_file), "--out", str(tmp_path / "o"), "--executor", "ray",
                                "--address", "nohost", cache=cache), "--address must be auto, HOST:PORT")
    r = run_inproc("compare", str(sweep_file), "--out", str(tmp_path / "o"), "--executor", "ray", "--address",
                   f"ray://127.0.0.1:{port}", cache=cache)  # the Ray client form is accepted, then checked
    assert_bad_input(r, "cannot reach a Ray cluster", f"ray://127.0.0.1:{port}")
    assert_bad_input(run_inproc("compare", str(sweep_file), "--out", str(tmp_path / "o"), "--executor", "ray",
                                "--address", "ray://h/x:1", cache=cache), "ray://HOST:PORT")
    assert_bad_input(run_inproc("claims", "--budget", "tiny", "--out", str(tmp_path / "o"), "--executor", "ray",
                                "--address", f"127.0.0.1:{port}", cache=cache), "cannot reach a Ray cluster")
    assert not (tmp_path / "o").exists()


def test_address_auto_follows_ray_address(sweep_file, tmp_path, cache, monkeypatch):
    """``auto`` is resolved as Ray resolves it: ``RAY_ADDRESS`` first (here a port where nothing listens)."""
    pytest.importorskip("ray")
    port = _free_port()
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")
    r = run_inproc("compare", str(sweep_file), "--out", str(tmp_path / "o"), "--executor", "ray", "--address",
                   "auto", cache=cache)
    assert_bad_input(r, "cannot reach a Ray cluster at --address auto", f"127.0.0.1:{port}")
    assert not (tmp_path / "o").exists()


class _FakeRay:
    """What ``plan_ray`` reads of a connected ``ray``: the cluster's total and its nodes (one dead)."""

    def __init__(self, nodes: list[tuple[bool, float]]):
        self._nodes = nodes

    def cluster_resources(self) -> dict:
        return {"CPU": float(sum(c for _, c in self._nodes))}  # Ray counts a dead node until it notices

    def nodes(self) -> list[dict]:
        return [{"Alive": alive, "Resources": {"CPU": c}} for alive, c in self._nodes]


def test_ray_tasks_never_ask_more_cpus_than_one_live_node_has():
    """A task asking for more CPUs than any live node has never schedules (the sweep would wait forever): with 1 run
    on 2 x 4-CPU nodes plus a dead 16-CPU one, the cluster total (24) gives 24 threads, capped at 4; with more runs
    than CPUs, 1 thread per task."""
    from normlab.experiments.executors import node_cpus, plan_ray
    from normlab.resources import plan_workers

    ray = _FakeRay([(True, 4), (True, 4), (False, 16)])
    assert node_cpus(ray) == 4
    assert plan_workers(1, None, 24) == (1, 24) and plan_ray(ray, 1, None) == (1, 4)
    assert plan_ray(ray, 3, None) == (3, 4) and plan_ray(ray, 100, None) == (24, 1)
    assert plan_ray(_FakeRay([(True, 1), (True, 1)]), 1, None) == (1, 1)  # the killed-worker-node test's cluster


def _trained_a_step(metrics):
    """Whether ``metrics.jsonl`` holds a record of a step after the initialisation's step 0."""
    if not metrics.is_file():
        return False
    lines = [line for line in metrics.read_text().splitlines() if line.endswith("}")]
    return any(json.loads(line).get("step", 0) > 0 for line in lines)


def test_the_ray_trainer_child_stops_on_sigint_though_its_worker_blocked_it(tmp_path, cache):
    """A Ray worker runs with SIGINT blocked, and a child inherits the blocked mask across exec: the trainer child
    (``python -m normlab.experiments.executors``) unblocks it, so the SIGINT its task forwards on the driver's first
    Ctrl-C checkpoints the run (exit 130, ``interrupted``, resumable) instead of waiting, pending, until the end."""
    cfg = make_config("tiny", {"train.steps": 100000, "train.checkpoint_every": 100000}).to_dict()
    (tmp_path / "cfg.json").write_text(json.dumps(cfg))
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "normlab.experiments.executors", str(run_dir),
                             str(tmp_path / "cfg.json"), "--threads", "1"], env=cli_env(cache),
                            preexec_fn=lambda: signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT}),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    metrics = run_dir / "metrics.jsonl"
    deadline = time.time() + 300
    # metrics.jsonl's first line is step 0 (the loss at initialisation, before any step): wait for a trained step,
    # or a SIGINT sent between the two lines stops the run at step 0, a true interrupt this test would misread.
    while not _trained_a_step(metrics) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=300)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert proc.returncode == 130 and summary["status"] == "interrupted", out[-2000:]
    assert 0 < summary["step"] < 100000


def test_the_ray_trainer_child_trains_a_stacked_group_as_the_in_process_executor(tmp_path, cache, one_thread):
    """``python -m normlab.experiments.executors A CFG_A B CFG_B --stacked`` (a Ray task's trainer for a stacked
    group) ends each member with the metrics, summary values and weights that ``worker.train_group`` (what the
    in-process stacked executor trains with) gives in this process, bit for bit; several runs without ``--stacked``
    are refused."""
    sets = {"train.steps": 4, "train.eval_every": 2, "train.eval_batches": 1, "train.log_every": 1,
            "train.checkpoint_every": 2, "train.track": [], "diag.every": 0, "model.width": 32, "model.context": 32,
            "train.batch_size": 4, "train.precision": "fp32", "train.compile": False, "train.threads": 1,
            "data.cache_dir": str(cache)}
    cfgs = [make_config("tiny", {**sets, "seed": s, "train.lr": lr}).to_dict() for s, lr in ((0, 0.003), (1, 0.006))]
    args = []
    for i, c in enumerate(cfgs):
        (tmp_path / f"c{i}.json").write_text(json.dumps(c))
        args += [str(tmp_path / "child" / f"r{i}"), str(tmp_path / f"c{i}.json")]
    cmd = [sys.executable, "-m", "normlab.experiments.executors", *args, "--threads", "1"]
    refused = subprocess.run(cmd, env=cli_env(cache), capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2 and "--stacked" in refused.stderr and not (tmp_path / "child").exists()
    child = subprocess.run([*cmd, "--stacked"], env=cli_env(cache), capture_output=True, text=True, timeout=300)
    assert child.returncode == 0, child.stdout[-2000:] + child.stderr[-2000:]
    assert "stacked group of 2" in child.stdout
    here = train_group([tmp_path / "here" / "r0", tmp_path / "here" / "r1"], cfgs, 1, [None, None])
    drop = {"elapsed_s", "tokens_per_s", "wall_s_per_token", "compile_s", "run_dir"}
    for i, s in enumerate(here):
        a, b = tmp_path / "child" / f"r{i}", tmp_path / "here" / f"r{i}"
        lines = [[{k: v for k, v in json.loads(x).items() if k not in drop} for x in (d / "metrics.jsonl").open()]
                 for d in (a, b)]
        assert lines[0] == lines[1] and len(lines[0]) == 5
        sa = json.loads((a / "summary.json").read_text())
        assert s["status"] == sa["status"] == "completed"
        assert {k: v for k, v in sa.items() if k not in drop} == {k: v for k, v in s.items() if k not in drop}
        wa, wb = weights(a), weights(b)
        assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa), f"member {i}"
    assert here[0]["val_bpb"] != here[1]["val_bpb"]  # two members, not one run twice
