"""normlab.norms.simple: ScaleNorm, DyT and none against closed forms written out here (fp64); DyT also against
the authors' modules and LLaMA alpha0 (tests/fixtures/dyt_reference.json, written by
tests/fixtures/make_dyt_reference.py from github.com/jiachenzhu/DyT)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from normlab.errors import NormlabError
from normlab.model import ModelConfig, build_model
from normlab.norms import build_norm
from normlab.norms.simple import DYT_ALPHA0_BY_WIDTH, dyt_alpha0
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


DYT_REF = json.loads((Path(__file__).resolve().parents[1] / "fixtures" / "dyt_reference.json").read_text())


@pytest.mark.parametrize("case", DYT_REF["cases"], ids=lambda c: f"{c['module']}-{c['alpha_init_value']}")
def test_dyt_matches_the_authors_modules(case):
    # the authors' DynamicTanh (bias) and LLaMA DyT (no bias) on the same float32 inputs: forward and the gradients
    # of sum(y * upstream). The ops are the same float32 ops (tanh(alpha x), times weight, plus bias), so the outputs
    # agree to the bit; the gradients to a few ulps (rtol 1e-6), which the order of autograd's sums may change
    shape = DYT_REF["shape"]
    m = build_norm("dyt", shape[-1], alpha_init=case["alpha_init_value"], bias=case["bias"])
    with torch.no_grad():
        m.weight.copy_(torch.tensor(DYT_REF["weight"]))
        if case["bias"]:
            m.bias.copy_(torch.tensor(DYT_REF["bias"]))
    x = torch.tensor(DYT_REF["x"]).reshape(shape).requires_grad_()
    y = m(x)
    (y * torch.tensor(DYT_REF["upstream"]).reshape(shape)).sum().backward()
    torch.testing.assert_close(y.detach().flatten(), torch.tensor(case["y"]), rtol=0, atol=0)
    torch.testing.assert_close(m.alpha.grad, torch.tensor([case["grad_alpha"]]), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(x.grad.flatten(), torch.tensor(case["grad_x"]), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(m.weight.grad, torch.tensor(case["grad_weight"]), rtol=1e-6, atol=1e-6)


def test_dyt_alpha_auto_is_the_papers_width_table():
    # the authors' LLaMA commands (README) at their variants' widths: attention / FFN / final DyT
    for row in DYT_REF["llama_alpha0"]:
        got = tuple(dyt_alpha0(row["emb_dim"], g) for g in ("attn", "mlp", "final"))
        assert got == (row["attn"], row["ffn"], row["dec"]), row["model_variant"]
    # the paper's Table 11 (widths 1024 and 2048 have no command in the repo), written out from the paper
    assert [(dyt_alpha0(w, "attn"), dyt_alpha0(w, "mlp")) for w in (1024, 2048)] == [(1.0, 1.0), (1.0, 0.5)]
    assert {r[0] for r in DYT_ALPHA0_BY_WIDTH} == {1024, 2048, 4096, 5120, 8192}
    # outside the table: the nearest row (no extrapolation); between rows: nearest on a log scale
    assert dyt_alpha0(64, "attn") == dyt_alpha0(64, "embed") == 1.0 and dyt_alpha0(32768, "mlp") == 0.05
    assert dyt_alpha0(2896, "mlp") == 0.5 and dyt_alpha0(2897, "mlp") == 0.2  # sqrt(2048 * 4096) = 2896.3


def test_dyt_alpha_auto_per_site_in_a_model():
    opts = {"bias": False, "alpha_init": "auto", "alpha_init@final": 0.3}
    big = ModelConfig(vocab_size=32, context=8, width=4096, depth=1, heads=32, norm="dyt", norm_options=opts)
    assert [big.norm_kwargs(g)["alpha_init"] for g in ("attn", "mlp", "final")] == [0.8, 0.2, 0.3]
    m = build_model(ModelConfig(vocab_size=32, context=8, width=16, depth=1, heads=2, norm="dyt", norm_options=opts))
    assert (m.blocks[0].attn_in.alpha.item(), m.blocks[0].mlp_in.alpha.item()) == (1.0, 1.0)  # width 16: 1024 row
    assert m.final_norm.alpha.item() == pytest.approx(0.3)  # an explicit per-site value wins
    with pytest.raises(NormlabError, match="alpha_init 'auto' depends on the site"):
        build_norm("dyt", D, alpha_init="auto")  # no site to resolve it for
    with pytest.raises(NormlabError, match="alpha_init must be a number or 'auto', got 'big'"):
        build_norm("dyt", D, alpha_init="big")


def test_none_is_identity():
    m = build_norm("none", D, affine=True, bias=True)
    assert list(m.parameters()) == [] and m.weight is None and m.bias is None and list(m.buffers()) == []
    x = rand(2, 3, D)
    assert torch.equal(m(x), x)


# ---------------------------------------------------------------- Derf (Chen et al. 2025)
DERF_REF = json.loads((Path(__file__).resolve().parents[1] / "fixtures" / "derf_reference.json").read_text())


def test_derf_closed_form_and_options():
    m = build_norm("derf", D, alpha_init=0.7, shift_init=0.2).double()
    assert m.alpha.shape == m.shift.shape == (1,) and m.alpha.item() == pytest.approx(0.7)
    randomize_affine(m)
    x = rand(2, 4, D, scale=3.0)
    z = 0.7 * x + 0.2
    expect = m.weight * torch.special.erf(z) + m.bias
    torch.testing.assert_close(m(x), expect)
    m(x).sum().backward()
    # d erf(z) / dz = 2 / sqrt(pi) exp(-z^2): d/dalpha = sum(w x erf'(z)), d/dshift = sum(w erf'(z))
    derf = 2 / math.sqrt(math.pi) * torch.exp(-z * z)
    torch.testing.assert_close(m.alpha.grad, (m.weight * x * derf).sum().reshape(1))
    torch.testing.assert_close(m.shift.grad, (m.weight * derf).sum().reshape(1))
    plain = build_norm("derf", D, affine=False)
    assert plain.weight is None and plain.bias is None
    assert [n for n, _ in plain.named_parameters()] == ["alpha", "shift"]
    assert build_norm("derf", D).alpha.item() == 1.0 and build_norm("derf", D).shift.item() == 0.0
    for bad in ("auto", True, float("nan")):
        with pytest.raises(NormlabError, match="norm 'derf': alpha_init must be a finite number"):
            build_norm("derf", D, alpha_init=bad)


@pytest.mark.parametrize("case", DERF_REF["cases"], ids=lambda c: f"a{c['alpha_init_value']}-s{c['shift_init_value']}")
def test_derf_matches_the_authors_module(case):
    # the authors' Dynamic_erf on the same float32 inputs: forward and the gradients of sum(y * upstream). The same
    # float32 ops (alpha x + shift, erf, times weight, plus bias): the outputs agree to the bit; the gradients to a
    # few ulps (rtol 1e-6), which the order of autograd's sums may change
    shape = DERF_REF["shape"]
    m = build_norm("derf", shape[-1], alpha_init=case["alpha_init_value"], shift_init=case["shift_init_value"])
    with torch.no_grad():
        m.weight.copy_(torch.tensor(DERF_REF["weight"]))
        m.bias.copy_(torch.tensor(DERF_REF["bias"]))
    x = torch.tensor(DERF_REF["x"]).reshape(shape).requires_grad_()
    y = m(x)
    (y * torch.tensor(DERF_REF["upstream"]).reshape(shape)).sum().backward()
    torch.testing.assert_close(y.detach().flatten(), torch.tensor(case["y"]), rtol=0, atol=0)
    for name in ("alpha", "shift"):
        torch.testing.assert_close(getattr(m, name).grad, torch.tensor([case[f"grad_{name}"]]), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(x.grad.flatten(), torch.tensor(case["grad_x"]), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(m.weight.grad, torch.tensor(case["grad_weight"]), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(m.bias.grad, torch.tensor(case["grad_bias"]), rtol=1e-6, atol=1e-6)


def test_derf_shift_init_is_the_authors_default():
    # the authors' module defaults: shift 0 (ours too); alpha 0.5 in their vision/speech/DNA module, 1.0 in their
    # language-model patch (ours: the language-model value, docs/norms.md)
    assert DERF_REF["module_defaults"] == {"alpha_init_value": 0.5, "shift_init_value": 0.0}
    assert build_norm("derf", D).shift.item() == DERF_REF["module_defaults"]["shift_init_value"]
    cfg = ModelConfig(vocab_size=32, context=8, width=16, depth=1, heads=2, norm="derf")
    assert cfg.embed_scale_kind == "learnable"  # their patch multiplies the embeddings by a learnable scalar
