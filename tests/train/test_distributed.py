"""Data-parallel training (torchrun + DDP, gloo on loopback): same function and same updates as one process.

Reference: the same config trained in one process. fp32 tolerance: the all-reduced sums add the same numbers in a
different order, so per-step losses agree to LOSS_TOL and final weights to WEIGHT_TOL (measured: ~5e-7 and ~4e-6
after 8-16 steps; without the synchronised batch statistics BatchNorm's weights differ by ~2e-2).
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

from normlab.errors import EXIT_DIVERGED, EXIT_INTERRUPTED
from tests.helpers import (assert_bad_input, assert_same_weights, cli_env, kill_9_after, normlab, run_inproc, summary,
                           weights)

pytestmark = pytest.mark.slow
LOSS_TOL, WEIGHT_TOL = 2e-5, 2e-4
TIMEOUT = 300  # seconds per command: a hung rank fails the test instead of the suite
DDP = ["--set", "train.steps=16", "--set", "train.checkpoint_every=4", "--set", "train.eval_every=8",
       "--set", "train.log_every=1", "--set", "train.batch_size=6"]
# batch 7 over 2 processes (4 + 3 rows) and 2 micro-batches per step: the uneven split and accumulation
BN = ["--set", "train.steps=8", "--set", "train.checkpoint_every=4", "--set", "train.eval_every=8",
      "--set", "train.log_every=1", "--set", "train.batch_size=7", "--set", "train.grad_accum=2",
      "--set", "model.norm=batchnorm", "--set", "train.warmup_steps=3"]


def _train(out, args, cache, nproc=None):
    extra = ["--nproc", str(nproc)] if nproc else []
    r = normlab("train", "tiny", *args, "--out", str(out), *extra, "--json", cache=cache, timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)


def _losses(run_dir):
    return {r["step"]: r["loss"] for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
            if "loss" in r}


def assert_close_runs(a, b):
    la, lb = _losses(a), _losses(b)
    assert la.keys() == lb.keys() and len(la) > 4
    for s in la:
        assert abs(la[s] - lb[s]) <= LOSS_TOL, (s, la[s], lb[s])
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=0, atol=WEIGHT_TOL, msg=k)


def _no_ranks_left(out):
    """No process still has ``out`` on its command line (the ranks die with their launcher)."""
    time.sleep(0.5)
    r = subprocess.run(["pgrep", "-f", str(out)], capture_output=True, text=True)
    assert r.stdout.strip() == "", f"stray processes: {r.stdout}"


@pytest.fixture(scope="module")
def one_proc(tmp_path_factory, cache):
    out = tmp_path_factory.mktemp("ddp") / "one"
    _train(out, DDP, cache)
    return out


@pytest.fixture(scope="module")
def two_proc(tmp_path_factory, cache):
    out = tmp_path_factory.mktemp("ddp") / "two"
    s = _train(out, DDP, cache, nproc=2)
    assert s["status"] == "completed" and s["tokens_seen"] == 16 * 6 * 64
    return out


def test_two_processes_match_one_process(one_proc, two_proc):
    assert_close_runs(one_proc, two_proc)
    assert summary(two_proc)["val_bpb"] == pytest.approx(summary(one_proc)["val_bpb"], abs=1e-4)


def test_batchnorm_statistics_are_synchronised(tmp_path, cache):
    _train(tmp_path / "one", BN, cache)
    _train(tmp_path / "two", BN, cache, nproc=2)
    assert_close_runs(tmp_path / "one", tmp_path / "two")
    ra, rb = weights(tmp_path / "one"), weights(tmp_path / "two")
    keys = [k for k in ra if k.endswith("running_var")]
    assert keys, "no BatchNorm running statistics in the model"
    for k in keys:  # running statistics (buffers) follow the global batch too
        torch.testing.assert_close(ra[k], rb[k], rtol=0, atol=WEIGHT_TOL)


def test_kill_9_then_resume_equals_uninterrupted(two_proc, one_proc, tmp_path, cache):
    out = tmp_path / "killed"
    kill_9_after(["train", "tiny", *DDP, "--nproc", "2"], out, cache, 8)
    _no_ranks_left(out)
    assert not (out / "model.safetensors").exists(), "run finished before it could be killed"
    other = tmp_path / "resumed-1proc"
    shutil.copytree(out, other)
    r = normlab("train", "--resume", str(out), "--nproc", "2", cache=cache, timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr[-3000:]
    assert_same_weights(two_proc, out)  # same process count: bit for bit
    steps = [json.loads(l)["step"] for l in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(set(steps)), "metrics.jsonl has duplicated steps after resume"
    # a different process count with the same global batch: the same run to fp32 tolerance
    r = normlab("train", "--resume", str(other), cache=cache, timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr[-3000:]
    assert_close_runs(two_proc, other)
    assert_close_runs(one_proc, other)


def test_ctrl_c_stops_every_rank_and_records_once(tmp_path, cache):
    out = tmp_path / "interrupted"
    proc = subprocess.Popen([sys.executable, "-m", "normlab.cli", "train", "tiny", *DDP, "--set", "train.steps=400",
                             "--nproc", "2", "--out", str(out)], env=cli_env(cache), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + TIMEOUT
    while not (out / "checkpoints" / "step_00000004").exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)  # what a terminal Ctrl-C delivers to the launcher (ranks have their own session)
    try:
        stdout, _ = proc.communicate(timeout=TIMEOUT)
    finally:
        proc.kill()
    assert proc.returncode == EXIT_INTERRUPTED
    s = summary(out)
    assert s["status"] == "interrupted" and 4 <= s["step"] < 400
    assert stdout.count("status interrupted") == 1  # rank 0 alone reports
    ckpts = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert ckpts[-1] == f"step_{s['step']:08d}"  # the stop step was checkpointed
    _no_ranks_left(out)


def test_divergence_stops_every_rank(tmp_path, cache):
    out = tmp_path / "div"
    r = normlab("train", "tiny", *DDP, "--set", "train.loss_ceiling=3.0", "--nproc", "2", "--out", str(out),
                "--json", cache=cache, timeout=TIMEOUT)
    assert r.returncode == EXIT_DIVERGED, r.stderr[-3000:]
    s = json.loads(r.stdout)  # one JSON object: rank 0 alone prints
    assert s["status"] == "diverged" and s["step"] == 1 and summary(out)["status"] == "diverged"
    assert not (out / "model.safetensors").exists()


def test_rank_shares_cover_the_global_batch():
    from normlab.train.distributed import DistContext

    for world in (1, 2, 3, 4):
        for batch in range(world, 11):
            shares = [DistContext(rank=r, world=world).rows(batch) for r in range(world)]
            assert shares[0].start == 0 and shares[-1].stop == batch
            assert all(a.stop == b.start for a, b in zip(shares, shares[1:]))
            sizes = [s.stop - s.start for s in shares]
            assert max(sizes) - min(sizes) <= 1
            assert sum(DistContext(rank=r, world=world).weight(batch) for r in range(world)) == pytest.approx(1.0)


def test_bad_nproc(tmp_path, cache):
    r = run_inproc("train", "tiny", "--nproc", "0", "--out", str(tmp_path / "x"), cache=cache)
    assert_bad_input(r, "--nproc", "got 0")
    r = run_inproc("train", "tiny", "--nproc", "9", "--out", str(tmp_path / "y"), cache=cache)
    assert_bad_input(r, "train.batch_size (8)")
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()
