"""normlab.norms.batchstat: BatchNorm over tokens against torch.nn.BatchNorm1d, and what every
batch-statistic norm (BatchNorm, PowerNorm, Unified) shares: eval changes no state and mixes no
sequences, warm-up counts optimizer steps, a resume mid-warm-up is bit-exact, no host read per step, and under
torch.compile the same numbers without a graph break or a recompilation."""

from __future__ import annotations

import contextlib
import shutil

import pytest
import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from normlab.norms import build_norm, norm_names
from tests.helpers import rand, randomize_affine

D = 8
BATCH_STAT = ("batchnorm", "powernorm", "unified")


# ---------------------------------------------------------------- BatchNorm over tokens
def test_batchnorm_matches_torch_train_and_eval():
    m = build_norm("batchnorm", D, eps=1e-5).double()
    ref = torch.nn.BatchNorm1d(D, eps=1e-5, momentum=0.1).double()
    randomize_affine(m)
    with torch.no_grad():
        ref.weight.copy_(m.weight), ref.bias.copy_(m.bias)
    for step in range(3):
        x = rand(4, 6, D, seed=step, scale=2.0, shift=1.5).requires_grad_()
        xr = x.detach().clone().requires_grad_()
        y, yr = m(x), ref(xr.reshape(-1, D)).reshape(4, 6, D)
        torch.testing.assert_close(y, yr)
        dy = rand(4, 6, D, seed=10 + step)
        (y * dy).sum().backward(), (yr * dy).sum().backward()
        torch.testing.assert_close(x.grad, xr.grad)
    torch.testing.assert_close(m.running_mean, ref.running_mean)
    torch.testing.assert_close(m.running_var, ref.running_var)
    assert m.num_batches.item() == 3 and m.num_batches.dtype == torch.long
    m.eval(), ref.eval()
    x = rand(2, 5, D, seed=7, shift=1.0)
    torch.testing.assert_close(m(x), ref(x.reshape(-1, D)).reshape(2, 5, D))


def test_batchnorm_mask_uses_real_tokens_only():
    m = build_norm("batchnorm", D).double()
    ref = torch.nn.BatchNorm1d(D).double()
    x = rand(3, 5, D, scale=2.0, shift=1.0)
    mask = torch.ones(3, 5, dtype=torch.bool)
    mask[1, 3:] = False
    mask[2, 1:] = False
    y = m(x, mask=mask)
    torch.testing.assert_close(y[mask], ref(x[mask]))
    torch.testing.assert_close(m.running_mean, ref.running_mean)
    torch.testing.assert_close(m.running_var, ref.running_var)


# ---------------------------------------------------------------- shared batch-statistic behaviour
def warm(m, n=4):
    m.train()
    for i in range(n):
        x = rand(3, 5, D, seed=100 + i, scale=2.0, shift=0.5).float().requires_grad_()
        m(x).pow(2).sum().backward()
        for p in m.parameters():
            p.grad = None


@pytest.mark.parametrize("name", BATCH_STAT)
def test_eval_does_not_change_state(name):
    m = build_norm(name, D, warmup=1) if name != "batchnorm" else build_norm(name, D)
    warm(m)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    m.eval()
    x = rand(3, 5, D, seed=1).float().requires_grad_()
    m(x).sum().backward()
    after = m.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    m.train()
    m(x)
    assert not all(torch.equal(before[k], m.state_dict()[k]) for k in before)  # training does change it


@pytest.mark.parametrize("name", norm_names())
def test_eval_output_does_not_depend_on_other_sequences(name):
    torch.manual_seed(0)
    m = build_norm(name, D)
    warm(m)
    m.eval()
    x = rand(3, 5, D, seed=2).float()
    x2 = x.clone()
    x2[1:] = rand(2, 5, D, seed=3, scale=10.0).float()
    torch.testing.assert_close(m(x)[0], m(x2)[0])
    torch.testing.assert_close(m(x)[0], m(x[:1])[0])
    if name in BATCH_STAT:  # training mode uses batch statistics: the same change does leak
        m.train()
        assert not torch.allclose(m(x)[0], m(x2)[0])


@pytest.mark.parametrize("name", ("powernorm", "unified"))
def test_warmup_counts_optimizer_steps_under_grad_accumulation(name):
    for set_to_none in (True, False):
        m = build_norm(name, D, warmup=3)
        opt = torch.optim.SGD(m.parameters(), lr=0.01)
        for _ in range(3):
            for micro in range(2):
                m(rand(2, 3, D, seed=micro).float()).pow(2).mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=set_to_none)
        assert m.num_batches.item() == 6 and m.step.item() == 3, set_to_none


