"""Data-parallel training (torchrun + DDP, gloo on loopback): same function and same updates as one process.

Reference: the same config trained in one process. fp32 tolerance: the all-reduced sums add the same numbers in a
different order, so per-step losses agree to LOSS_TOL and final weights to WEIGHT_TOL (measured: ~5e-7 and ~4e-6
after 8-16 steps; without the synchronised batch statistics BatchNorm's weights differ by ~2e-2).

Reads deferred to read points (the accelerator policy, forced on the CPU by tests/train/rank_probe.py): the same
2-rank run bit for bit as 2 ranks read at every step, a Ctrl-C and a divergence between read points included.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

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


# -- reads deferred to read points, as on an accelerator (ranks of tests/train/rank_probe.py) ----------------------

ROOT = Path(__file__).resolve().parents[2]
# read points: every 5th step (logged), the checkpoints every 8th, a diagnostic step every 12th, the last
DEFER = ["--set", "train.steps=40", "--set", "train.log_every=5", "--set", "train.checkpoint_every=8",
         "--set", "train.eval_every=40", "--set", "train.batch_size=6", "--set", "diag.every=12",
         "--set", "train.eval_batches=1"]
# lr 3 without clipping: loss spikes at steps 3 and 4, diverged at 4, before the first read point (step 10)
DIVERGE = ["--set", "train.steps=40", "--set", "train.log_every=10", "--set", "train.eval_every=40",
           "--set", "train.checkpoint_every=40", "--set", "diag.every=0", "--set", "model.depth=1",
           "--set", "train.lr=3", "--set", "train.warmup_steps=10", "--set", "train.grad_clip=0",
           "--set", "diag.spike_factor=1.01", "--set", "diag.spike_window=2"]
ALLOWED = {"tolist loop.py:get_batch", "optimizer.py:_get_value"}  # window offsets, AdamW's CPU step counters


def _read_point(i, every=(5, 8, 12, 40)):
    """Whether step ``i`` (0-based) of a DEFER run is a read point (normlab.train.runstate.RunState.read_point)."""
    return any((i + 1) % k == 0 for k in every)


def _probe_cmd(argv, ranks, *, defer, cache, env=None):
    """``normlab ARGV`` on 2 torchrun ranks of tests/train/rank_probe.py (reads deferred or not; ``env``: more
    variables), each writing ``ranks/rank<R>.json``; the launcher set up as ``normlab.train.distributed.launch``
    does."""
    ranks.mkdir(parents=True, exist_ok=True)
    env = cli_env(cache) | {"PYTHONPATH": str(ROOT), "GLOO_SOCKET_IFNAME": "lo", "NORMLAB_TEST_RANK_DIR": str(ranks),
                            "NORMLAB_TEST_DEFER": "1" if defer else "0"} | (env or {})
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
           "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0", "--max-restarts", "0",
           "-m", "tests.train.rank_probe", *argv]
    return cmd, env


def _probe(argv, ranks, *, defer, cache, env=None):
    """Run ``normlab ARGV`` on 2 probed ranks; returns each rank's ``rank<R>.json`` with its reads by step."""
    cmd, env = _probe_cmd(argv, ranks, defer=defer, cache=cache, env=env)
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=TIMEOUT)
    assert r.returncode == 0 or "diverged at step" in r.stderr, r.stderr[-3000:]
    return _ranks(ranks)


def _ranks(ranks):
    got = [json.loads((ranks / f"rank{r}.json").read_text()) for r in (0, 1)]
    for g in got:
        g["reads"] = {int(i): v for i, v in g["reads"].items()}
    return got


def _records(run_dir):
    """metrics.jsonl without its timing fields."""
    out = []
    for rec in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()):
        rec.pop("tokens_per_s", None)
        rec.pop("elapsed_s", None)
        out.append(rec)
    return out


def _same_on_every_rank(got):
    """The ranks' summaries agree (status, step, loss, spikes, tokens); returns rank 0's."""
    keys = ("status", "step", "train_loss", "tokens_seen", "loss_spikes")
    a, b = ({k: g["summary"][k] for k in keys} for g in got)
    assert a == b
    return a


def _same_run(a, b):
    """Metrics lines (timing aside), summary and weights bit for bit."""
    assert _records(a) == _records(b)
    sa, sb = summary(a), summary(b)
    for k in ("status", "step", "train_loss", "val_loss", "val_bpb", "loss_spikes", "tokens_seen", "weight_norms"):
        assert sa[k] == sb[k], k
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()


