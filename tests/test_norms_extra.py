"""ScaleNorm, DyT, none, BatchNorm, PowerNorm and Unified Normalization against independent references: closed
forms written out here (fp64), torch.nn.BatchNorm1d, and the authors' update rules replayed by hand."""

from __future__ import annotations

import math

import pytest
import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from normlab.errors import NormlabError
from normlab.model import ModelConfig, build_model
from normlab.norms import build_norm, norm_names

D = 8
DT = torch.float64
BATCH_STAT = ("batchnorm", "powernorm", "unified")


def rand(*shape, seed=0, scale=1.0, shift=0.0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=DT) * scale + shift


def randomize_affine(m, seed=1):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in (m.weight, m.bias):
            if p is not None:
                p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.5 + (1.0 if p is m.weight else 0.0))


# ---------------------------------------------------------------- per-token norms
def test_scalenorm_closed_form():
    m = build_norm("scalenorm", D, eps=1e-5).double()
    assert m.weight.shape == (1,) and m.weight.item() == pytest.approx(math.sqrt(D)) and m.bias is None
    with torch.no_grad():
        m.weight.fill_(1.7)
    x = rand(3, 5, D)
    expect = 1.7 * x / torch.sqrt((x * x).sum(-1, keepdim=True))
    torch.testing.assert_close(m(x), expect)
    zero = torch.zeros(2, D, dtype=DT)  # the norm is clamped at eps: 0 / eps = 0, finite
    assert torch.equal(m(zero), zero)
    tiny = torch.full((1, D), 1e-9, dtype=DT)  # ||x|| < eps -> divide by eps
    torch.testing.assert_close(m(tiny), 1.7 * tiny / 1e-5)
    fixed = build_norm("scalenorm", D, affine=False).double()  # gain fixed at sqrt(D): RMS 1
    torch.testing.assert_close(fixed(x).pow(2).mean(-1), torch.ones(3, 5, dtype=DT))
    with pytest.raises(NormlabError, match="no bias"):
        build_norm("scalenorm", D, bias=True)


def test_dyt_closed_form_and_options():
    m = build_norm("dyt", D, alpha_init=0.7).double()
    assert m.alpha.shape == (1,) and m.alpha.item() == pytest.approx(0.7)
    randomize_affine(m)
    x = rand(2, 4, D, scale=3.0)
    expect = m.weight * ((torch.exp(1.4 * x) - 1) / (torch.exp(1.4 * x) + 1)) + m.bias  # tanh(0.7 x), by hand
    torch.testing.assert_close(m(x), expect)
    m(x).sum().backward()
    # d/dalpha sum(w * tanh(alpha x)) = sum(w * x * (1 - tanh^2))
    torch.testing.assert_close(m.alpha.grad, (m.weight * x * (1 - torch.tanh(0.7 * x) ** 2)).sum().reshape(1))
    nb = build_norm("dyt", D, bias=False)
    assert nb.bias is None and {n for n, _ in nb.named_parameters()} == {"alpha", "weight"}
    plain = build_norm("dyt", D, affine=False).double()
    assert plain.weight is None and [n for n, _ in plain.named_parameters()] == ["alpha"]
    torch.testing.assert_close(plain(x), torch.tanh(0.5 * x))


def test_dyt_per_site_alpha_inits_from_config():
    cfg = ModelConfig(vocab_size=32, context=8, width=16, depth=2, heads=2, norm="dyt", placement="pre",
                      norm_options={"bias": False, "alpha_init@attn": 0.8, "alpha_init@mlp": 0.2,
                                    "alpha_init@final": 0.2})
    m = build_model(cfg)
    for blk in m.blocks:
        assert blk.attn_in.alpha.item() == pytest.approx(0.8) and blk.mlp_in.alpha.item() == pytest.approx(0.2)
        assert blk.attn_in.bias is None
    assert m.final_norm.alpha.item() == pytest.approx(0.2)


def test_none_is_identity():
    m = build_norm("none", D, affine=True, bias=True)
    assert list(m.parameters()) == [] and m.weight is None and m.bias is None and list(m.buffers()) == []
    x = rand(2, 3, D)
    assert torch.equal(m(x), x)


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


