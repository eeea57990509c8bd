"""normlab.norms.powernorm: PowerNorm's forward (warm-up, then running statistics) and its approximate
backward against the authors' update rules replayed by hand."""

from __future__ import annotations


import pytest
import torch

from normlab.errors import NormlabError
from normlab.norms import build_norm
from tests.helpers import rand, randomize_affine

D = 8
DT = torch.float64  # the references are computed in fp64 (helpers.rand)


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
