"""normlab.norms.unified: Unified Normalization (geometric window, warm-up, gradient compensation,
outlier filtration) against the authors' update rules replayed by hand."""

from __future__ import annotations

import math

import pytest
import torch

from normlab.norms import build_norm
from tests.helpers import rand, randomize_affine

D = 8
DT = torch.float64  # the references are computed in fp64 (helpers.rand)


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
    reads = []
    with pytest.MonkeyPatch.context() as mp:  # the skip decision stays on the device: no host read (a GPU sync)
        for meth in ("item", "tolist", "__int__", "__float__", "__bool__", "__index__"):
            real = getattr(torch.Tensor, meth)
            mp.setattr(torch.Tensor, meth, lambda self, *a, _r=real, _m=meth: (reads.append(_m), _r(self, *a))[1])
        y = m(spike)
        (y * rand(4, 4, D, seed=10)).sum().backward()
    assert reads == []
    assert m.skip_counter.item() == 1
    torch.testing.assert_close(m.buffer_x2[6 % 3], rv)  # slot refilled with running_var
    torch.testing.assert_close(y, spike / torch.sqrt((spike ** 2).reshape(-1, D).mean(0) + 1e-5))