# ---------------------------------------------------------------- PowerNorm
def gs_ref(x, groups):
    """Group scaling written out: x / sqrt(mean over the group of x^2 + 1e-5)."""
    out = torch.empty_like(x)
    c = x.shape[-1] // groups
    for k in range(groups):
        xs = x[..., k * c:(k + 1) * c]
        out[..., k * c:(k + 1) * c] = xs / torch.sqrt((xs * xs).mean(-1, keepdim=True) + 1e-5)
    return out


def test_powernorm_forward_warmup_then_running_and_eval():
    eps, warmup = 1e-5, 3
    m = build_norm("powernorm", D, eps=eps, groups=2, warmup=warmup).double()
    randomize_affine(m)
    w, b = m.weight.detach(), m.bias.detach()
    phi = torch.ones(D, dtype=DT)
    for t in range(1, 7):  # forwards without backward: every one is a new optimizer step
        x = rand(3, 4, D, seed=t, scale=1.0 + t)
        gs = gs_ref(x, 2)
        var = (gs * gs).reshape(-1, D).mean(0)
        s = var if t <= warmup else phi
        expect = w * gs / torch.sqrt(s + eps) + b
        if t < warmup:
            phi = phi * (t - 1) / t + var / t
        phi = 0.9 * phi + 0.1 * var
        torch.testing.assert_close(m(x), expect)
        torch.testing.assert_close(m.phi, phi)
        assert m.step.item() == t
    m.eval()
    x = rand(2, 5, D, seed=99)
    torch.testing.assert_close(m(x), w * gs_ref(x, 2) / torch.sqrt(phi + eps) + b)


def test_powernorm_approximate_backward_by_hand():
    eps = 1e-5
    m = build_norm("powernorm", D, eps=eps, groups=2, warmup=1).double()
    randomize_affine(m)
    w = m.weight.detach()
    ema = torch.zeros(D, dtype=DT)
    phi = torch.ones(D, dtype=DT)
    for t in range(1, 4):  # step 1: warm-up (batch var), steps 2-3: running phi; ema_gz != 0 from step 2
        x = rand(2, 3, D, seed=t, scale=2.0).requires_grad_()
        dy = rand(2, 3, D, seed=20 + t)
        m.weight.grad = m.bias.grad = None
        (m(x) * dy).sum().backward()
        # by hand, on the group-scaled input u = GS(x)
        u = gs_ref(x.detach(), 2).reshape(-1, D)
        var = (u * u).mean(0)
        z = u / torch.sqrt((var if t <= 1 else phi) + eps)
        phi = 0.9 * phi + 0.1 * var
        g = dy.reshape(-1, D) * w
        approx = g - 0.1 * ema * z
        ema = ema + (approx * z).mean(0)
        du = approx / torch.sqrt(var + eps)
        xr = x.detach().clone().requires_grad_()  # chain through group scaling (exact, ordinary autograd)
        (expect_dx,) = torch.autograd.grad(gs_ref(xr, 2), xr, du.reshape(x.shape))
        torch.testing.assert_close(x.grad, expect_dx)
        torch.testing.assert_close(m.ema_gz, ema)
        torch.testing.assert_close(m.weight.grad, (dy.reshape(-1, D) * z).sum(0))
        torch.testing.assert_close(m.bias.grad, dy.reshape(-1, D).sum(0))
    # the approximation is not the exact gradient of the forward (which ignores ema_gz and uses phi)
    xe = x.detach().clone().requires_grad_()
    (exact,) = torch.autograd.grad((w * gs_ref(xe, 2) / torch.sqrt(phi + eps) * dy).sum(), xe)
    assert not torch.allclose(exact, x.grad, atol=1e-3)


def test_powernorm_rejects_bad_groups():
    with pytest.raises(NormlabError, match="groups"):
        build_norm("powernorm", 10, groups=4)


# ---------------------------------------------------------------- Unified Normalization
def test_unified_geometric_window_and_running_var():
    eps, window = 1e-5, 3
    m = build_norm("unified", D, eps=eps, window=window, warmup=0).double()
    rv = torch.ones(D, dtype=DT)
    hist = []
    for n in range(1, 7):
        x = rand(4, 5, D, seed=n, scale=0.5 + n)
        x2 = (x * x).reshape(-1, D).mean(0)
        hist.append(x2)
        if n <= window:
            v = x2
        else:  # geometric mean of the last `window` batches, as a product and a root
            v = torch.stack(hist[-window:]).prod(0) ** (1.0 / window)
        torch.testing.assert_close(m(x), x / torch.sqrt(v + eps))
        rv = 0.9 * rv + 0.1 * v
        torch.testing.assert_close(m.running_var, rv)
    m.eval()
    randomize_affine(m)
    x = rand(2, 3, D, seed=50)
    torch.testing.assert_close(m(x), m.weight * x / torch.sqrt(rv + eps) + m.bias)


