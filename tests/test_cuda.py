"""The CUDA path, one command away from verified: ``python -m pytest tests/test_cuda.py`` on a machine with a GPU.
Skipped without one (but for the check that benchmarks/gpu_speed.py refuses such a machine in one line). Train,
resume bit-exactly after kill -9, and convert on ``cuda`` in fp32 and bf16; two runs with the diagnostics on and
compiled (``train.compile: auto`` is on for CUDA) are bit-identical under ``train.deterministic: true`` (no op of
the model, its backward or the diagnostics lacks a deterministic CUDA kernel); a stacked group of 4 equals its runs
alone (normlab.train.stacked); a 2-process NCCL DDP run when two GPUs exist (its loss curve equals the 1-process
run's up to reduction order; its steps between read points never wait for the device)."""

from __future__ import annotations

import json

import pytest
import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from normlab.attention import positions
from tests.helpers import assert_same_weights, kill_9_after, normlab, summary

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

SMALL = ["model.width=32", "model.context=32", "train.batch_size=4", "train.eval_batches=1", "diag.every=0",
         "device=cuda"]
CLI_SMALL = [a for kv in SMALL for a in ("--set", kv)]


def _losses(run_dir) -> list[float]:
    return [r["loss"] for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if "loss" in r]


@needs_cuda
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_cuda_train_resume_convert(precision, tmp_path, cache):
    args = ["train", "tiny", *CLI_SMALL, "--set", f"train.precision={precision}", "--set", "train.steps=16",
            "--set", "train.deterministic=true",  # exact resume on CUDA asks for it (the default is the fast path)
            "--set", "train.checkpoint_every=4", "--set", "train.eval_every=8", "--set", "model.dropout=0.1"]
    ref = tmp_path / "ref"
    normlab(*args, "--out", str(ref), cache=cache, check=True)
    s = summary(ref)
    assert (s["device"], s["precision"], s["status"]) == ("cuda", precision, "completed")
    assert s["val_bpb"] is not None and s["val_bpb"] < 8.0  # learned something below uniform over bytes
    out = tmp_path / "killed"
    kill_9_after(args, out, cache, 8)
    assert not (out / "model.safetensors").exists(), "run finished before it could be killed"
    r = normlab("train", "--resume", str(out), cache=cache)
    assert r.returncode == 0, r.stderr
    assert_same_weights(ref, out)
    assert _losses(ref) == _losses(out)
    conv = tmp_path / "conv"
    r = normlab("convert", str(ref), "--to", "rmsnorm", "--out", str(conv), "--json", cache=cache, check=True)
    row = json.loads(r.stdout)
    assert row["max_abs_logit_diff"] <= 1e-4 and abs(row["bpb_after"] - row["bpb_before"]) <= 1e-6


@needs_cuda
def test_cuda_runs_with_diagnostics_are_bit_identical(tmp_path, cache):
    """Default diagnostics (every ``diag.every`` steps, hooks on every block), compiled, dropout on: two runs give the
    same weights and losses bit for bit under ``train.deterministic: true`` (the default, auto, is off on CUDA)."""
    args = ["train", "tiny", "--set", "device=cuda", "--set", "train.deterministic=true", "--set", "train.steps=20",
            "--set", "diag.every=5",
            "--set", "train.eval_every=10", "--set", "model.dropout=0.1"]
    a, b = tmp_path / "a", tmp_path / "b"
    for out in (a, b):
        normlab(*args, "--out", str(out), cache=cache, check=True)
    s = summary(a)
    assert (s["device"], s["compile"], s["status"]) == ("cuda", True, "completed")
    assert_same_weights(a, b)
    assert _losses(a) == _losses(b)


@needs_cuda
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_two_process_nccl_ddp_step(tmp_path, cache):
    """``--nproc 2`` on two GPUs (backend ``cpu:gloo,cuda:nccl``): same global batch and data order as one process,
    so the losses agree to float32 reduction-order round-off."""
    base = ["train", "tiny", *CLI_SMALL, "--set", "train.steps=4", "--set", "train.log_every=1",
            "--set", "train.precision=fp32", "--set", "model.dropout=0.0"]
    one, two = tmp_path / "one", tmp_path / "two"
    normlab(*base, "--out", str(one), cache=cache, check=True)
    normlab(*base, "--nproc", "2", "--out", str(two), cache=cache, check=True)
    assert summary(two)["status"] == "completed"
    a, b = _losses(one), _losses(two)
    assert len(a) == len(b) > 0
    assert max(abs(x - y) for x, y in zip(a, b)) < 1e-4


