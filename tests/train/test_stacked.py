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
from normlab.train.precision import cxx_compiler
from normlab.train.stackable import group_configs, stack_key, stack_refusal
from normlab.train.stacked import train_stacked
from tests.helpers import HostReads, scratch_norm, weights

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


STREAM_CASES = {
    "hc": ["model.residual=hc", "model.streams=2"],
    "mhc": ["model.residual=mhc", "model.streams=2", "model.sinkhorn_iters=5"],
    # nGPT: the weights renormalised after every optimizer step, per member (GPT.after_optimizer_step)
    "ngpt": ["model.residual=ngpt", "model.norm=none", "model.tie_embeddings=false", "train.weight_decay=0"],
}


@pytest.mark.parametrize("case", list(STREAM_CASES))
def test_a_residual_stream_group_equals_its_runs_alone(tmp_path, cache, case):
    """Hyper-connections, mHC (Sinkhorn-Knopp under vmap) and nGPT (its post-step projection) stack: each member's
    weights after 3 steps equal the same run trained alone to fp32 round-off (mHC: atol 1e-5, the Sinkhorn
    iterations' exp and row/column sums reduced in another order under vmap; measured 1.4e-6 on one static_alpha
    entry), and nGPT's weight rows stay on the unit sphere in every member."""
    extra = [*STREAM_CASES[case], "train.steps=3", "train.checkpoint_every=3"]
    cfgs = _cfgs(cache, extra)[:2]
    assert stack_refusal(cfgs[0]) is None
    train_stacked(cfgs, [tmp_path / "s0", tmp_path / "s1"], quiet=True)
    for i, cfg in enumerate(_cfgs(cache, extra)[:2]):
        train(cfg, tmp_path / f"a{i}", quiet=True)
        wa, ws = weights(tmp_path / f"a{i}"), weights(tmp_path / f"s{i}")
        assert set(wa) == set(ws)
        for k in wa:
            torch.testing.assert_close(ws[k], wa[k], rtol=1e-5, atol=1e-5 if case == "mhc" else 1e-6, msg=k)
        if case == "ngpt":  # rows of the readers, columns of the writers (attention / MLP proj): unit norm
            mats = {k: v for k, v in ws.items() if v.ndim == 2}
            assert any(k.endswith(".proj.weight") for k in mats) and len(mats) > 3
            for k, v in mats.items():
                norms = v.norm(dim=0 if k.endswith(".proj.weight") else 1)
                torch.testing.assert_close(norms, torch.ones_like(norms), rtol=0, atol=1e-5, msg=k)


DROPOUT_CASES = {
    "sdpa-causal": [],
    "sdpa-mask": ["model.positions=alibi"],  # SDPA with an additive mask
    "explicit": ["model.attn_softcap=5.0"],  # softmax on the explicit path: F.dropout on the probabilities
    "softplus-accum-diag": ["model.attention=softplus", "train.grad_accum=2", "diag.every=2"],
    "bf16": ["train.precision=bf16"],  # the explicit attention path on autocast's bf16 inputs, in fp32 as SDPA
}