def test_unified_warmup_uses_batch_statistics():
    m = build_norm("unified", D, window=2, warmup=10).double()
    for n in range(1, 5):
        x = rand(3, 4, D, seed=n, scale=n)
        v = (x * x).reshape(-1, D).mean(0)
        torch.testing.assert_close(m(x), x / torch.sqrt(v + 1e-5))


@pytest.mark.parametrize("rv_value, expect_r", [(1e-4, 5.0), (1e4, 0.2), (0.81, None)])
def test_unified_gradient_compensation_ratio_and_backward(rv_value, expect_r):
    eps = 1e-5
    m = build_norm("unified", D, eps=eps, window=2, warmup=0).double()
    randomize_affine(m)
    w = m.weight.detach()
    with torch.no_grad():
        m.step.fill_(2000)  # past max(1000, warmup): compensation active
        m.num_batches.fill_(2000)
        m.running_var.fill_(rv_value)
        m.ema_gz.copy_(rand(D, seed=5))
    ema0 = m.ema_gz.clone()
    x = rand(3, 4, D, seed=3).requires_grad_()
    dy = rand(3, 4, D, seed=4)
    slot = 2001 % 2
    with torch.no_grad():
        m.buffer_x2[1 - slot].copy_((x * x).reshape(-1, D).mean(0) * 1.5)
        m.buffer_gz[1 - slot].copy_(rand(D, seed=6))
    other_x2, other_gz = m.buffer_x2[1 - slot].clone(), m.buffer_gz[1 - slot].clone()
    (m(x) * dy).sum().backward()
    x2 = (x.detach() ** 2).reshape(-1, D).mean(0)
    v = torch.sqrt(x2 * other_x2)
    raw = torch.sqrt(v + eps) / math.sqrt(rv_value + eps)
    r = torch.full((D,), expect_r, dtype=DT) if expect_r is not None else raw
    if expect_r is None:
        assert ((raw > 0.2) & (raw < 5)).all()  # unclamped case really is inside the bounds
    torch.testing.assert_close(r, raw.clamp(0.2, 5.0))
    z = x.detach().reshape(-1, D) / torch.sqrt(v + eps)
    g = dy.reshape(-1, D) * w * r
    gz = (g * z).mean(0)
    ema = 0.9 * ema0 + 0.1 * (gz + other_gz) / 2
    torch.testing.assert_close(m.ema_gz, ema)
    torch.testing.assert_close(x.grad.reshape(-1, D), (g - ema * z) / torch.sqrt(v + eps))
    torch.testing.assert_close(m.weight.grad, (dy.reshape(-1, D) * r * z).sum(0))


def test_unified_no_compensation_during_first_1000_steps():
    m = build_norm("unified", D, window=2, warmup=0).double()
    with torch.no_grad():
        m.running_var.fill_(1e-4)  # would give r = 5 if compensation were on
    x = rand(3, 4, D, seed=1).requires_grad_()
    dy = rand(3, 4, D, seed=2)
    (m(x) * dy).sum().backward()
    z = x.detach().reshape(-1, D) / torch.sqrt((x.detach() ** 2).reshape(-1, D).mean(0) + 1e-5)
    torch.testing.assert_close(m.weight.grad, (dy.reshape(-1, D) * z).sum(0))  # r == 1


def test_unified_outlier_filtration_skips_a_spike():
    m = build_norm("unified", D, window=3, warmup=0, outlier_filtration=True).double()
    for n in range(1, 6):
        m(rand(4, 4, D, seed=n))
    assert m.skip_counter.item() == 0
    rv = m.running_var.clone()
    spike = rand(4, 4, D, seed=9, scale=100.0)
    y = m(spike)
    assert m.skip_counter.item() == 1
    torch.testing.assert_close(m.buffer_x2[6 % 3], rv)  # slot refilled with running_var
    torch.testing.assert_close(y, spike / torch.sqrt((spike ** 2).reshape(-1, D).mean(0) + 1e-5))


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