@pytest.mark.parametrize("name, opts", [("powernorm", {"warmup": 4, "groups": 2}),
                                        ("unified", {"warmup": 4, "window": 2}),
                                        ("batchnorm", {})])
def test_state_dict_resume_is_bit_exact_mid_warmup(name, opts):
    def run_step(m, opt, i):
        x = rand(3, 5, D, seed=200 + i, scale=1.0 + i).float().requires_grad_()
        y = m(x)
        (y * rand(3, 5, D, seed=300 + i).float()).sum().backward()
        grads = [x.grad.clone()] + [p.grad.clone() for p in m.parameters()]
        opt.step()
        opt.zero_grad(set_to_none=True)
        return y.detach(), grads

    torch.manual_seed(0)
    a = build_norm(name, D, **opts)
    opt_a = torch.optim.SGD(a.parameters(), lr=0.05)
    for i in range(3):
        run_step(a, opt_a, i)
    blob = st_save(a.state_dict())  # through safetensors, as checkpoints are written
    b = build_norm(name, D, **opts)
    b.load_state_dict(st_load(blob))
    opt_b = torch.optim.SGD(b.parameters(), lr=0.05)
    assert a.step.item() == 3 and a.step.dtype == torch.long
    for i in range(3, 5):  # step 4 is the last warm-up step, step 5 the first after it
        ya, ga = run_step(a, opt_a, i)
        yb, gb = run_step(b, opt_b, i)
        assert torch.equal(ya, yb) and all(torch.equal(p, q) for p, q in zip(ga, gb))
    for k, v in a.state_dict().items():
        assert torch.equal(v, b.state_dict()[k]), k
    fresh = build_norm(name, D, **opts)  # and the state really matters: a fresh module differs
    opt_f = torch.optim.SGD(fresh.parameters(), lr=0.05)
    yf, _ = run_step(fresh, opt_f, 5)
    ya, _ = run_step(a, opt_a, 5)
    assert not torch.equal(ya, yf)


@pytest.mark.parametrize("name", BATCH_STAT)
def test_a_training_forward_reads_no_counter_from_the_device(name, monkeypatch):
    """The counters the warm-up / ring-buffer logic needs as ints come from host copies counted beside the buffers:
    after the first forward a training step reads nothing on the host (the CPU stand-in of a GPU sync), while the
    counts ``_advance`` hands out equal ``int(buffer)`` at every forward: micro-batches, optimizer steps with either
    ``zero_grad``, a ``load_state_dict`` of another module's counters and a ``fill_`` from outside re-read them."""
    from normlab.norms.batchstat import BatchStatNorm
    from tests.helpers import HostReads

    m = build_norm(name, D, warmup=3) if name != "batchnorm" else build_norm(name, D)
    other = build_norm(name, D, warmup=3) if name != "batchnorm" else build_norm(name, D)
    other.num_batches.fill_(40), other.step.fill_(17)
    handed = []
    real = BatchStatNorm._advance

    def checked(self):
        got = real(self)
        handed.append((got, (int(self.num_batches), int(self.step))))
        return got

    opt = torch.optim.SGD(m.parameters(), lr=0.01)

    def schedule(reads=None):  # 8 optimizer steps of 2 micro-batches; counters loaded at step 4, set at step 6
        for step in range(8):
            if reads is not None:
                reads.step = step
            if step == 4:
                m.load_state_dict(other.state_dict())
            if step == 6:
                m.num_batches.fill_(100)
            for micro in range(2):
                m(rand(2, 3, D, seed=micro).float()).pow(2).mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=step % 2 == 0)

    with HostReads() as r:
        schedule(r)
    assert [r.reads[s] for s in range(8)] == [["batchstat.py:_advance"] * 2, [], [], [],
                                              ["batchstat.py:_advance"] * 2, [], ["batchstat.py:_advance"] * 2, []]
    monkeypatch.setattr(BatchStatNorm, "_advance", checked)
    schedule()  # the same schedule again, each count checked against the buffers
    assert len(handed) == 16 and all(got == buf for got, buf in handed), handed
    assert handed[-1][1] == (104, 21)  # 100 + 2 steps x 2 micro-batches; 17 + 4 optimizer steps


