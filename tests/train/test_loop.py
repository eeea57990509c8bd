"""normlab.train.loop: kill -9 between the final checkpoint and the summary keeps the metrics; two Ctrl-C before the
loop still write a summary."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import normlab.train.loop as loop
from normlab.config import load_config
from tests.helpers import SHORT, HostReads, assert_same_weights, cli_env, kill_9_after, normlab, run_inproc, summary

pytestmark = pytest.mark.usefixtures("one_thread")


def test_kill_9_between_final_checkpoint_and_summary_keeps_metrics(run, tmp_path, cache):
    """Issue row 1: the final checkpoint carries the final metrics, so a resume restores them (not null)."""
    x = tmp_path / "x"
    shutil.copytree(run, x)
    (x / "model.safetensors").unlink()
    (x / "summary.json").unlink()
    proc = run_inproc("train", "--resume", str(x), "--json", cache=cache)
    assert proc.returncode == 0, proc.stderr
    got, ref = json.loads(proc.stdout), json.loads((run / "summary.json").read_text())
    for k in ("val_bpb", "val_loss", "train_loss", "best_val_bpb"):
        assert got[k] is not None and got[k] == ref[k], k
    assert (x / "model.safetensors").read_bytes() == (run / "model.safetensors").read_bytes()


def _popen_train(args: list[str], cache: Path):
    import subprocess
    import sys

    from tests.helpers import cli_env

    return subprocess.Popen([sys.executable, "-m", "normlab.cli", *args], env=cli_env(cache),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_ctrl_c_twice_before_the_loop_writes_summary(tmp_path, cache):
    import signal
    import time

    out = tmp_path / "r"
    proc = _popen_train(["train", "tiny", *SHORT, "--set", "train.steps=400", "--out", str(out)], cache)
    deadline = time.time() + 120
    while not (out / "config.yaml").exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    s = json.loads((out / "summary.json").read_text())
    assert s["status"] == "interrupted" and s["steps"] == 400


# -- host reads: the CPU stand-in for torch.cuda.set_sync_debug_mode ---------------------------------------------------

SYNC_SETS = ["model.depth=1", "train.steps=12", "train.log_every=6", "train.eval_every=12", "train.checkpoint_every=12",
             "diag.every=4", "optim.effective_lr_every=0", "train.warmup_steps=2"]
READ_POINT = loop.Recipe._read_point


def _train_counting_reads(run_dir: Path, sets: list[str], monkeypatch, defer: bool) -> tuple[dict, dict[int, list]]:
    """Train ``tiny`` + ``sets`` in-process and list, per step, every host read of a tensor's value
    (tests.helpers.HostReads). A step starts where the loop decides whether it is read."""
    read_point = READ_POINT
    reads = HostReads()

    def marked(self, i):
        reads.step = i
        return read_point(self, i)

    monkeypatch.setattr(loop.Recipe, "_read_point", marked)
    monkeypatch.setattr(loop, "defer_reads", lambda cfg: True)  # every step asks whether it is a read point
    if not defer:
        monkeypatch.setattr(loop.Recipe, "_read_point", lambda self, i: marked(self, i) or True)
    with reads:
        summary = loop.train(load_config("tiny", sets), run_dir, quiet=True)
    return summary, reads.reads


def _records(run_dir: Path) -> list[dict]:
    out = []
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        rec.pop("tokens_per_s", None)
        rec.pop("elapsed_s", None)
        out.append(rec)
    return out


def test_a_step_between_read_points_reads_nothing_on_the_host(tmp_path, cache, monkeypatch):
    """With reads deferred (the accelerator policy, here on the CPU), a step that is neither logged nor a
    diagnostic, evaluation or checkpoint step reads no tensor of the run: only the batch's window offsets (drawn
    from the CPU data generator on every device) and torch's AdamW step counters (CPU tensors on every device).
    Before, such a step read its loss and its gradient norm. The metrics, summary and weights equal those of the
    run read at every step."""
    monkeypatch.setenv("NORMLAB_CACHE_DIR", str(cache))
    s_now, reads_now = _train_counting_reads(tmp_path / "now", SYNC_SETS, monkeypatch, defer=False)
    s_def, reads_def = _train_counting_reads(tmp_path / "deferred", SYNC_SETS, monkeypatch, defer=True)
    allowed = {"tolist loop.py:get_batch", "optimizer.py:_get_value"}
    quiet_steps = [i for i in range(12) if (i + 1) % 4 and (i + 1) % 6]  # diag.every 4, log every 6
    assert quiet_steps == [0, 1, 2, 4, 6, 8, 9, 10]
    for i in quiet_steps:
        assert set(reads_def[i]) <= allowed, (i, reads_def[i])
        assert reads_def[i].count("tolist loop.py:get_batch") == 1
        assert {"runstate.py:after_backward"} <= set(reads_now[i])  # read at once: loss and grad norm, this step
    assert reads_now[0].count("runstate.py:after_backward") == 2
    assert any("runstate.py:settle" in reads_def[i] for i in (5, 11))  # the deferred steps read at the next log step
    assert _records(tmp_path / "now") == _records(tmp_path / "deferred")
    for k in ("status", "step", "train_loss", "val_bpb", "loss_spikes", "tokens_seen", "weight_norms"):
        assert s_now[k] == s_def[k], k
    assert (tmp_path / "now" / "model.safetensors").read_bytes() == \
        (tmp_path / "deferred" / "model.safetensors").read_bytes()


@pytest.mark.parametrize("lr", ["3", "0.3"])
def test_a_deferred_divergence_ends_the_run_as_a_read_one(tmp_path, cache, monkeypatch, capsys, lr):
    """A run that spikes and diverges between two read points (lr 3: spikes at steps 3 and 4, diverged at 4; lr
    0.3: spikes at 5-8 and 12, diverged at 12; log every 10) ends with the same status, step, loss, spike list,
    tokens and message, and the same metrics lines, as when every step is read at once."""
    monkeypatch.setenv("NORMLAB_CACHE_DIR", str(cache))
    sets = ["train.steps=40", "train.log_every=10", "train.eval_every=40", "train.checkpoint_every=40", "diag.every=0",
            "model.depth=1", f"train.lr={lr}", "train.warmup_steps=10", "train.grad_clip=0", "diag.spike_factor=1.01",
            "diag.spike_window=2"]
    got = {}
    for defer in (False, True):
        name = "deferred" if defer else "now"
        s, _ = _train_counting_reads(tmp_path / name, sets, monkeypatch, defer=defer)
        got[name] = s, _records(tmp_path / name)
    (a, ra), (b, rb) = got["now"], got["deferred"]
    assert a["status"] == b["status"] == "diverged" and a["step"] % 10 != 0
    for k in ("step", "train_loss", "loss_spikes", "tokens_seen", "val_bpb"):
        assert a[k] == b[k], k
    assert a["loss_spikes"]["count"] >= 2
    assert ra == rb


@pytest.mark.parametrize("fails", ["forward", "backward"])
def test_a_run_whose_compile_fails_runs_eager(tmp_path, cache, monkeypatch, capsys, fails):
    """``train.compile`` on, and torch cannot compile the model (simulated: the compiled module raises on its first
    call, or its first backward -- which AOTAutograd compiles when it first runs -- raises after putting gradients
    in): the run says so in one line, repeats the micro-batch eager with the same tokens and trains on eager,
    bit-identical to a run with compile off; the summary names the step it fell back from."""
    import torch

    import normlab.train.resolve as R

    class BackwardFails(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t, model):
            ctx.model = model
            return t.view_as(t)

        @staticmethod
        def backward(ctx, g):
            with torch.enable_grad():  # gradients left behind a failed backward must not count
                torch.autograd.backward([p.sum() for p in ctx.model.parameters()])
            raise RuntimeError("cannot compile this backward")

    def broken(fn):  # torch.compile of the run's forward-and-loss region (Recipe._forward_loss)
        model = fn.__self__.ddp

        def run(*a, **k):
            if fails == "forward":
                raise RuntimeError("cannot compile this")
            loss, parts = fn(*a, **k)
            return BackwardFails.apply(loss, model), parts
        return run

    real = R.resolve_runtime

    def compiled(c):
        lines = real(c)
        c.train.compile = True  # with or without a C++ compiler here
        return lines

    args = ["train.steps=6", "train.eval_every=6", "train.checkpoint_every=6", "diag.every=0", "train.grad_accum=2"]
    with monkeypatch.context() as m:
        m.setattr(loop.torch, "compile", broken)
        m.setattr(R, "resolve_runtime", compiled)
        s = loop.train(load_config("tiny", [*args, "train.compile=true"]), tmp_path / "c")
    ref = loop.train(load_config("tiny", [*args, "train.compile=false"]), tmp_path / "e", quiet=True)
    err = capsys.readouterr().err
    assert "the model runs eager: torch.compile of it failed (RuntimeError: cannot compile this" in err
    assert s["status"] == "completed" and s["compile_fallback_step"] == 1 and "compile_fallback_step" not in ref
    assert_same_weights(tmp_path / "c", tmp_path / "e")  # bit for bit (the files' headers record the config)
    assert s["val_bpb"] == ref["val_bpb"]


def test_a_compiled_run_that_fails_later_is_not_hidden(tmp_path, cache, monkeypatch):
    """Once a compiled step ran, a failure is the model's own: it ends the run (no silent switch to eager)."""
    import normlab.train.resolve as R

    calls = []

    def flaky(model):
        def run(*a, **k):
            calls.append(1)
            if len(calls) > 1:
                raise RuntimeError("a failure of the model")
            return model(*a, **k)
        return run

    real = R.resolve_runtime
    monkeypatch.setattr(loop.torch, "compile", flaky)
    monkeypatch.setattr(R, "resolve_runtime", lambda c: (real(c), setattr(c.train, "compile", True))[0])
    with pytest.raises(RuntimeError, match="a failure of the model"):
        loop.train(load_config("tiny", ["train.steps=4", "diag.every=0", "train.compile=true"]), tmp_path / "c",
                   quiet=True)


