"""Persistent local sweep workers (normlab.experiments.pool): one ``worker --serve`` process trains run after run
exactly as a fresh process per run would, and a worker that dies mid-run costs only that run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from normlab.experiments.sweepdir import registration, run_sweep
from normlab.experiments.scheduling import worker_env
from normlab.experiments.store import Store
from normlab.experiments.sweep import parse_sweep
from tests.helpers import cli_env

FAST = {"train.steps": 6, "train.eval_every": 6, "train.checkpoint_every": 6, "train.eval_batches": 2}


def test_a_persistent_worker_trains_like_a_fresh_process(tmp_path, cache, monkeypatch):
    """Seed 1 trained second by one persistent worker (after seed 0, in the same process) has the same weights,
    byte for byte, as seed 1 trained alone by a fresh ``python -m normlab.experiments.worker DIR RUN_ID``."""
    monkeypatch.setenv("NORMLAB_CACHE_DIR", str(cache))
    sweep = parse_sweep({"name": "pool", "base": "tiny", "seeds": [0, 1], "set": FAST})
    out = run_sweep(sweep, tmp_path / "pool", workers=1, threads=1, log=lambda s: None)
    assert out.workers == 1 and out.trained == [r.run_id for r in sweep.runs]
    assert (tmp_path / "pool" / "logs" / "workers.log").is_file()  # one worker: its between-runs output
    fresh = tmp_path / "fresh"
    store = Store(fresh / "results.sqlite")
    fresh.mkdir()
    store.create(sweep.name, sweep.hash)
    store.register(registration(sweep))
    second = sweep.runs[1].run_id
    subprocess.run([sys.executable, "-m", "normlab.experiments.worker", str(fresh), second, "--threads", "1"],
                   env={**worker_env(1), "NORMLAB_CACHE_DIR": str(cache)}, check=True, capture_output=True)
    a = (tmp_path / "pool" / "runs" / second / "model.safetensors").read_bytes()
    assert a == (fresh / "runs" / second / "model.safetensors").read_bytes()
    rows = {r["run_id"]: r for r in Store(tmp_path / "pool" / "results.sqlite").runs()}
    assert all(r["status"] == "completed" and r["train_calls"] == 1 and r["peak_mem_mb"] > 0 for r in rows.values())
    assert "step 6" in (tmp_path / "pool" / "logs" / f"{second}.log").read_text()  # each run's own log


def _serving_workers(sweep_dir: Path) -> list[int]:
    pids = []
    for p in Path("/proc").iterdir():
        try:
            cmd = (p / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"--serve" in cmd and str(sweep_dir).encode() in cmd:
            pids.append(int(p.name))
    return pids


def test_a_worker_killed_mid_run_fails_that_run_and_the_sweep_goes_on(tmp_path, cache):
    """SIGKILL the worker while it trains the first run: that run is recorded failed (not lost), a new worker
    trains the others, exit status 1; the re-run resumes the killed run from its checkpoint."""
    spec = {**FAST, "train.steps": 300, "train.checkpoint_every": 5, "train.eval_every": 300}
    short = {"train.steps": 6, "train.checkpoint_every": 6, "train.eval_every": 6}
    f = tmp_path / "s.yaml"
    variants = [{"name": "long", "set": {}}, {"name": "short", "set": short},
                {"name": "short2", "set": {**short, "train.lr": 0.002}}]
    f.write_text(yaml.safe_dump({"name": "kill", "base": "tiny", "seeds": [0], "set": spec, "variants": variants}))
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "normlab.cli", "compare", str(f), "--out", str(out), "--workers",
                             "1", "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=cli_env(cache))
    ckpts = out / "runs" / "long-s0" / "checkpoints"
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None and not (ckpts.is_dir() and any(ckpts.iterdir())):
        time.sleep(0.05)
    pids = _serving_workers(out)
    assert proc.poll() is None and len(pids) == 1, proc.communicate()
    victim, = [r["run_id"] for r in Store(out / "results.sqlite").runs() if r["status"] == "running"]  # long-s0
    os.kill(pids[0], signal.SIGKILL)
    stdout, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 1, stderr[-2000:]
    rows = {r["run_id"]: r for r in Store(out / "results.sqlite").runs()}
    assert rows[victim]["status"] == "failed" and "status -9" in rows[victim]["error"]
    assert all(r["status"] == "completed" for k, r in rows.items() if k != victim)
    assert json.loads(stdout)["counts"] == {"failed": 1, "completed": 2}
    again = subprocess.run([sys.executable, "-m", "normlab.cli", "compare", str(f), "--out", str(out), "--json"],
                           capture_output=True, text=True, env=cli_env(cache), timeout=600)
    assert again.returncode == 0, again.stderr[-2000:]
    row = Store(out / "results.sqlite").get(victim)
    assert row["status"] == "completed" and row["train_calls"] == 2


def test_in_process_runner_stops_on_a_signal_between_runs_even_if_sigint_was_ignored(tmp_path, cache, monkeypatch):
    """The in-process runner (claims with one worker) installs its own handlers: a SIGINT that lands after a run
    finished and before the next starts stops the sweep (``interrupted``, the next run never trained) even when the
    process started with SIGINT ignored, as under a background shell (CI); the old handler is back afterwards."""
    import normlab.experiments.scheduling as scheduling

    monkeypatch.setenv("NORMLAB_CACHE_DIR", str(cache))
    real = scheduling.serve_one

    def then_ctrl_c(*a, **kw):  # the signal arrives right after the run, outside the trainer
        rc = real(*a, **kw)
        os.kill(os.getpid(), signal.SIGINT)
        return rc

    monkeypatch.setattr(scheduling, "serve_one", then_ctrl_c)
    sweep = parse_sweep({"name": "inline", "base": "tiny", "seeds": [0, 1], "set": FAST})
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        out = run_sweep(sweep, tmp_path / "s", workers=1, threads=1, inline=True, log=lambda s: None)
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, old)
    rows = {r["run_id"]: r for r in Store(tmp_path / "s" / "results.sqlite").runs()}
    first, second = (r.run_id for r in sweep.runs)
    assert out.status == "interrupted" and out.trained == [first]
    assert rows[first]["status"] == "completed" and rows[second]["status"] == "pending"


def test_in_process_runner_stops_training_on_sigterm_as_on_ctrl_c(tmp_path, cache, monkeypatch):
    """SIGTERM (``kill``, a CI cancel) stops the in-process runner's run at the next step, checkpointed and resumable,
    as Ctrl-C does; it used to be recorded only after the run had trained to its last step."""
    from normlab.train import tracking

    monkeypatch.setenv("NORMLAB_CACHE_DIR", str(cache))
    real = tracking.Tracker.log

    def then_term(self, *a, **kw):  # the signal arrives during training, after the first logged step
        real(self, *a, **kw)
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(tracking.Tracker, "log", then_term)
    spec = {**FAST, "train.steps": 40, "train.log_every": 1, "train.eval_every": 40, "train.checkpoint_every": 40}
    sweep = parse_sweep({"name": "term", "base": "tiny", "seeds": [0, 1], "set": spec})
    out = run_sweep(sweep, tmp_path / "s", workers=1, threads=1, inline=True, log=lambda s: None)
    rows = {r["run_id"]: r for r in Store(tmp_path / "s" / "results.sqlite").runs()}
    first, second = (r.run_id for r in sweep.runs)
    assert out.status == "interrupted" and out.trained == [first]
    assert rows[first]["status"] == "interrupted" and rows[first]["step"] < 40
    assert rows[second]["status"] == "pending"


def test_a_worker_forgets_compiled_code_between_runs(tmp_path, cache, monkeypatch):
    """Each run a persistent worker trains starts with torch.compile's caches empty, as in a fresh process: a function
    compiled before a run, called after it at another shape, is compiled again with static shapes (without the reset
    Dynamo marks the changed dimension dynamic, so a run's compiled code would depend on the runs before it)."""
    import torch

    from normlab.experiments.worker import serve_one

    monkeypatch.setenv("NORMLAB_CACHE_DIR", str(cache))
    graphs = []

    def record(gm, example_inputs):  # a backend that notes each graph's inputs and runs it as it is
        graphs.append([type(x).__name__ for x in example_inputs])
        return gm.forward

    torch.compiler.reset()
    f = torch.compile(lambda x: x * 2 + 1, backend=record)
    f(torch.ones(3))
    sweep = parse_sweep({"name": "reset", "base": "tiny", "seeds": [0], "set": FAST})
    d = tmp_path / "s"
    (d / "logs").mkdir(parents=True)
    store = Store(d / "results.sqlite")
    store.create(sweep.name, sweep.hash)
    store.register(registration(sweep))
    assert serve_one(d, sweep.runs[0].run_id, 1) == 0
    f(torch.ones(4))
    f(torch.ones(5))  # control: no run (no reset) between, so this change of shape is compiled with a symbolic size
    torch.compiler.reset()
    assert graphs == [["Tensor"], ["Tensor"], ["SymInt", "Tensor"]]


def test_the_runner_replaces_a_worker_after_a_run_that_failed_with_an_error(tmp_path, monkeypatch):
    """A run that ends in an unexpected error (exit status 1) may leave its process unfit (a poisoned CUDA context,
    a fragmented allocator): the runner closes that worker and the next run gets a new one; a run that completed
    does not cost its worker."""
    import normlab.experiments.scheduling as scheduling

    sweep = parse_sweep({"name": "fail", "base": "tiny", "seeds": [0, 1, 2], "set": FAST})
    d = tmp_path / "s"
    (d / "logs").mkdir(parents=True)
    store = Store(d / "results.sqlite")
    store.create(sweep.name, sweep.hash)
    store.register(registration(sweep))
    fails = {sweep.runs[0].run_id}
    made, trained_by = [], {}

    class FakeWorker:
        def __init__(self, *a, **kw):
            self.run_id, self.closed = None, False
            made.append(self)

        def assign(self, run_id):
            self.run_id = run_id
            trained_by[run_id] = self
            return True

        def finished(self):
            run_id, self.run_id = self.run_id, None
            failed = run_id in fails
            store.update(run_id, status="failed" if failed else "completed")
            return run_id, 1 if failed else 0, False

        def alive(self):
            return not self.closed

        def interrupt(self, kill=False):
            pass

        def close(self, timeout=60.0):
            self.closed = True

    monkeypatch.setattr(scheduling, "Worker", FakeWorker)
    ids = [r.run_id for r in sweep.runs]
    processes = scheduling.Processes(d, 1, 1, lambda s: None, store, len(ids))
    assert scheduling.drive(processes, store, [[r] for r in ids], lambda s: None, []) == "completed"
    assert trained_by[ids[0]].closed and trained_by[ids[1]] is not trained_by[ids[0]]
    assert trained_by[ids[2]] is trained_by[ids[1]] and len(made) == 2


def test_worker_serve_bad_arguments_are_one_line_errors(tmp_path):
    """``worker --serve`` without ``--results-fd``, or a directory that is not a sweep: exit status 2 naming what is
    wrong, no traceback."""
    for args, says in ((["--serve"], "--serve needs --results-fd"),
                       (["--serve", "--results-fd", "1"], "is not a sweep directory")):
        p = subprocess.run([sys.executable, "-m", "normlab.experiments.worker", str(tmp_path / "nope"), *args],
                           capture_output=True, text=True, env=cli_env(tmp_path / "cache"), timeout=120)
        lines = p.stderr.splitlines()
        assert p.returncode == 2 and len(lines) == 1 and says in lines[0], p.stderr


def test_a_worker_fixes_the_cublas_workspace_before_its_first_run(tmp_path, monkeypatch):
    """torch sizes cuBLAS's workspace from ``CUBLAS_WORKSPACE_CONFIG`` once, at a process's first cuBLAS call: a
    worker that trains run after run (or a stacked group) sets the deterministic value before the first run starts,
    whatever that run's ``train.deterministic``, and keeps a value the user set."""
    from normlab.experiments import worker

    seen = []
    monkeypatch.setattr(worker, "one_run", lambda d, r, t: seen.append(os.environ.get("CUBLAS_WORKSPACE_CONFIG")) or 0)
    (tmp_path / "logs").mkdir()
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", "")  # records the undo
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG")
    assert worker.serve_one(tmp_path, "r0", 1) == 0
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
    assert worker.serve_one(tmp_path, "r1", 1) == 0
    assert seen == [":4096:8", ":16:8"]