@needs_cuda
def test_cuda_stacked_group_equals_its_runs_alone(tmp_path, cache):
    """normlab.train.stacked on CUDA (strict fp32: train.tf32=false): 4 members of one architecture against the same 4
    runs alone, losses and weights to fp32 round-off."""
    from normlab.config import load_config
    from normlab.train.loop import train
    from normlab.train.stacked import train_stacked
    from tests.helpers import weights

    sets = [*SMALL, "train.steps=6", "train.checkpoint_every=3", "train.eval_every=3", "train.precision=fp32",
            "train.tf32=false", "train.compile=false", "train.track=[]", f"data.cache_dir={cache}"]
    cfgs = lambda: [load_config("tiny", [*sets, f"seed={s}", f"train.lr={lr}"])  # noqa: E731
                    for s, lr in ((0, 5e-3), (1, 5e-3), (2, 2e-3), (3, 1e-2))]
    train_stacked(cfgs(), [tmp_path / f"s{i}" for i in range(4)], quiet=True)
    for i, cfg in enumerate(cfgs()):
        train(cfg, tmp_path / f"a{i}", quiet=True)
        torch.testing.assert_close(torch.tensor(_losses(tmp_path / f"s{i}")), torch.tensor(_losses(tmp_path / f"a{i}")),
                                   rtol=1e-4, atol=1e-5)
        wa, ws = weights(tmp_path / f"a{i}"), weights(tmp_path / f"s{i}")
        for k in wa:
            torch.testing.assert_close(ws[k], wa[k], rtol=1e-4, atol=1e-5, msg=k)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without a CUDA device")
def test_gpu_speed_without_cuda_says_so_in_one_line(tmp_path):
    """benchmarks/gpu_speed.py on a machine without CUDA: one line on stderr saying so, exit 2, nothing written."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    out = tmp_path / "bench.md"
    r = subprocess.run([sys.executable, str(root / "benchmarks" / "gpu_speed.py"), "--nanogpt", str(tmp_path),
                        "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and r.stdout == ""
    assert len(r.stderr.strip().splitlines()) == 1 and "no CUDA device" in r.stderr
    assert not out.exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without a CUDA device")
def test_deterministic_cost_without_cuda_says_so_in_one_line(tmp_path):
    """benchmarks/deterministic_cost.py on a machine without CUDA: one line on stderr, exit 2, nothing written."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    out = tmp_path / "bench.md"
    r = subprocess.run([sys.executable, str(root / "benchmarks" / "deterministic_cost.py"), "--out", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip().splitlines() == [r.stderr.strip()] and "deterministic_cost.py: no CUDA device" in r.stderr
    assert not out.exists()


def test_deterministic_cost_ranks_the_operators_that_grow_and_writes_ratios(monkeypatch):
    """The section's table: step times as ratios to ``off``; the operators whose device time grows most from off to
    true, largest first, an operator only one side runs counted 0 on the other, shrinking ones left out."""
    import sys
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent.parent / "benchmarks"))
    sys.modules.pop("deterministic_cost", None)
    import deterministic_cost as dc

    off = {"gemm": 100.0, "index_put": 5.0, "softmax": 20.0}
    on = {"gemm": 130.0, "index_put": 45.0, "softmax": 18.0, "sort": 7.0}
    assert dc.grown(off, on) == [("index_put", 5.0, 45.0), ("gemm", 100.0, 130.0), ("sort", 0.0, 7.0)]
    meta = {"device": "GPU X", "torch": "2", "cuda": "12"}
    res = {m: {**meta, "step_ms": ms, "ops_us": off if m == "off" else on,
               "kernels_us": {"k_fast": 10.0} if m == "off" else {"k_slow": 40.0}}
           for m, ms in zip(dc.MODES, (10.0, 10.5, 11.0, 12.0))}
    text = dc.section(res, "issue", False)
    assert "| true | 11.00 | 1.100 |" in text and "| fill | 12.00 | 1.200 |" in text
    assert "| cublas | 10.50 | 1.050 |" in text
    assert text.index("`index_put` | 5 | 45 | +40") < text.index("`gemm` | 100 | 130 | +30") < text.index("`sort`")
    assert "softmax" not in text and "GPU X" in text
    assert text.index("`sort`") < text.index("And the kernels") < text.index("`k_slow` | 0 | 40 | +40")
    # the profile split: operator rows (recorded on the CPU, with the kernels they launched) and kernel rows
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    rows = [SimpleNamespace(key="aten::index_put_", device_type=DeviceType.CPU, self_device_time_total=90.0),
            SimpleNamespace(key="aten::view", device_type=DeviceType.CPU, self_device_time_total=0.0),
            SimpleNamespace(key="indexing_backward_kernel", device_type=DeviceType.CUDA, self_device_time_total=60.0)]
    assert dc.device_times(rows, 3) == ({"aten::index_put_": 30.0}, {"indexing_backward_kernel": 20.0})


