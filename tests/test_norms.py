"""Registry-driven norm tests: every registered norm gets the shared tests; references are torch's own layers
and closed-form formulas."""

from __future__ import annotations

import inspect

import pytest
import torch

from normlab.errors import NormlabError
from normlab.norms import build_norm, get_norm_class, list_norms, norm_names

D = 16


@pytest.fixture(params=norm_names())
def norm_name(request):
    return request.param


def test_constructor_shape_and_param_names(norm_name):
    sig = inspect.signature(get_norm_class(norm_name).__init__)
    for kw in ("eps", "affine", "bias"):
        assert kw in sig.parameters and sig.parameters[kw].kind is inspect.Parameter.KEYWORD_ONLY
    m = build_norm(norm_name, D, eps=1e-5)
    assert {n for n, _ in m.named_parameters()} <= {"weight", "bias"} | set(get_norm_class(norm_name).extra_params)
    assert build_norm(norm_name, D, affine=False).weight is None


def test_shape_preserved_and_finite(norm_name):
    torch.manual_seed(0)
    m = build_norm(norm_name, D)
    x = torch.randn(3, 5, D, requires_grad=True)
    y = m(x)
    assert y.shape == x.shape and torch.isfinite(y).all()
    y.sum().backward()  # gradients flow to the input and to every parameter
    assert x.grad is not None and torch.isfinite(x.grad).all()
    assert all(p.grad is not None for p in m.parameters())


def test_listed_with_paper(norm_name):
    row = next(r for r in list_norms() if r["name"] == norm_name)
    assert row["paper"] and row["description"]


def test_layernorm_matches_torch():
    torch.manual_seed(0)
    m = build_norm("layernorm", D, eps=1e-5)
    ref = torch.nn.LayerNorm(D, eps=1e-5)
    with torch.no_grad():
        m.weight.normal_(), m.bias.normal_()
        ref.weight.copy_(m.weight), ref.bias.copy_(m.bias)
    x = torch.randn(4, 7, D) * 3 + 1
    torch.testing.assert_close(m(x), ref(x))


def test_rmsnorm_closed_form_and_unit_offset():
    torch.manual_seed(0)
    x = torch.randn(4, 7, D, dtype=torch.float64)
    m = build_norm("rmsnorm", D, eps=1e-6).double()
    with torch.no_grad():
        m.weight.normal_()
    expect = x / torch.sqrt((x**2).mean(-1, keepdim=True) + 1e-6) * m.weight
    torch.testing.assert_close(m(x), expect)
    ref = torch.nn.RMSNorm(D, eps=1e-6).double()
    with torch.no_grad():
        ref.weight.copy_(m.weight)
    torch.testing.assert_close(m(x), ref(x))
    u = build_norm("rmsnorm", D, eps=1e-6, unit_offset=True).double()
    assert torch.count_nonzero(u.weight) == 0  # stored as w = 0, applied as 1 + w
    with torch.no_grad():
        u.weight.copy_(m.weight - 1.0)
    torch.testing.assert_close(u(x), m(x))


@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_rmsnorm_fast_path_gradients_match_torch(affine, dtype):
    """The hand-written backward (LayerNorm's kernel with mean 0 plus rstd * (g @ w) / d) against autograd
    through torch's ``F.rms_norm``, and gradcheck in float64."""
    from normlab.norms.functional import _RMSNormFn, rms_norm

    torch.manual_seed(0)
    x = (torch.randn(3, 5, D, dtype=dtype) * 2 + 0.7).requires_grad_()
    w = torch.randn(D, dtype=dtype, requires_grad=True) if affine else None
    g = torch.randn(3, 5, D, dtype=dtype)
    y = rms_norm(x, w, 1e-5)
    grads = torch.autograd.grad(y, [x] + ([w] if affine else []), g)
    x2 = x.detach().clone().requires_grad_()
    w2 = w.detach().clone().requires_grad_() if affine else None
    y2 = torch.nn.functional.rms_norm(x2, (D,), w2, 1e-5)
    ref = torch.autograd.grad(y2, [x2] + ([w2] if affine else []), g)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else {}
    torch.testing.assert_close(y, y2, **tol)
    for a, b in zip(grads, ref):
        torch.testing.assert_close(a, b, **tol)
    if dtype == torch.float64:
        assert torch.autograd.gradcheck(lambda x, w: _RMSNormFn.apply(x, w, 1e-5), (x, w))


def test_unknown_norm_suggests_and_lists():
    with pytest.raises(NormlabError) as e:
        build_norm("lyernorm", D)
    msg = str(e.value)
    assert "layernorm" in msg and "did you mean" in msg and "\n" not in msg


def test_unknown_option_is_an_error():
    with pytest.raises(NormlabError, match="does not take option"):
        build_norm("layernorm", D, unit_offset=True)


# --- invariances (Hypothesis property tests) ---
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**16), shift=st.floats(-50, 50), scale=st.floats(0.05, 50))
def test_layernorm_shift_and_scale_invariant(seed, shift, scale):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(3, D, generator=g, dtype=torch.float64)
    m = build_norm("layernorm", D, eps=0.0).double()
    torch.testing.assert_close(m(x * scale + shift), m(x), atol=1e-9, rtol=1e-9)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**16), scale=st.floats(0.05, 50))
def test_rmsnorm_scale_invariant_not_shift_invariant(seed, scale):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(3, D, generator=g, dtype=torch.float64)
    m = build_norm("rmsnorm", D, eps=0.0).double()
    torch.testing.assert_close(m(x * scale), m(x), atol=1e-9, rtol=1e-9)
    assert not torch.allclose(m(x + 3.0), m(x))  # no centring: a shift changes the output


def test_every_norm_deterministic_and_state_dict_named(norm_name):
    torch.manual_seed(1)
    a = build_norm(norm_name, D)
    torch.manual_seed(1)
    b = build_norm(norm_name, D)
    x = torch.randn(4, 6, D)
    a.train(), b.train()
    torch.testing.assert_close(a(x), b(x), rtol=0, atol=0)
    for k in a.state_dict():
        assert k.split(".")[-1].isidentifier()


def test_auto_embed_scale_is_declared_by_the_norm_class(norm_name):
    """``model.embed_scale: auto`` resolves through the norm class (no per-norm special case in the model)."""
    from normlab.model import ModelConfig, build_model
    from normlab.model.config import EMBED_SCALES
    from normlab.norms.registry import auto_embed_scale

    kind = auto_embed_scale(norm_name)
    assert kind in EMBED_SCALES and kind != "auto"
    # the norms whose authors scale the embeddings: DyT (LLaMA recipe) and Derf (nanoGPT patch)
    assert kind == ("learnable" if norm_name in ("dyt", "derf") else "none")
    m = build_model(ModelConfig(vocab_size=20, context=8, width=16, depth=1, heads=2, norm=norm_name))
    assert ("embed_scale" in dict(m.named_parameters())) == (kind == "learnable")


@pytest.mark.parametrize("name", norm_names())
def test_declared_warmup_matches_constructor(name):
    """``needs_warmup`` is declared, not guessed: it must agree with whether the constructor takes ``warmup``."""
    cls = get_norm_class(name)
    assert cls.needs_warmup == ("warmup" in inspect.signature(cls.__init__).parameters)