@pytest.mark.parametrize("name", ("powernorm", "unified"))
def test_synchronised_statistics_read_nothing_on_the_host_and_equal_one_process(name, tmp_path):
    """With a sync group (data-parallel: normlab.train.distributed), the global token count of the backward's token
    means stays a device tensor: after the first forward a training step reads nothing on the host (before: one
    read of the all-reduced count per forward). Over a group of one (gloo, a file rendezvous: no network) outputs,
    input gradients and every buffer equal those without a group bit for bit."""
    import torch.distributed as dist

    from normlab.norms.batchstat import set_sync_group
    from tests.helpers import HostReads

    def train(sync: bool):
        torch.manual_seed(0)
        m = build_norm(name, D, warmup=2)
        randomize_affine(m)
        opt = torch.optim.SGD(m.parameters(), lr=0.01)
        set_sync_group(dist.group.WORLD if sync else None)
        grads, reads = [], HostReads()
        try:
            with reads:
                for step in range(5):
                    reads.step = step
                    x = rand(2, 3, D, seed=step, scale=2.0).float().requires_grad_()
                    (m(x) * rand(2, 3, D, seed=9).float()).sum().backward()
                    grads.append(x.grad.clone())
                    opt.step(), opt.zero_grad()
        finally:
            set_sync_group(None)
        return grads, m.state_dict(), reads.reads

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rdv'}", rank=0, world_size=1)
    try:
        g1, s1, r1 = train(sync=True)
    finally:
        dist.destroy_process_group()
    g0, s0, _ = train(sync=False)
    assert all(torch.equal(a, b) for a, b in zip(g0, g1))
    assert s0.keys() == s1.keys() and all(torch.equal(s0[k], s1[k]) for k in s0)
    assert [r1[s] for s in range(1, 5)] == [[]] * 4, dict(r1)


# ---------------------------------------------------------------- under torch.compile
NO_CXX = not (shutil.which("g++") or shutil.which("c++"))
HOST_CONVERSIONS = ("item", "tolist", "__int__", "__float__", "__bool__", "__index__")
# (norm, options, buffers preset before the first step): within COMPILED_STEPS optimizer steps of 2 micro-batches
# each run crosses its norm's counter-dependent boundaries
COMPILED_CASES = {
    "powernorm": ("powernorm", {"warmup": 3, "groups": 2}, {}),  # batch var + cumulative phi, running phi from step 4
    "unified-window": ("unified", {"warmup": 2, "window": 3, "outlier_filtration": True}, {}),  # the ring wraps every
    # 3 forwards, the geometric window from forward 4 (step 2), a spike at step 4 skipped by the filtration
    "unified-compensation": ("unified", {"warmup": 0, "window": 2},
                             {"step": 998, "num_batches": 1996, "running_var": 0.3}),  # ratio r != 1 from step 1001
    "batchnorm": ("batchnorm", {}, {}),
}
COMPILED_STEPS, EAGER_STEP, RESUME_AT = 6, 3, 2


def _build(name, opts, preset):
    torch.manual_seed(0)
    m = build_norm(name, D, **opts)
    randomize_affine(m)
    with torch.no_grad():
        for k, v in preset.items():
            getattr(m, k).fill_(v)
    return m


def _run_steps(m, fwd, steps, compiled_hook=None):
    """Optimizer steps of 2 micro-batches (SGD; ``zero_grad`` to None on even steps, to zeros on odd ones: both ways
    of starting a step), ``fwd`` (None: ``m`` eager) as the forward. Per step: outputs, input gradients, parameter
    gradients and the state after the update. ``compiled_hook``: context manager around each compiled
    forward-and-backward."""
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    out = {}
    for step in steps:
        f = fwd(step)
        f = m if f is None else f
        rec = []
        for micro in range(2):
            x = rand(3, 5, D, seed=10 * step + micro, scale=25.0 if step == 4 else 1.0, shift=0.3).float()
            x.requires_grad_()
            dy = rand(3, 5, D, seed=100 + 10 * step + micro).float()
            with compiled_hook() if (compiled_hook and f is not m) else contextlib.nullcontext():
                y = f(x)
                (y * dy).sum().backward()
            rec += [y.detach(), x.grad]
        rec += [p.grad.clone() for p in m.parameters()]
        opt.step()
        opt.zero_grad(set_to_none=step % 2 == 0)
        out[step] = (rec, {k: v.clone() for k, v in m.state_dict().items()})
    return out