@needs_cuda
@pytest.mark.parametrize(("compile_", "clip", "norm"), [("false", "global", None), ("true", "global", None),
                                                       ("false", "adagc", None), ("true", "global", "powernorm")])
def test_cuda_steps_between_read_points_never_wait_for_the_device(tmp_path, cache, monkeypatch, compile_, clip, norm):
    """``torch.cuda.set_sync_debug_mode("error")`` around every step that is neither logged nor a diagnostic,
    evaluation or checkpoint step (after the first two, which compile): any host read of a device tensor there
    (``.item()``, ``float()``, an ``if`` on a tensor, a blocking copy) raises. The run completes (AdaGC too: its
    per-tensor clipping stays on the device; a compiled PowerNorm too: its counters and warm-up choices stay on the
    device)."""
    import normlab.train.loop as loop
    from normlab.config import load_config

    read_point = loop.Recipe._read_point

    def guarded(self, i):
        read = read_point(self, i)
        torch.cuda.set_sync_debug_mode("error" if (i >= 2 and not read) else "default")
        return read

    monkeypatch.setenv("NORMLAB_CACHE_DIR", str(cache))
    monkeypatch.setattr(loop.Recipe, "_read_point", guarded)
    sets = [*SMALL, "diag.every=4", "train.steps=24", "train.log_every=6", "train.eval_every=12",
            "train.checkpoint_every=12", f"train.compile={compile_}", f"train.clip={clip}",
            *([f"model.norm={norm}"] if norm else [])]
    try:
        s = loop.train(load_config("tiny", sets), tmp_path / "r", quiet=True)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert (s["status"], s["step"], s["device"]) == ("completed", 24, "cuda")


@needs_cuda
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_cuda_ddp_steps_between_read_points_never_wait_for_the_device(tmp_path, cache):
    """Two ranks on two GPUs (NCCL) with ``torch.cuda.set_sync_debug_mode("error")`` around every step that is not
    a read point (after the first two, which compile; tests/train/rank_probe.py): the loss sums' all-reduce and the
    stop flag wait for read points, so no host read or wait raises there; both ranks complete at the same step and
    read on the host only the batch's window offsets on those steps."""
    from tests.train.test_distributed import ALLOWED, _probe, _same_on_every_rank

    argv = ["train", "tiny", *CLI_SMALL, "--set", "diag.every=4", "--set", "train.steps=24", "--set",
            "train.log_every=6", "--set", "train.eval_every=12", "--set", "train.checkpoint_every=12"]
    got = _probe([*argv, "--out", str(tmp_path / "r")], tmp_path / "ranks", defer=True, cache=cache,
                 env={"NORMLAB_TEST_SYNC_ERROR": "1"})
    assert (_same_on_every_rank(got)["status"], got[0]["summary"]["step"]) == ("completed", 24)
    quiet = [i for i in range(2, 24) if (i + 1) % 4 and (i + 1) % 6]
    for g in got:
        assert g["summary"]["device"] == "cuda"
        for i in quiet:
            assert set(g["reads"][i]) <= ALLOWED, (i, g["reads"][i])


@needs_cuda
@pytest.mark.parametrize(("compile_", "clip"), [("false", "global"), ("true", "adagc")])
def test_cuda_stacked_steps_between_read_points_never_wait_for_the_device(tmp_path, cache, compile_, clip,
                                                                          monkeypatch):
    """The same check for a stacked group of 4 (normlab.train.stacked): ``set_sync_debug_mode("error")`` around
    every group step that no member logs, diagnoses, evaluates or checkpoints (after the first two); one member
    diverges (lr 1; at step 8 on the CPU, between the read points 6 and 10) and stops, the others complete."""
    from normlab.config import load_config
    from normlab.train.runstate import RunState
    from normlab.train.stacked import train_stacked

    read_point = RunState.read_point

    def guarded(self, i):
        read = read_point(self, i)
        torch.cuda.set_sync_debug_mode("error" if (i >= 2 and not read) else "default")
        return read

    monkeypatch.setattr(RunState, "read_point", guarded)
    sets = [*SMALL, "diag.every=5", "train.steps=24", "train.log_every=6", "train.eval_every=12",
            "train.checkpoint_every=12", f"train.compile={compile_}", f"train.clip={clip}", "train.track=[]",
            f"data.cache_dir={cache}"]
    cfgs = [load_config("tiny", [*sets, f"seed={s}", f"train.lr={lr}"])
            for s, lr in ((0, 5e-3), (1, 5e-3), (2, 1.0), (3, 1e-2))]
    try:
        out = train_stacked(cfgs, [tmp_path / f"s{i}" for i in range(4)], quiet=True)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert [(s["status"], s["device"]) for s in out] == [("completed", "cuda")] * 2 + [("diverged", "cuda")] + \
        [("completed", "cuda")]
    assert [s["step"] for s in out] == [24, 24, out[2]["step"], 24] and out[2]["step"] < 24