def test_a_compiled_run_compiles_model_and_loss_as_one_graph(tmp_path, cache, monkeypatch):
    """``train.compile``: the compiled region is the forward and the loss together (one graph, captured once, whose
    output is the loss: the logits never leave it; diagnostic steps run eager), and the run trains as the eager one
    does (the graph runs the same ops: weights to fp32 round-off)."""
    import torch

    import normlab.train.resolve as R

    graphs = []

    def backend(gm, inputs):
        graphs.append(gm)
        return gm.forward

    real_compile, real_resolve = torch.compile, R.resolve_runtime
    args = ["train.steps=6", "diag.every=3", "train.eval_every=6", "train.checkpoint_every=6"]
    with monkeypatch.context() as m:
        m.setattr(loop.torch, "compile", lambda fn, **k: real_compile(fn, backend=backend))
        m.setattr(R, "resolve_runtime", lambda c: (real_resolve(c), setattr(c.train, "compile", True))[0])
        s = loop.train(load_config("tiny", [*args, "train.compile=true"]), tmp_path / "c", quiet=True)
    loop.train(load_config("tiny", [*args, "train.compile=false"]), tmp_path / "e", quiet=True)
    assert len(graphs) == 1 and s["compile"] is True
    ops = " ".join(str(n.target) for n in graphs[0].graph.nodes)
    assert "cross_entropy" in ops and "linear" in ops  # model and loss in one graph
    out = next(n for n in graphs[0].graph.nodes if n.op == "output")
    first = out.args[0][0] if isinstance(out.args[0], (tuple, list)) else out.args[0]
    assert first.meta["example_value"].dim() == 0  # the graph's first output is the scalar loss
    from tests.helpers import weights

    wa, wb = weights(tmp_path / "c"), weights(tmp_path / "e")
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=1e-5, atol=1e-6, msg=k)