@pytest.mark.skipif(NO_CXX, reason="inductor's CPU backend needs a C++ compiler")
@pytest.mark.parametrize("case", COMPILED_CASES)
def test_compiled_training_equals_eager_without_host_reads_or_recompiles(case, monkeypatch):
    """Under ``torch.compile`` (inductor, ``fullgraph=True``: a graph break raises) the counters stay on the device
    (``_advance_on_device``, ``pick``, ``put_row``): over optimizer steps that cross the norm's warm-up, ring-buffer
    and compensation boundaries, with a step run eager in between (a diagnostic step of the training loop) and a
    ``load_state_dict`` of an earlier checkpoint (a resume: the counters, ring buffers and running statistics go back),
    outputs, input and parameter gradients and every buffer equal the eager run's -- counters exactly, floats to the
    fp32 round-off of inductor's reordered arithmetic. After the first two steps (one compiled variant for a step's
    first forward, ``weight.grad is None``, one for the others) nothing is recompiled and a compiled
    forward-and-backward converts no tensor to a Python number (the CPU stand-in of a GPU sync; before: two ``int()``
    per forward, a graph break each, and a recompilation at every warm-up count)."""
    from torch._dynamo.testing import CompileCounterWithBackend

    name, opts, preset = COMPILED_CASES[case]
    steps = range(COMPILED_STEPS)
    eager = _run_steps(_build(name, opts, preset), lambda step: None, steps)

    m = _build(name, opts, preset)
    torch._dynamo.reset()  # earlier tests' compiled variants of this forward do not count against this one
    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(m, backend=counter, fullgraph=True)
    reads = []

    @contextlib.contextmanager
    def counted():  # after the first two steps: count every host conversion of a tensor
        with monkeypatch.context() as mp:
            for meth in HOST_CONVERSIONS:
                real = getattr(torch.Tensor, meth)
                mp.setattr(torch.Tensor, meth, lambda self, *a, _r=real, _m=meth: (reads.append(_m), _r(self, *a))[1])
            yield

    first = _run_steps(m, lambda step: None if step == EAGER_STEP else compiled, range(2))
    frames = counter.frame_count
    got = {**first, **_run_steps(m, lambda step: None if step == EAGER_STEP else compiled, range(2, COMPILED_STEPS),
                                 compiled_hook=counted)}
    m.load_state_dict(st_load(st_save(eager[RESUME_AT - 1][1])))  # resume from the eager run's checkpoint
    resumed = _run_steps(m, lambda step: compiled, range(RESUME_AT, COMPILED_STEPS), compiled_hook=counted)
    assert counter.frame_count == frames <= 2 and reads == []
    for run in (got, resumed):
        for step, (rec, state) in run.items():
            e_rec, e_state = eager[step]
            for a, b in zip(rec, e_rec, strict=True):
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=lambda s: f"step {step}: {s}")
            for k, v in state.items():
                if v.dtype == torch.long:
                    assert torch.equal(v, e_state[k]), (step, k, v, e_state[k])
                else:
                    torch.testing.assert_close(v, e_state[k], rtol=1e-4, atol=1e-5, msg=lambda s: f"{k}: {s}")
    last = eager[COMPILED_STEPS - 1][1]  # the run really crossed the boundaries named in COMPILED_CASES
    assert last["step"].item() == preset.get("step", 0) + COMPILED_STEPS
    if case == "unified-window":
        assert 0 < last["skip_counter"].item() < 2 * COMPILED_STEPS - 3


@pytest.mark.parametrize("name", BATCH_STAT)
def test_compiled_paths_weight_record_moves_with_the_module_and_is_not_state(name):
    """``_seen_weight`` (the weight at the last compiled forward) is a plain attribute: ``.to()`` / ``.double()`` move
    and cast it with the weight (``BatchStatNorm._apply``: no new compiled variant after a move), and it is neither
    state nor a buffer (checkpoints, fingerprints and the diagnostics' buffer summaries unchanged)."""
    m = build_norm(name, D)
    keys, buffers = set(m.state_dict()), dict(m.named_buffers())
    m.double()
    seen = m._seen_weight
    assert seen.dtype == m.weight.dtype == torch.float64 and seen.shape == m.weight.shape and seen.isnan().all()
    assert set(m.state_dict()) == keys and dict(m.named_buffers()).keys() == buffers.keys()
    assert build_norm(name, D, affine=False)._seen_weight is None