@pytest.mark.parametrize("case", list(DROPOUT_CASES))
def test_members_with_dropout_draw_their_own_masks_as_alone(tmp_path, cache, case):
    """``model.dropout > 0`` on a CPU: each member's masks (embedding, attention probabilities, residual branches,
    MLP) come from its own RNG stream, so the group equals its runs alone to fp32 round-off -- with gradient
    accumulation and with diagnostic steps (run alone) between stacked ones; the losses differ from the same runs
    without dropout (the masks are applied)."""
    extra = ["model.dropout=0.2", "train.steps=4", "train.checkpoint_every=4", "device=cpu", *DROPOUT_CASES[case]]
    cfgs = _cfgs(cache, extra)[:2]
    assert stack_refusal(cfgs[0]) is None
    train_stacked(cfgs, [tmp_path / "s0", tmp_path / "s1"], quiet=True)
    # bf16: batched bf16 products round in another order than a run alone's, so the losses agree to bf16 round-off
    # (atol 1e-4), not fp32's; this tolerance fails with the explicit attention path computed in bf16 (checked by
    # disabling the autocast branch of normlab.attention.dropout.sdpa) and with a wrong mask
    tol = {"rtol": 2e-5, "atol": 1e-4} if case == "bf16" else {"rtol": 1e-5, "atol": 1e-6}
    for i, cfg in enumerate(_cfgs(cache, extra)[:2]):
        train(cfg, tmp_path / f"a{i}", quiet=True)
        la, ls = _losses(tmp_path / f"a{i}"), _losses(tmp_path / f"s{i}")
        torch.testing.assert_close(torch.tensor(ls), torch.tensor(la), **tol)
        if case == "bf16":
            continue
        wa, ws = weights(tmp_path / f"a{i}"), weights(tmp_path / f"s{i}")
        for k in wa:
            torch.testing.assert_close(ws[k], wa[k], rtol=1e-5, atol=1e-6, msg=f"member {i}: {k}")
    train(_cfgs(cache, [*extra, "model.dropout=0.0"])[0], tmp_path / "nodrop", quiet=True)
    assert abs(_losses(tmp_path / "nodrop")[-1] - _losses(tmp_path / "s0")[-1]) > 1e-3


def test_a_group_with_dropout_resumes_bit_exactly(tmp_path, cache):
    """A member's RNG state, advanced by its stacked mask draws, is what its checkpoint stores: resumed from step 2's
    checkpoints, a dropout group ends bit for bit as the uninterrupted one."""
    extra = ["model.dropout=0.2", "train.steps=4", "train.checkpoint_every=2", "device=cpu"]
    full = [tmp_path / "f0", tmp_path / "f1"]
    train_stacked(_cfgs(cache, extra)[:2], full, quiet=True)
    dirs = []
    for d in full:
        r = tmp_path / f"r{d.name}"
        shutil.copytree(d, r)
        shutil.rmtree(r / "checkpoints" / "step_00000004")
        (r / "model.safetensors").unlink()
        (r / "summary.json").unlink()
        dirs.append(r)
    train_stacked(_cfgs(cache, extra)[:2], dirs, resume=True, quiet=True)
    for a, b in zip(full, dirs):
        wa, wb = weights(a), weights(b)
        assert all(torch.equal(wa[k], wb[k]) for k in wa)
        assert _losses(a) == _losses(b)


def test_groups_and_refusals(cache, monkeypatch):
    name = scratch_norm(monkeypatch, "novmap", _NoVmapNorm)
    assert "cannot run under torch.func.vmap" in stack_refusal(load_config("tiny", [f"model.norm={name}"]))
    cfgs = _cfgs(cache)
    other = load_config("tiny", [*SETS, "model.norm=rmsnorm"])
    assert group_configs([cfgs[0], other, cfgs[1], cfgs[3]]) == [[0, 2, 3], [1]]
    assert stack_key(cfgs[0]) == stack_key(cfgs[3]) != stack_key(other)
    assert stack_refusal(cfgs[0]) is None
    assert stack_refusal(load_config("tiny", ["model.dropout=0.1", "device=cpu"])) is None  # masks drawn per member
    assert "model.dropout=0.1 on CUDA" in stack_refusal(load_config("tiny", ["model.dropout=0.1", "device=cuda"]))
    compiled = stack_refusal(load_config("tiny", ["model.dropout=0.1", "device=cpu", "train.compile=true"]))
    if cxx_compiler() is not None:  # a compiled run alone draws its masks in inductor's kernels
        assert "with train.compile on" in compiled
    else:  # without a C++ compiler the run alone runs eager too
        assert compiled is None
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


class _BackwardFails(torch.autograd.Function):
    """Identity whose backward raises: a compiled function whose lazily compiled backward cannot compile. Before it
    raises it leaves gradients in the members' parameters (through the stacked ``params``), as a backward that fails
    part way could: the repeated micro-batch must not add to them."""

    @staticmethod
    def forward(ctx, t, params):
        ctx.params = params
        return t.view_as(t)

    @staticmethod
    def backward(ctx, g):
        with torch.enable_grad():
            torch.autograd.backward([p.sum() for p in ctx.params.values() if p.requires_grad])
        raise RuntimeError("cannot compile this backward")