def _rope64(x: torch.Tensor, offset: int, base: float = 10000.0) -> torch.Tensor:
    """RoFormer's rotation (Su et al. 2021, eq. 34) in float64, differentiable: ``qkv [B, T, 3, H, d]`` (float64),
    q and k pairs ``(x[2i], x[2i+1])`` at position ``offset + t`` rotated by ``(offset + t) * base^(-2i/d)``, v as
    it is."""
    T, d = x.shape[1], x.shape[-1]
    inv_freq = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    a = torch.arange(offset, offset + T, dtype=torch.float64)[:, None] * inv_freq
    c, s = a.cos()[:, None, None], a.sin()[:, None, None]  # [T, 1, 1, d/2] against [B, T, 2, H, d/2]
    x0, x1 = x[:, :, :2, :, 0::2], x[:, :, :2, :, 1::2]
    qk = torch.stack((x0 * c - x1 * s, x0 * s + x1 * c), -1).flatten(-2)
    return torch.cat((qk, x[:, :, 2:]), 2)


@needs_cuda
def test_cuda_bf16_rope_is_one_compiled_kernel_each_way():
    """bf16 autocast, eager: ``rotate_qkv`` runs the compiled pair rotation (``positions._fused_pair_kernel``): at
    most 2 CUDA kernels for the forward and for the backward after warm-up (the eager pair form launches 4 or more
    each way), and its values match the float64 rotation, forward and backward (autograd of the reference: the
    rotation by the opposite angle), to bf16 round-off."""
    torch.manual_seed(0)
    rope = positions.RotaryEmbedding(64, 128, heads=4).cuda()
    qkv = torch.randn(4, 120, 3, 4, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(qkv.shape, device="cuda", dtype=torch.bfloat16)

    def forward() -> torch.Tensor:
        with torch.autocast("cuda", torch.bfloat16):
            return rope.rotate_qkv(qkv, 8)

    for _ in range(3):  # compile (forward and backward) and warm up
        torch.autograd.grad(forward(), qkv, w)
    torch.cuda.synchronize()

    def kernels(fn):
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            res = fn()
            torch.cuda.synchronize()
        return res, [e.name for e in prof.events() if e.device_type == DeviceType.CUDA]

    out, fwd = kernels(forward)
    (grad,), bwd = kernels(lambda: torch.autograd.grad(out, qkv, w))
    assert "failed" not in positions._fused, positions._fused.get("failed")
    assert out.dtype == torch.bfloat16 and len(fwd) <= 2 and len(bwd) <= 2, (fwd, bwd)
    x64 = qkv.detach().cpu().double().requires_grad_()
    ref = _rope64(x64, 8)
    (ref_grad,) = torch.autograd.grad(ref, x64, w.cpu().double())
    torch.testing.assert_close(out.cpu().double(), ref.detach(), atol=3e-2, rtol=3e-2)
    torch.testing.assert_close(grad.cpu().double(), ref_grad, atol=3e-2, rtol=3e-2)


@needs_cuda
def test_cuda_batch_views_go_through_a_dense_pinned_buffer():
    """``get_batch``'s ``x`` / ``y`` are strided views of one chunk; ``to_device`` copies each, dense, into pinned
    memory before the non-blocking copy (``pin_memory()`` would keep the view's strides and the device copy would go
    through a pageable temporary): the values arrive unchanged, contiguous, on the device."""
    from normlab.train.loop import to_device

    t = torch.arange(4 * 9, dtype=torch.int64).reshape(4, 9)
    for view in (t[:, :-1], t[:, 1:]):
        assert not view.is_contiguous()
        got = to_device(view, "cuda")
        torch.cuda.synchronize()
        assert got.is_cuda and got.is_contiguous() and torch.equal(got.cpu(), view)


def test_gpu_speed_rows_are_written_as_measured_and_a_failed_row_loses_no_other(tmp_path, monkeypatch, capsys):
    """benchmarks/gpu_speed.py with its measurements stood in (no GPU here): ``--costs`` / ``--modes`` select the
    rows, every row is printed as it is measured, a row whose run fails reads "failed" (one line naming the error on
    stderr) and the others are still measured, compared with nanoGPT and written to the section."""
    import sys
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent.parent / "benchmarks"))
    sys.modules.pop("gpu_speed", None)
    import gpu_speed as gs

    (tmp_path / "train.py").write_text("")
    monkeypatch.setattr(gs, "no_cuda_line", lambda: None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "GPU X")
    monkeypatch.setattr(gs, "nanogpt_rate", lambda shape, nano, work, steps, compiled: 500_000.0)

    def normlab_rate(shape, work, steps, sets, compiled):
        if sets == ["diag.every=0"]:
            raise RuntimeError("normlab train failed: boom")
        return (520_000.0 if not sets else 600_000.0), {"compile": compiled, "precision": "bf16"}

    monkeypatch.setattr(gs, "normlab_rate", normlab_rate)
    out = tmp_path / "bench.md"
    assert gs.main(["--nanogpt", str(tmp_path), "--out", str(out), "--shapes", "issue", "--no-demo", "--modes",
                    "compiled", "--costs", "defaults,diag.every=0,train.deterministic=true"]) == 0
    printed = capsys.readouterr()
    text = out.read_text()
    assert "| nanoGPT train.py, compiled | 500,000 | 1.00 |" in text and "eager" not in text
    assert "| normlab train, compiled, defaults (bf16) | 520,000 | 1.04 |" in text
    assert "| normlab train, compiled, train.deterministic=true (bf16) | 600,000 | 1.20 |" in text
    assert "| normlab train, compiled, diag.every=0 | failed | |" in text and "model.positions" not in text
    assert "a row failed: normlab train failed: boom" in printed.err and "| nanoGPT train.py" in printed.out
    assert gs.main(["--nanogpt", str(tmp_path), "--out", str(out), "--costs", "nothing"]) == 2