@pytest.mark.parametrize("recorded", [True, False], ids=["checkpoint-records-threads", "older-checkpoint"])
def test_a_resume_under_another_thread_count_uses_the_checkpoints(tmp_path, cache, recorded):
    """Killed at step 20 of 40 under 1 thread, resumed under OMP_NUM_THREADS=2 (``train.threads: auto`` would take
    2): the resume runs at the 1 thread its checkpoint recorded and ends with the uninterrupted run's weights bit
    for bit. A checkpoint that records no thread count (an older normlab's) is resumed at 2 threads and the run
    says it is not exact (summary.json, stderr); its weights then differ (2 threads sum in another order), which
    shows the first case could fail."""
    args = ["train", "tiny", "--set", "train.steps=40", "--set", "train.lr=0.01", "--set", "train.checkpoint_every=10",
            "--set", "train.eval_every=20", "--set", "train.keep_checkpoints=10"]
    ref, cut = tmp_path / "ref", tmp_path / "cut"
    normlab(*args, "--out", str(ref), cache=cache, check=True)
    kill_9_after(args, cut, cache, 20)
    state = cut / "checkpoints" / "step_00000020" / "state.json"
    assert json.loads(state.read_text())["threads"] == 1
    if not recorded:
        state.write_text(json.dumps({k: v for k, v in json.loads(state.read_text()).items() if k != "threads"}))
    env = {**cli_env(cache), "OMP_NUM_THREADS": "2"}
    r = subprocess.run([sys.executable, "-m", "normlab.cli", "train", "--resume", str(cut)], capture_output=True,
                       text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    s = summary(cut)
    if recorded:
        assert s["threads"] == 1 and s["resume_exact"] is True and "as its checkpoint recorded" in s["threads_reason"]
        assert_same_weights(ref, cut)
        assert s["val_bpb"] == summary(ref)["val_bpb"]
    else:
        assert s["threads"] == 2 and s["resume_exact"] is False and "does not record" in s["resume_note"]
        assert "not an exact resume" in r.stderr
        with pytest.raises(AssertionError):
            assert_same_weights(ref, cut)
    assert "resume_exact" not in summary(ref)  # never resumed