def _group_with_broken_compile(tmp_path, cache, monkeypatch, broken, cfgs):
    """Train ``cfgs`` stacked with ``torch.compile`` replaced by ``broken`` and compile kept on (with or without a
    C++ compiler); returns the members' summaries."""
    import normlab.train.resolve as R
    import normlab.train.stacked as S

    real = R.resolve_runtime

    def resolve(c):
        lines = real(c)
        c.train.compile = True
        return lines

    with monkeypatch.context() as m:  # the group alone: the runs alone it is compared with resolve as they would
        m.setattr(S.torch, "compile", broken)
        m.setattr(R, "resolve_runtime", resolve)
        return train_stacked(cfgs, [tmp_path / f"s{i}" for i in range(len(cfgs))])


def _equal_alone(tmp_path, cache, extra, n):
    """Members ``0..n-1`` equal their runs alone (uncompiled) to fp32 round-off."""
    for i, cfg in enumerate(_cfgs(cache, [*extra, "train.compile=false"])[:n]):
        train(cfg, tmp_path / f"a{i}", quiet=True)
        wa, ws = weights(tmp_path / f"a{i}"), weights(tmp_path / f"s{i}")
        for k in wa:
            torch.testing.assert_close(ws[k], wa[k], rtol=1e-5, atol=1e-6, msg=k)


@pytest.mark.parametrize("fails", ["forward", "backward"])
def test_a_stacked_forward_that_cannot_compile_runs_eager(tmp_path, cache, monkeypatch, capsys, fails):
    """``train.compile: true`` compiles the vmapped forward; where torch cannot compile it (simulated: the compiled
    function raises on its first call, or its backward, which AOTAutograd compiles when it first runs, raises), the
    group says so, repeats the micro-batch eager and trains on eager, equal to its runs alone."""
    def broken(fn):
        def run(*a, **k):
            if fails == "forward":
                raise RuntimeError("cannot compile this")
            return _BackwardFails.apply(fn(*a, **k), a[0])
        return run

    extra = ["train.steps=2", "train.checkpoint_every=2"]
    summaries = _group_with_broken_compile(tmp_path, cache, monkeypatch, broken,
                                           _cfgs(cache, [*extra, "train.compile=true"])[:2])
    assert "torch.compile of it failed (RuntimeError) (from step 1)" in capsys.readouterr().out
    assert [s["compile_fallback_step"] for s in summaries] == [1, 1]
    assert json.loads((tmp_path / "s0" / "summary.json").read_text())["compile_fallback_step"] == 1
    _equal_alone(tmp_path, cache, extra, 2)


def test_a_member_that_diverges_leaves_the_group_without_a_recompile(tmp_path, cache, monkeypatch):
    """A compiled group keeps its shape when a member diverges: the member's slot is masked (placeholder weights, no
    loss, nothing drawn from its data or RNG), so dynamo compiles the stacked forward once (a compile counter as
    torch.compile's backend) and never again, and the healthy members finish equal to their runs alone."""
    from torch._dynamo.testing import CompileCounter

    import normlab.train.resolve as R
    import normlab.train.stacked as S

    counter, real_compile, real_resolve = CompileCounter(), torch.compile, R.resolve_runtime
    extra = ["train.steps=6", "train.checkpoint_every=6", "diag.every=0"]
    cfgs = _cfgs(cache, [*extra, "train.compile=true"])[:3]
    cfgs[1].train.lr = 1e3  # diverges in the first steps: the group goes on with the other two

    def resolve(c):
        lines = real_resolve(c)
        c.train.compile = True  # with or without a C++ compiler here (the counter compiles nothing)
        return lines

    with monkeypatch.context() as m:
        m.setattr(S.torch, "compile", lambda fn, **k: real_compile(fn, backend=counter))
        m.setattr(R, "resolve_runtime", resolve)
        summaries = train_stacked(cfgs, [tmp_path / f"s{i}" for i in range(3)])
    assert [s["status"] for s in summaries] == ["completed", "diverged", "completed"]
    assert summaries[1]["step"] < 6 and "compile_fallback_step" not in summaries[0]
    assert counter.frame_count == 1  # one compile, for K = 3, kept after the divergence
    alone = _cfgs(cache, [*extra, "train.compile=false"])
    for i in (0, 2):
        train(alone[i], tmp_path / f"a{i}", quiet=True)
        wa, ws = weights(tmp_path / f"a{i}"), weights(tmp_path / f"s{i}")
        for k in wa:
            torch.testing.assert_close(ws[k], wa[k], rtol=1e-5, atol=1e-6, msg=k)