def test_device_check_dry_run_writes_every_step(tmp_path):
    """``DRY_RUN=1 bash benchmarks/device_check.sh`` (the GPU call's script, on the CPU at small shapes) runs every
    step within CI's 3 minutes and leaves its results under OUT as it goes: results.json (strict JSON) with each
    step, the speed rows with steady-state tokens/s and their ratios to the defaults, the stacked rows, and the scale
    estimate computed from the steady-state rate alone; device_check.md says it is a dry run."""
    import os
    import subprocess
    import sys
    import time
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    out = tmp_path / "out"
    env = {**os.environ, "DRY_RUN": "1", "OUT": str(out), "PYTHON": sys.executable, "NORMLAB_CACHE_DIR":
           str(tmp_path / "cache")}
    t = time.monotonic()
    r = subprocess.run(["bash", "benchmarks/device_check.sh"], cwd=root, env=env, capture_output=True, text=True,
                       timeout=200)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert time.monotonic() - t < 180
    res = json.loads((out / "results.json").read_text())
    steps = res["steps"]
    assert res["dry_run"] is True and list(steps) == ["device", "test_cuda", "speed", "stacked", "scale"]
    assert steps["test_cuda"]["status"] == "collected"
    rows = {row["run"]: row for row in steps["speed"]["rows"]}
    assert rows["nanoGPT train.py, compiled"]["status"] == "skipped (dry run)"
    base = rows["normlab train, defaults"]
    assert base["tokens_per_s"] > 0 and base["vs_defaults"] == 1.0 and base["deterministic"] is True
    for row in rows.values():  # measured, or cut at the step's limit on a loaded machine: never lost
        assert row.get("tokens_per_s", 0) > 0 or row.get("status"), row
        if row.get("tokens_per_s") and row["run"] != "normlab train, defaults":
            assert row["vs_defaults"] == pytest.approx(row["tokens_per_s"] / base["tokens_per_s"])
    demo = steps["stacked"]["rows"][0]
    assert demo["shape"].startswith("demo") and (demo.get("speedup", 0) > 0 or demo.get("status"))
    sc = steps["scale"]
    assert sc["runs"] == 320 and sc["hours_one_after_another"] == pytest.approx(
        320 * 2000 * 16 * 256 / sc["tokens_per_s"] / 3600)
    md = (out / "device_check.md").read_text()
    assert "DRY RUN on the CPU" in md and "| normlab train, defaults |" in md
    assert (out / "device_check.log").is_file() and (out / "test_cuda.log").is_file()