@pytest.fixture(scope="module")
def read_every_step(tmp_path_factory, cache):
    """The DEFER config on 2 probed ranks read at every step (the CPU policy): the run directory and the ranks'
    reads."""
    base = tmp_path_factory.mktemp("ddp")
    got = _probe(["train", "tiny", *DEFER, "--out", str(base / "now")], base / "ranks", defer=False, cache=cache)
    assert _same_on_every_rank(got)["status"] == "completed"
    return base / "now", got


def test_deferred_ranks_equal_ranks_read_every_step(read_every_step, tmp_path, cache):
    """Two ranks that leave each step's loss sums on the device until the next read point (all-reduced as a
    device tensor, the stop flag agreed at read points only) write the same metrics, summary and weights, bit for
    bit, as two ranks read at every step. A step between read points reads on the host only the batch's window
    offsets and AdamW's step counters; read at every step, it also read the stop flag's all-reduce, the loss sum
    and the gradient norm."""
    now, got_now = read_every_step
    out = tmp_path / "deferred"
    got = _probe(["train", "tiny", *DEFER, "--out", str(out)], tmp_path / "ranks", defer=True, cache=cache)
    assert _same_on_every_rank(got)["status"] == "completed"
    _same_run(now, out)
    quiet = [i for i in range(40) if not _read_point(i)]
    assert len(quiet) == 26
    for g, g_now in zip(got, got_now):
        reads, reads_now = g["reads"], g_now["reads"]
        for i in quiet:
            assert set(reads[i]) <= ALLOWED, (i, reads[i])
            assert {"tolist distributed.py:all_sum", "runstate.py:after_backward"} <= set(reads_now[i])
        for i in set(range(40)) - set(quiet):  # the stop flag agreed once, the step read at once
            assert reads[i].count("tolist distributed.py:all_sum") == 1, (i, reads[i])
            assert "runstate.py:after_backward" in reads[i]
        assert all("runstate.py:settle" in reads[i] for i in (4, 7, 9, 11, 39))  # the queued steps settled


def test_ctrl_c_stops_deferred_ranks_at_one_read_point(read_every_step, tmp_path, cache):
    """A Ctrl-C of deferred ranks stops every rank at the same read point (the stop flag is agreed there only),
    checkpointed, with one summary; resumed, the run ends bit for bit as the run read at every step."""
    out, ranks = tmp_path / "interrupted", tmp_path / "ranks"
    # 0.2 s before each step: the 32 steps after the checkpoint the test waits for outlast the signal's delivery
    cmd, env = _probe_cmd(["train", "tiny", *DEFER, "--out", str(out)], ranks, defer=True, cache=cache,
                          env={"NORMLAB_TEST_STEP_DELAY": "0.2"})
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + TIMEOUT
    while not (out / "checkpoints" / "step_00000008").exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)  # torchrun's agent forwards it to every rank
    try:
        stdout, _ = proc.communicate(timeout=TIMEOUT)
    finally:
        proc.kill()
    stop = _same_on_every_rank(_ranks(ranks))
    assert stop["status"] == "interrupted", f"the run ended before the signal: {stop}"
    assert 8 <= stop["step"] < 40 and _read_point(stop["step"]), stop  # the step it did not take is a read point
    s = summary(out)
    assert (s["status"], s["step"]) == ("interrupted", stop["step"])
    assert stdout.count("status interrupted") == 1  # rank 0 alone reports
    assert sorted(p.name for p in (out / "checkpoints").iterdir())[-1] == f"step_{s['step']:08d}"
    _no_ranks_left(out)
    resumed = _probe(["train", "--resume", str(out)], tmp_path / "ranks2", defer=True, cache=cache)
    assert _same_on_every_rank(resumed)["status"] == "completed"
    _same_run(read_every_step[0], out)


def test_divergence_between_read_points_stops_every_deferred_rank(tmp_path, cache):
    """Deferred ranks whose run diverges between two read points all stop at the next one with the diverged step's
    status, step, loss, spikes and tokens, and the same metrics lines, as ranks read at every step."""
    now, out = tmp_path / "now", tmp_path / "deferred"
    got_now = _probe(["train", "tiny", *DIVERGE, "--out", str(now)], tmp_path / "r1", defer=False, cache=cache)
    got = _probe(["train", "tiny", *DIVERGE, "--out", str(out)], tmp_path / "r2", defer=True, cache=cache)
    a, b = _same_on_every_rank(got_now), _same_on_every_rank(got)
    assert a["status"] == "diverged" and a["step"] % 10 != 0 and a["loss_spikes"]["count"] >= 2, a
    assert a == b
    assert summary(now)["status"] == summary(out)["status"] == "diverged"
    assert _records(now) == _records(out)
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
