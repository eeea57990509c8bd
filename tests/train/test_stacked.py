"""Stacked training (normlab.train.stacked): K runs of one architecture in one vmapped model against the same K runs
trained alone by normlab.train.loop (the independent reference)."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from normlab.config import load_config
from normlab.errors import NormlabError
from normlab.train.loop import train
from normlab.train.stacked import group_configs, stack_key, stack_refusal, train_stacked
from tests.helpers import scratch_norm, weights

pytestmark = pytest.mark.usefixtures("one_thread")

SETS = ["train.steps=6", "train.checkpoint_every=3", "train.eval_every=3", "train.log_every=1", "train.eval_batches=2",
        "train.warmup_steps=2", "train.track=[]", "diag.every=0", "model.width=32", "model.context=32",
        "train.batch_size=4", "train.precision=fp32", "train.compile=false"]
MEMBERS = [(0, 0.005), (1, 0.005), (2, 0.002), (3, 0.01)]  # (seed, lr): a variant's seeds and learning rates


def _cfgs(cache, extra=()):
    return [load_config("tiny", [*SETS, *extra, f"seed={s}", f"train.lr={lr}", f"data.cache_dir={cache}"])
            for s, lr in MEMBERS]


def _losses(run_dir):
    return [r["loss"] for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if "loss" in r]


@pytest.fixture(scope="module")
def alone(tmp_path_factory, cache):
    out = tmp_path_factory.mktemp("alone")
    for i, cfg in enumerate(_cfgs(cache)):
        train(cfg, out / f"r{i}", quiet=True)
    return out


@pytest.fixture(scope="module")
def stacked(tmp_path_factory, cache):
    out = tmp_path_factory.mktemp("stacked")
    summaries = train_stacked(_cfgs(cache), [out / f"r{i}" for i in range(len(MEMBERS))], quiet=True)
    return out, summaries


def test_four_stacked_members_equal_the_four_runs_alone(alone, stacked):
    out, summaries = stacked
    for i in range(len(MEMBERS)):
        a, s = alone / f"r{i}", out / f"r{i}"
        la, ls = _losses(a), _losses(s)
        assert len(la) == len(ls) == 6
        torch.testing.assert_close(torch.tensor(ls), torch.tensor(la), rtol=1e-5, atol=1e-6)
        wa, ws = weights(a), weights(s)
        assert wa.keys() == ws.keys()
        for k in wa:
            torch.testing.assert_close(ws[k], wa[k], rtol=1e-5, atol=1e-6, msg=f"member {i}: {k}")
        sa = json.loads((a / "summary.json").read_text())
        ss = json.loads((s / "summary.json").read_text())
        assert ss.keys() == sa.keys() and ss["status"] == "completed"
        assert summaries[i]["config_hash"] == sa["config_hash"]
        torch.testing.assert_close(ss["val_bpb"], sa["val_bpb"], rtol=1e-5, atol=1e-6)
        assert ss["init_val_bpb"] == sa["init_val_bpb"]  # the seeded initialisation is the run's own, exactly
        assert sorted(p.name for p in (s / "checkpoints").iterdir()) == ["step_00000003", "step_00000006"]
        for f in ("config.yaml", "fingerprint.json", "param_groups.json"):
            assert (s / f).read_text() == (a / f).read_text(), f
    # the members really differ (seeds and learning rates): the comparison above is not of one run four times
    qkv = "blocks.0.attn.qkv.weight"
    assert not torch.equal(weights(out / "r0")[qkv], weights(out / "r1")[qkv])


def test_a_stacked_group_resumed_from_a_checkpoint_is_bit_exact(stacked, tmp_path, cache):
    """As after a kill -9 between the checkpoints of step 3 and 6: the group resumes and ends bit for bit where the
    uninterrupted group ended."""
    out, _ = stacked
    dirs = []
    for i in range(len(MEMBERS)):
        d = tmp_path / f"r{i}"
        shutil.copytree(out / f"r{i}", d)
        shutil.rmtree(d / "checkpoints" / "step_00000006")
        (d / "model.safetensors").unlink()
        (d / "summary.json").unlink()
        dirs.append(d)
    summaries = train_stacked(_cfgs(cache), dirs, resume=True, quiet=True)
    assert [s["status"] for s in summaries] == ["completed"] * 4
    for i, d in enumerate(dirs):
        wa, wb = weights(out / f"r{i}"), weights(d)
        assert all(torch.equal(wa[k], wb[k]) for k in wa), f"member {i}"
        assert _losses(d) == _losses(out / f"r{i}")


def test_diagnostic_steps_and_a_diverging_member(tmp_path, cache):
    """diag.every: the diagnostic steps run each member through its own module (the records match a run alone); a
    member whose loss crosses its ceiling stops as ``diverged`` while the others finish."""
    cfgs = _cfgs(cache, ["diag.every=2", "train.steps=4"])
    cfgs[2].train.lr = 1e3  # diverges
    ref = tmp_path / "alone"
    train(_cfgs(cache, ["diag.every=2", "train.steps=4"])[0], ref, quiet=True)
    summaries = train_stacked(cfgs, [tmp_path / f"s{i}" for i in range(4)], quiet=True)
    assert [s["status"] for s in summaries] == ["completed", "completed", "diverged", "completed"]
    recs = lambda d: [r for r in map(json.loads, (d / "metrics.jsonl").read_text().splitlines())  # noqa: E731
                      if "diag/resid_rms/0" in r]
    ra, rs = recs(ref), recs(tmp_path / "s0")
    assert [r["step"] for r in ra] == [r["step"] for r in rs] == [2, 4]
    for a, s in zip(ra, rs):
        assert a.keys() == s.keys()
        keys = [k for k in a if k not in ("tokens_per_s", "elapsed_s")]  # timings
        torch.testing.assert_close(torch.tensor([s[k] for k in keys]), torch.tensor([a[k] for k in keys]),
                                   rtol=1e-4, atol=1e-6)


class _NoVmapFn(torch.autograd.Function):
    """An old-style autograd Function (no ``setup_context``): torch.func.vmap refuses it."""

    @staticmethod
    def forward(ctx, x):
        return x * 1.0

    @staticmethod
    def backward(ctx, g):
        return g


class _NoVmapNorm(torch.nn.Module):
    name = "novmap"
    paper = description = "test double whose forward cannot be vmapped"

    def __init__(self, dim, *, eps=1e-5, affine=True, bias=True):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return _NoVmapFn.apply(x) * self.weight


def test_an_rmsnorm_group_equals_its_runs_alone(tmp_path, cache):
    """RMSNorm's hand-written autograd Function has no vmap rule: under vmap the norm takes ``F.rms_norm`` (same
    formula), and the group still equals its runs alone to fp32 round-off."""
    extra = ["model.norm=rmsnorm", "train.steps=3", "train.checkpoint_every=3"]
    cfgs = _cfgs(cache, extra)[:2]
    train_stacked(cfgs, [tmp_path / "s0", tmp_path / "s1"], quiet=True)
    for i, cfg in enumerate(_cfgs(cache, extra)[:2]):
        train(cfg, tmp_path / f"a{i}", quiet=True)
        wa, ws = weights(tmp_path / f"a{i}"), weights(tmp_path / f"s{i}")
        for k in wa:
            torch.testing.assert_close(ws[k], wa[k], rtol=1e-5, atol=1e-6, msg=k)


def test_groups_and_refusals(cache, monkeypatch):
    name = scratch_norm(monkeypatch, "novmap", _NoVmapNorm)
    assert "cannot run under torch.func.vmap" in stack_refusal(load_config("tiny", [f"model.norm={name}"]))
    cfgs = _cfgs(cache)
    other = load_config("tiny", [*SETS, "model.norm=rmsnorm"])
    assert group_configs([cfgs[0], other, cfgs[1], cfgs[3]]) == [[0, 2, 3], [1]]
    assert stack_key(cfgs[0]) == stack_key(cfgs[3]) != stack_key(other)
    assert stack_refusal(cfgs[0]) is None
    assert "model.dropout" in stack_refusal(load_config("tiny", ["model.dropout=0.1"]))
    assert "running statistics" in stack_refusal(load_config("tiny", ["model.norm=batchnorm"]))
    with pytest.raises(NormlabError, match="differ only in seed and train.lr"):
        train_stacked([cfgs[0], other], ["a", "b"], quiet=True)


def test_ctrl_c_checkpoints_every_member_and_the_group_resumes_bit_exactly(stacked, tmp_path, cache, monkeypatch):
    """A stop request (Ctrl-C / SIGTERM, the flag the trainer checks between steps) after step 4: every member
    checkpoints there and ends ``interrupted``; resumed, the group ends bit for bit as the uninterrupted one."""
    import normlab.train.stacked as S

    class StopAfter(S.StopFlag):
        reads = 0

        @property
        def stop(self):
            StopAfter.reads += 1
            return StopAfter.reads > 4  # read once per step boundary: stops before step 5

        @stop.setter
        def stop(self, value):
            pass

    monkeypatch.setattr(S, "StopFlag", StopAfter)
    dirs = [tmp_path / f"r{i}" for i in range(len(MEMBERS))]
    summaries = train_stacked(_cfgs(cache), dirs, quiet=True)
    assert [(s["status"], s["step"]) for s in summaries] == [("interrupted", 4)] * 4
    assert all((d / "checkpoints" / "step_00000004").is_dir() and not (d / "model.safetensors").exists()
               for d in dirs)
    monkeypatch.undo()
    summaries = train_stacked(_cfgs(cache), dirs, resume=True, quiet=True)
    assert [s["status"] for s in summaries] == ["completed"] * 4
    out, _ = stacked
    for i, d in enumerate(dirs):
        wa, wb = weights(out / f"r{i}"), weights(d)
        assert all(torch.equal(wa[k], wb[k]) for k in wa), f"member {i}"


def test_a_second_ctrl_c_stops_at_once_and_the_group_still_resumes(stacked, tmp_path, cache, monkeypatch):
    """A second Ctrl-C (KeyboardInterrupt in the middle of step 5): no further checkpoint, each member's summary says
    ``interrupted`` at its last checkpoint (step 3), and the resumed group ends as the uninterrupted one."""
    import normlab.train.stacked as S

    real = S._finish_step

    def finish(m, *a, **k):
        if m.step == 4:
            raise KeyboardInterrupt
        return real(m, *a, **k)

    monkeypatch.setattr(S, "_finish_step", finish)
    dirs = [tmp_path / f"r{i}" for i in range(len(MEMBERS))]
    summaries = train_stacked(_cfgs(cache), dirs, quiet=True)
    assert [(s["status"], s["step"]) for s in summaries] == [("interrupted", 3)] * 4
    assert all(json.loads((d / "summary.json").read_text())["status"] == "interrupted" for d in dirs)
    monkeypatch.undo()
    train_stacked(_cfgs(cache), dirs, resume=True, quiet=True)
    out, _ = stacked
    for i, d in enumerate(dirs):
        wa, wb = weights(out / f"r{i}"), weights(d)
        assert all(torch.equal(wa[k], wb[k]) for k in wa), f"member {i}"


def test_a_stacked_forward_that_cannot_compile_runs_eager(tmp_path, cache, monkeypatch, capsys):
    """``train.compile: true`` compiles the vmapped forward; where torch cannot compile it (simulated: the compiled
    function raises on its first call), the group says so and trains eager, equal to its runs alone."""
    import normlab.train.stacked as S

    def broken(fn):
        def run(*a, **k):
            raise RuntimeError("cannot compile this")
        return run

    monkeypatch.setattr(S.torch, "compile", broken)
    extra = ["train.steps=2", "train.checkpoint_every=2", "train.compile=true"]
    cfgs = _cfgs(cache, extra)[:2]
    cfgs_alone = _cfgs(cache, [*extra[:2], "train.compile=false"])[:2]
    real = S.resolve_runtime

    def resolve(c):  # keep compile on whether or not this machine has a C++ compiler
        lines = real(c)
        c.train.compile = True
        return lines

    monkeypatch.setattr(S, "resolve_runtime", resolve)
    train_stacked(cfgs, [tmp_path / "s0", tmp_path / "s1"])
    assert "torch.compile of it failed (RuntimeError)" in capsys.readouterr().out
    for i, cfg in enumerate(cfgs_alone):
        train(cfg, tmp_path / f"a{i}", quiet=True)
        wa, ws = weights(tmp_path / f"a{i}"), weights(tmp_path / f"s{i}")
        for k in wa:
            torch.testing.assert_close(ws[k], wa[k], rtol=1e-5, atol=1e-6, msg=k)