# -- host reads: the CPU stand-in for torch.cuda.set_sync_debug_mode ---------------------------------------------------

QUIET = ["train.steps=12", "train.log_every=6", "train.eval_every=12", "train.checkpoint_every=6", "diag.every=4"]
TIMINGS = ("tokens_per_s", "elapsed_s", "compile_s", "threads_reason", "wall_s_per_token", "mfu")


def _group_counting_reads(out, cfgs, monkeypatch, defer, quiet=True):
    """Train ``cfgs`` as one group with reads deferred (the accelerator policy, here on the CPU) or read at every
    step, listing per step every host read of a tensor's value (tests.helpers.HostReads). A step starts where the
    group decides whether it is read."""
    import normlab.train.stacked as S
    from normlab.train.runstate import RunState

    reads, read_point = HostReads(), RunState.read_point

    def marked(self, i):
        reads.step = i
        return read_point(self, i) or not defer

    monkeypatch.setattr(RunState, "read_point", marked)
    monkeypatch.setattr(S, "defer_reads", lambda cfg: True)
    with reads:
        summaries = train_stacked(cfgs, [out / f"r{i}" for i in range(len(cfgs))], quiet=quiet)
    monkeypatch.undo()
    return summaries, reads.reads


def _records(run_dir):
    return [{k: v for k, v in json.loads(line).items() if k not in TIMINGS}
            for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _same_group(a, sa, b, sb, n, skip=()):
    """Two groups' run directories and summaries are equal but for timings (and the keys in ``skip``): metrics
    lines, summaries and final weights bit for bit."""
    for i in range(n):
        assert _records(a / f"r{i}") == _records(b / f"r{i}"), f"member {i}"
        # runtime_notes: why the runtime chose its threads, read off the machine's load at the time (not a number)
        x, y = ({k: v for k, v in s[i].items() if k not in (*TIMINGS, "run_dir", "runtime_notes", *skip)}
                for s in (sa, sb))
        assert x == y, f"member {i}"
        if sa[i]["status"] == "completed":
            wa, wb = weights(a / f"r{i}"), weights(b / f"r{i}")
            assert all(torch.equal(wa[k], wb[k]) for k in wa), f"member {i}"


@pytest.mark.parametrize("clip", ["global", "adagc"])
def test_a_stacked_step_between_read_points_reads_nothing_on_the_host(tmp_path, cache, monkeypatch, clip):
    """With reads deferred, a group's step that no member logs, diagnoses, evaluates or checkpoints reads no tensor
    of any member (AdaGC's per-tensor clipping included): only each member's batch window offsets (drawn from its CPU
    data generator on every device) and torch's AdamW step counters (CPU tensors on every device). Before, such a
    step read every member's loss, extra terms and gradient norm (and AdaGC its per-tensor scales). The group ends
    bit for bit as when every step is read."""
    extra = [*QUIET, f"train.clip={clip}", "train.warmup_steps=3", "train.adagc_lambda=0.5"]
    s_now, r_now = _group_counting_reads(tmp_path / "now", _cfgs(cache, extra), monkeypatch, defer=False)
    s_def, r_def = _group_counting_reads(tmp_path / "def", _cfgs(cache, extra), monkeypatch, defer=True)
    quiet_steps = [i for i in range(12) if (i + 1) % 4 and (i + 1) % 6]  # diag.every 4, log every 6
    assert quiet_steps == [0, 1, 2, 4, 6, 8, 9, 10]
    allowed = {"tolist loop.py:get_batch", "optimizer.py:_get_value"}
    for i in quiet_steps:
        assert set(r_def[i]) <= allowed, (i, r_def[i])
        assert r_def[i].count("tolist loop.py:get_batch") == len(MEMBERS)
        assert r_now[i].count("runstate.py:after_backward") == 2 * len(MEMBERS)  # loss and grad norm, this step
    settled = {i: r_def[i].count("runstate.py:settle") // (2 * len(MEMBERS)) for i in range(12)}
    assert settled == {**dict.fromkeys(range(12), 0), 3: 3, 5: 1, 7: 1, 11: 3}  # the unread steps, at the next read
    if clip == "adagc":
        assert sum(s["adagc_clipped"]["attn"] for s in s_def) > 0  # lambda 0.5 clips
    _same_group(tmp_path / "now", s_now, tmp_path / "def", s_def, len(MEMBERS))


@pytest.mark.parametrize("clip", ["global", "adagc"])
def test_a_member_diverging_between_read_points_ends_as_if_read_at_once(tmp_path, cache, monkeypatch, capsys, clip):
    """A member that spikes and diverges at a step no one reads (lr 1: spikes at steps 3 and 4, diverged at 4; read
    points at steps 6 and 12) stops at the
    next read point with the step, status, loss, spike list, tokens, clip counts and message it gets when every
    step is read; the other members go on and end bit for bit as in the group read at every step."""
    extra = [*QUIET, "diag.every=0", f"train.clip={clip}", "train.warmup_steps=3", "diag.spike_factor=1.01",
             "diag.spike_window=2"]
    got = {}
    for name, defer in (("now", False), ("def", True)):
        cfgs = _cfgs(cache, extra)
        cfgs[2].train.lr = 1.0
        got[name] = _group_counting_reads(tmp_path / name, cfgs, monkeypatch, defer=defer, quiet=False)[0]
        got[name + "_out"] = [line for line in capsys.readouterr().out.splitlines() if "diverged" in line]
    a, b = got["now"], got["def"]
    assert [s["status"] for s in a] == ["completed", "completed", "diverged", "completed"]
    assert a[2]["step"] % 6 != 0 and a[2]["loss_spikes"]["count"] >= 2
    assert got["now_out"] == got["def_out"] and len(got["now_out"]) == 1
    if clip == "adagc":
        assert sum(a[2]["adagc_clipped"].values()) > 0
    _same_group(tmp_path / "now", a, tmp_path / "def", b, len(MEMBERS), skip=("weight_norms",))


def test_an_out_of_memory_error_on_the_first_compiled_call_is_not_taken_for_a_compile_failure(
        tmp_path, cache, monkeypatch, capsys):
    """The first call with a group size K compiles, but not every failure there is the compiler's: an out-of-memory
    error (simulated) stops the group with that error instead of switching it to eager."""
    def broken(fn):
        def run(*a, **k):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return run

    cfgs = _cfgs(cache, ["train.steps=2", "train.checkpoint_every=2", "train.compile=true"])[:2]
    with pytest.raises(torch.OutOfMemoryError):
        _group_with_broken_compile(tmp_path, cache, monkeypatch, broken, cfgs)
    assert "torch.compile of it failed" not in capsys.readouterr().out


def test_a_group_that_cannot_fit_in_memory_is_one_line_before_anything_is_written(tmp_path, cache, monkeypatch):
    """Each member fits alone, the group of 4 does not (NORMLAB_MEMORY_GB between one member's estimate and four
    members'): train_stacked refuses in one line with the group's estimate, as a run alone that cannot fit is
    refused, before any run directory is written (the group was never checked and ran out of memory mid-setup)."""
    from normlab.validate import GiB, check_train_memory, forward_bytes, param_count

    cfgs = _cfgs(cache)
    one = load_config("tiny", [*SETS, f"data.cache_dir={cache}"])
    one.model.vocab_size = 256  # the tiny preset's bytes tokenizer
    need = 16 * param_count(one.model) + forward_bytes(one.model, 4, 32, backward=True)
    monkeypatch.setenv("NORMLAB_MEMORY_GB", str(2.5 * need / GiB))
    check_train_memory(one)  # one member alone fits
    dirs = [tmp_path / f"r{i}" for i in range(len(cfgs))]
    with pytest.raises(NormlabError, match=r"a stacked group of 4 needs an estimated .* alone \(train.stack: off\)"):
        train_stacked(cfgs, dirs, quiet=True)
    assert not any(d.exists() for d in dirs)


def test_torch_s_vmap_fallback_note_stays_off_stderr(tmp_path, cache):
    """On a CPU, SDPA's flash kernel has no vmap batching rule and torch warns that it runs member by member; the
    group keeps that note off stderr (a bad-input error line must be the only line there; docs/compare.md says it)."""
    import warnings

    from normlab.train.stackable import VMAP_FALLBACK_WARNING

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        train_stacked(_cfgs(cache, ["train.steps=1", "train.checkpoint_every=1", "train.compile=false"])[:2],
                      [tmp_path / "s0", tmp_path / "s1"], quiet=True)
    assert not [(w.filename, w.lineno) for w in seen if VMAP_FALLBACK_WARNING in str(w.message)]


def test_a_member_that_fails_leaves_the_group_and_the_others_finish(tmp_path, cache, monkeypatch):
    """One member's own step raises (simulated: its evaluation, at step 4 of 6): it leaves the group as failed, with
    its error and no summary.json, masked from then on without a recompile (a compile counter as torch.compile's
    backend), and the healthy members finish equal to their runs alone."""
    from torch._dynamo.testing import CompileCounter

    import normlab.train.resolve as R
    import normlab.train.stacked as S

    counter, real_compile, real_resolve = CompileCounter(), torch.compile, R.resolve_runtime
    extra = ["train.steps=6", "train.checkpoint_every=2", "train.eval_every=2", "diag.every=0"]
    cfgs = _cfgs(cache, [*extra, "train.compile=true"])[:3]
    real_eval = S._Member.evaluate

    def evaluate(self, record, lr, grad_norm):
        if self.run_dir.name == "s1" and self.step == 4:
            raise OSError("disk full")
        return real_eval(self, record, lr, grad_norm)

    with monkeypatch.context() as m:
        m.setattr(S.torch, "compile", lambda fn, **k: real_compile(fn, backend=counter))
        m.setattr(R, "resolve_runtime", lambda c: (real_resolve(c), setattr(c.train, "compile", True))[0])
        m.setattr(S._Member, "evaluate", evaluate)
        summaries = train_stacked(cfgs, [tmp_path / f"s{i}" for i in range(3)])
    assert [s["status"] for s in summaries] == ["completed", "failed", "completed"]
    assert summaries[1]["error"] == "OSError: disk full" and summaries[1]["step"] == 4
    assert not (tmp_path / "s1" / "summary.json").exists() and (tmp_path / "s1" / "checkpoints").is_dir()
    assert counter.frame_count == 1
    alone = _cfgs(cache, [*extra, "train.compile=false"])
    for i in (0, 2):
        train(alone[i], tmp_path / f"a{i}", quiet=True)
        wa, ws = weights(tmp_path / f"a{i}"), weights(tmp_path / f"s{i}")
        for k in wa:
            torch.testing.assert_close(ws[k], wa[k], rtol=1e-5, atol=1e-6, msg=k)


def test_a_member_whose_checkpoint_is_damaged_fails_alone_on_resume(stacked, tmp_path, cache, capsys):
    """As after a kill -9 between the checkpoints of step 3 and 6, with member 2's last checkpoint damaged (its
    weights cut short): that member is reported failed in one line naming its run directory, its files left as they
    were, and the three healthy members resume and end where the uninterrupted group ended."""
    out, _ = stacked
    dirs = []
    for i in range(len(MEMBERS)):
        d = tmp_path / f"r{i}"
        shutil.copytree(out / f"r{i}", d)
        shutil.rmtree(d / "checkpoints" / "step_00000006")
        (d / "model.safetensors").unlink()
        (d / "summary.json").unlink()
        dirs.append(d)
    bad = dirs[2] / "checkpoints" / "step_00000003" / "model.safetensors"
    bad.write_bytes(bad.read_bytes()[:1000])

    def files(d):  # the run's files (the trainer's lock, .train.lock, is taken while the group runs)
        return sorted((p.relative_to(d), p.read_bytes()) for p in d.rglob("*")
                      if p.is_file() and p.name != ".train.lock")

    before = files(dirs[2])
    capsys.readouterr()
    summaries = train_stacked(_cfgs(cache), dirs, resume=True)
    assert [s["status"] for s in summaries] == ["completed", "completed", "failed", "completed"]
    assert summaries[2]["error"].startswith("cannot resume: ") and summaries[2]["run_dir"] == str(dirs[2])
    lines = [ln for ln in capsys.readouterr().out.splitlines() if "cannot resume" in ln]
    assert len(lines) == 1 and lines[0].startswith(f"{dirs[2]}: cannot resume (") and \
        lines[0].endswith("; the group goes on without it")
    assert files(dirs[2]) == before
    for i in (0, 1, 3):
        wa, wb = weights(out / f"r{i}"), weights(dirs[i])
        for k in wa:  # a group of three, not four: the same runs, to the tolerance of runs alone vs stacked
            torch.testing.assert_close(wb[k], wa[k], rtol=1e-5, atol=1e-6, msg=f"member {i}: {k}")
        torch.testing.assert_close(torch.tensor(_losses(dirs[i])), torch.tensor(_losses(out / f"r{i}")),
                                   rtol=1e-5, atol=1e-6)
        assert json.loads((dirs[i] / "summary.json").read_text())["status"] == "completed"


@pytest.mark.parametrize("optim", [[], ["optim.perp_grad=true"]], ids=["adamw", "perp-grad"])
def test_members_update_together_where_they_can_and_equal_their_runs_alone(tmp_path, cache, monkeypatch, optim):
    """Plain AdamW: every update of the group is one normlab.train.optim.step_together call (members 0 and 1 share
    a learning rate, so one bucket); perp-Grad's step hook: it refuses, each member steps its own optimizer. Either
    way each member ends as its run alone (to the stacked forward's fp32 round-off, as above)."""
    import normlab.train.stacked as S

    extra = ["train.steps=4", "train.checkpoint_every=4", "train.eval_every=4", *optim]
    calls, real = [], S.step_together
    monkeypatch.setattr(S, "step_together", lambda opts: calls.append((len(opts), real(opts))) or calls[-1][1])
    cfgs = _cfgs(cache, extra)[:3]
    train_stacked(cfgs, [tmp_path / f"s{i}" for i in range(3)], quiet=True)
    assert calls == [(3, not optim)] * 4
    for i, cfg in enumerate(_cfgs(cache, extra)[:3]):
        train(cfg, tmp_path / f"a{i}", quiet=True)
        wa, ws = weights(tmp_path / f"a{i}"), weights(tmp_path / f"s{i}")
        for k in wa:
            torch.testing.assert_close(ws[k], wa[k], rtol=1e-5, atol=1e-6, msg=f"member {i}: {k}")


def test_a_member_whose_checkpoint_write_fails_fails_alone_with_its_previous_checkpoint(tmp_path, cache,
                                                                                         monkeypatch):
    """Checkpoints are written in the background (normlab.train.checkpointer): member s1's last one cannot be
    written (a full disk); the error reaches the group at the end, s1 fails alone with it, keeping its step-2
    checkpoint and writing no summary; the others complete."""
    from safetensors import SafetensorError

    import normlab.rundir.tensors as tensor_files

    real = tensor_files.save_file

    def save_file(tensors, path, *a, **k):
        if "/s1/checkpoints/.step_00000004." in path:
            raise SafetensorError("No space left on device (os error 28)")
        return real(tensors, path, *a, **k)

    monkeypatch.setattr(tensor_files, "save_file", save_file)
    cfgs = _cfgs(cache, ["train.steps=4", "train.checkpoint_every=2", "train.eval_every=4"])[:3]
    summaries = train_stacked(cfgs, [tmp_path / f"s{i}" for i in range(3)], quiet=True)
    assert [s["status"] for s in summaries] == ["completed", "failed", "completed"]
    assert summaries[1]["error"].startswith("OSError: [Errno 28] No space left on device") and summaries[1]["step"] == 4
    assert [p.name for p in (tmp_path / "s1" / "checkpoints").iterdir()] == ["step_00000002"]
    assert not (tmp_path / "s1" / "summary.json").exists()
    assert all((tmp_path / f"s{i}" / "checkpoints" / "step_00000004").is_dir() for i in (0, 2))
