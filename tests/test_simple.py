"""normlab.norms.simple: ScaleNorm, DyT and none against closed forms written out here (fp64)."""

from __future__ import annotations

import math

import pytest
import torch

from normlab.errors import NormlabError
from normlab.model import ModelConfig, build_model
from normlab.norms import build_norm
from tests.helpers import rand, randomize_affine

D = 8
DT = torch.float64  # the references are computed in fp64 (helpers.rand)


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
