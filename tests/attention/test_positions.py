"""RoPE (normlab.attention.positions.RotaryEmbedding) against the RoFormer formula written out here (Su et al.
2021, arXiv:2104.09864, eq. 34: pairs ``(x[2i], x[2i+1])`` rotated by ``m * theta_i``, ``theta_i = base^(-2i/d)``),
its gradients (``gradcheck`` in float64), ``torch.func`` (vmap, grad), the constant tables, and the compiled pair
rotation the CUDA path runs (compiled here by inductor's C++ backend) with its selection and fallback."""

from __future__ import annotations

import logging
import math
import shutil

import pytest
import torch
from torch._dynamo.utils import counters

from normlab.attention import positions as P
from normlab.attention.positions import RotaryEmbedding, _PairRotation


def roformer(x: torch.Tensor, offset: int, base: float = 10000.0) -> torch.Tensor:
    """The rotation of RoFormer eq. 34 in float64 with Python's ``math.cos`` / ``math.sin``, one pair at a time.
    ``x [..., T, d]`` -> same shape, float64."""
    x = x.double()
    T, d = x.shape[-2], x.shape[-1]
    out = torch.empty_like(x)
    for m in range(T):
        for i in range(d // 2):
            a = (offset + m) * base ** (-2 * i / d)
            c, s = math.cos(a), math.sin(a)
            x0, x1 = x[..., m, 2 * i], x[..., m, 2 * i + 1]
            out[..., m, 2 * i] = x0 * c - x1 * s
            out[..., m, 2 * i + 1] = x0 * s + x1 * c
    return out


TOL = {torch.float32: {"atol": 2e-6, "rtol": 2e-6}, torch.float64: {"atol": 1e-12, "rtol": 1e-12},
       torch.bfloat16: {"atol": 3e-2, "rtol": 3e-2}}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_rotate_matches_roformer_formula(dtype):
    """At offset 0, inside the table, past the table (``context`` 8), and on a strided q view of a qkv tensor."""
    torch.manual_seed(0)
    rope = RotaryEmbedding(16, 8)
    for offset, T in ((0, 8), (3, 5), (6, 9)):
        x = torch.randn(2, 3, T, 16, dtype=dtype)
        y = rope.rotate(x, offset)
        assert y.dtype == dtype and y.shape == x.shape
        torch.testing.assert_close(y.double(), roformer(x, offset), **TOL[dtype])
    qkv = torch.randn(2, 8, 3, 3, 16, dtype=dtype)
    q = qkv.permute(2, 0, 3, 1, 4)[0]
    assert not q.is_contiguous()
    torch.testing.assert_close(rope.rotate(q).double(), roformer(q, 0), **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("offset, T", [(0, 8), (2, 5), (5, 7)])
def test_rotate_qkv_rotates_q_and_k_and_leaves_v(dtype, offset, T):
    torch.manual_seed(1)
    rope = RotaryEmbedding(8, 8, heads=3)
    qkv = torch.randn(2, T, 3, 3, 8, dtype=dtype)
    out = rope.rotate_qkv(qkv, offset)
    q, k, v = out.permute(2, 0, 3, 1, 4).unbind(0)
    q0, k0, v0 = qkv.permute(2, 0, 3, 1, 4).unbind(0)
    torch.testing.assert_close(q.double(), roformer(q0, offset), **TOL[dtype])
    torch.testing.assert_close(k.double(), roformer(k0, offset), **TOL[dtype])
    assert torch.equal(v, v0)


def test_gradcheck_float64():
    """Both autograd Functions: the complex multiply (float32 / float64) and the pair form (bf16 / fp16, checked
    here on float64 tables built from the formula)."""
    torch.manual_seed(2)
    rope = RotaryEmbedding(8, 6, heads=2)
    x = torch.randn(2, 2, 6, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: rope.rotate(t, 0), (x,))
    assert torch.autograd.gradcheck(lambda t: rope.rotate(t, 3), (x,))  # past the table: per-call table
    qkv = torch.randn(2, 6, 3, 2, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(rope.rotate_qkv, (qkv,))
    a = rope.angles(0, 6)
    cos2 = a.cos().repeat_interleave(2, -1)
    sin2 = torch.stack((-a.sin(), a.sin()), -1).flatten(-2)
    torch.testing.assert_close(_PairRotation.apply(x, cos2, sin2), roformer(x, 0), atol=1e-12, rtol=1e-12)
    assert torch.autograd.gradcheck(lambda t: _PairRotation.apply(t, cos2, sin2), (x,))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_backward_is_the_transposed_rotation(dtype):
    """d/dx <R x, g> = R^T g = the rotation by the opposite angles: with g = R x, the gradient is x itself."""
    torch.manual_seed(3)
    rope = RotaryEmbedding(8, 8)
    x = torch.randn(2, 2, 8, 8, dtype=dtype, requires_grad=True)
    y = rope.rotate(x)
    (y * y.detach()).sum().backward()
    torch.testing.assert_close(x.grad, x.detach(), **TOL[dtype])


def test_composes_with_torch_func():
    """vmap over a leading batch equals the loop; grad (and vmap of grad) of <rotate(x), w> is R^T w, the RoFormer
    rotation of w by the negated angles."""
    torch.manual_seed(4)
    rope = RotaryEmbedding(8, 8, heads=2)
    xs = torch.randn(5, 2, 8, 8)
    out = torch.func.vmap(lambda t: rope.rotate(t, 1))(xs)
    torch.testing.assert_close(out, torch.stack([rope.rotate(t, 1) for t in xs]))
    qkvs = torch.randn(4, 2, 8, 3, 2, 8)
    torch.testing.assert_close(torch.func.vmap(rope.rotate_qkv)(qkvs), torch.stack([rope.rotate_qkv(t) for t in qkvs]))
    w = torch.randn(2, 8, 8, dtype=torch.float64)
    def swap(t):  # (x0, x1) -> (x1, x0) in every pair: swap . R(a) . swap = R(-a) = R(a)^T
        return t.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)

    transposed = swap(roformer(swap(w), 0))
    g = torch.func.grad(lambda t: (rope.rotate(t) * w).sum())(torch.randn(2, 8, 8, dtype=torch.float64))
    torch.testing.assert_close(g, transposed, atol=1e-12, rtol=1e-12)
    gs = torch.func.vmap(torch.func.grad(lambda t: (rope.rotate(t) * w).sum()))(
        torch.randn(3, 2, 8, 8, dtype=torch.float64)
    )
    torch.testing.assert_close(gs, transposed.expand(3, -1, -1, -1), atol=1e-12, rtol=1e-12)


def test_tables_are_built_once_and_follow_the_device():
    """No float32 / bf16 forward adds to or replaces the tables (a compiled model sees constants); ``.to()`` keeps
    them, float casts of the module do not touch them."""
    rope = RotaryEmbedding(8, 8, heads=2)
    tables, qkv_tables = rope._tables, rope._qkv_tables
    ids = {k: id(v) for k, v in tables.items()}
    for x in (torch.randn(1, 2, 8, 8), torch.randn(1, 2, 20, 8), torch.randn(1, 2, 4, 8, dtype=torch.bfloat16)):
        rope.rotate(x, 2)
    rope.rotate_qkv(torch.randn(1, 12, 3, 2, 8))
    assert rope._tables is tables and rope._qkv_tables is qkv_tables and {k: id(v) for k, v in tables.items()} == ids
    rope.double().float().to("cpu")
    assert rope._tables is tables
    assert tables[torch.float32, "complex"].dtype == torch.complex64
    assert set(tables) == {(torch.float32, "complex"), (torch.float32, "pair"), (torch.bfloat16, "pair")}
    rope.rotate(torch.randn(1, 2, 8, 8, dtype=torch.float64))  # float64: built on first use, then kept
    assert tables[torch.float64, "complex"].dtype == torch.complex128
    assert not any(k.startswith("_") or "tab" in k for k in rope.state_dict())  # nothing of it in checkpoints


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("head_dim, offset, T", [(8, 0, 8), (8, 2, 5), (16, 5, 7), (32, 0, 12)])
def test_rotate_split_is_rotate_qkv_then_the_head_split_values_and_gradients(dtype, head_dim, offset, T):
    """``rotate_split`` (one autograd node: q, k rotated, v a view, d qkv written in the projection's layout) gives
    what ``rotate_qkv`` + permute/unbind give, forward and backward, and q, k match the RoFormer formula; the
    gradient comes back contiguous in ``[B, T, 3, H, hd]``. With head_dim >= 16 the complex multiplies run on whole
    SIMD vectors in both layouts and agree bit for bit (runs stored before this path reproduce exactly); at
    head_dim 8 the short rows can take the scalar path in one layout: equal to round-off."""
    torch.manual_seed(7)
    rope = RotaryEmbedding(head_dim, 12, heads=3)
    qkv = torch.randn(2, T, 3, 3, head_dim, dtype=dtype, requires_grad=True)
    ref = rope.rotate_qkv(qkv, offset).permute(2, 0, 3, 1, 4).unbind(0)
    got = rope.rotate_split(qkv, offset)
    q0, k0, v0 = qkv.detach().permute(2, 0, 3, 1, 4).unbind(0)
    torch.testing.assert_close(got[0].double(), roformer(q0, offset), **TOL[dtype])
    torch.testing.assert_close(got[1].double(), roformer(k0, offset), **TOL[dtype])
    assert torch.equal(got[2], v0)
    ws = [torch.randn(2, 3, T, head_dim, dtype=dtype) for _ in ref]  # the layout SDPA's backward returns
    (g_ref,) = torch.autograd.grad(ref, qkv, ws)
    (g_got,) = torch.autograd.grad(got, qkv, ws)
    exact = head_dim >= 16 or dtype == torch.bfloat16  # bf16 takes the pair form on both paths
    for a, b in zip(ref, got):
        assert torch.equal(a, b) if exact else torch.allclose(a, b, atol=0, rtol=2 ** -22)
    assert torch.equal(g_ref, g_got) if exact else torch.allclose(g_ref, g_got, atol=1e-6, rtol=1e-6)
    assert g_got.is_contiguous() or dtype == torch.bfloat16  # the pair form keeps the old path


def test_rotate_split_gradcheck_and_torch_func():
    torch.manual_seed(8)
    rope = RotaryEmbedding(8, 8, heads=2)
    x = torch.randn(2, 6, 3, 2, 8, dtype=torch.float64, requires_grad=True)
    # plain autograd runs the classic-form node (less per-call overhead), torch.func the setup_context form; both
    # are checked here: gradcheck / gradgradcheck the first, vmap and grad below the second
    assert type(rope.rotate_split(x, 1)[0].grad_fn).__name__ == "_ComplexRotateSplitEagerBackward"
    assert torch.autograd.gradcheck(lambda t: rope.rotate_split(t, 1), (x,))
    assert torch.autograd.gradgradcheck(lambda t: rope.rotate_split(t, 1), (x,))
    full = torch.randn(2, 8, 3, 2, 8, dtype=torch.float64, requires_grad=True)  # T = context: the unsliced tables
    assert torch.autograd.gradcheck(rope.rotate_split, (full,))
    xs = torch.randn(3, 2, 6, 3, 2, 8, dtype=torch.float64)
    for i, out in enumerate(torch.func.vmap(rope.rotate_split)(xs)):
        torch.testing.assert_close(out, torch.stack([rope.rotate_split(t)[i] for t in xs]))

    def f(t):
        return sum((o * (i + 1)).sum() for i, o in enumerate(rope.rotate_split(t)))

    leaves = [t.clone().requires_grad_() for t in xs]
    expected = torch.stack([torch.autograd.grad(f(t), t)[0] for t in leaves])
    torch.testing.assert_close(torch.func.vmap(torch.func.grad(f))(xs), expected)


def test_tables_above_the_size_cap_are_broadcast_views_with_the_same_rotation(monkeypatch):
    """Long contexts x many heads: a table above ``TABLE_CAP`` entries stays a broadcast view over the heads (no
    memory per head), and ``rotate_split`` through it gives ``rotate_qkv``'s values and gradients."""
    from normlab.attention import positions as P

    monkeypatch.setattr(P, "TABLE_CAP", 16)
    torch.manual_seed(3)
    rope = RotaryEmbedding(8, 8, heads=2)
    for t in (*rope._split[torch.float32], rope._qkv_conj[(torch.float32, "complex")]):
        assert 0 in t.stride()  # broadcast over the heads
    x = torch.randn(2, 8, 3, 2, 8, dtype=torch.float64, requires_grad=True)
    got = rope.rotate_split(x)
    want = rope.rotate_qkv(x).permute(2, 0, 3, 1, 4).unbind(0)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
    assert torch.autograd.gradcheck(rope.rotate_split, (x,))


CUDA = torch.device("cuda")  # only named: the selection is decided from the device, nothing runs on it here


def _round_off_bound(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Elementwise bound on |fused - eager| for ``a + b`` (two bf16 products): eager rounds the two products and
    their sum (<= 2u (|a| + |b|), u = 2^-9), the compiled kernel the sum once (<= u |a + b|); 4u leaves margin."""
    return 2.0**-7 * (a.double().abs() + b.double().abs())


NO_CXX = not (shutil.which("g++") or shutil.which("c++"))


@pytest.mark.skipif(NO_CXX, reason="inductor's CPU backend (the compiled kernel, forced on the CPU) needs g++")
def test_compiled_pair_rotation_matches_the_eager_form_and_the_fp64_rotation(monkeypatch):
    """The compiled kernels the CUDA path uses, run here on the CPU through ``rotate_qkv`` (bf16, the autocast
    training layout ``[B, T, 3, H, hd]``, table rows at an offset): forward and backward within bf16 round-off of the
    eager pair form and of the RoFormer rotation in float64 (backward: autograd of that reference, the rotation by
    the opposite angle); v passes bit for bit; moving the offset (generation, the table's rows) recompiles nothing."""
    monkeypatch.setattr(P, "_fused", {})
    monkeypatch.setattr(P, "FUSED_DEVICES", ("cuda", "cpu"))
    counters.clear()
    torch.manual_seed(11)
    rope = RotaryEmbedding(16, 12, heads=2)
    qkv = torch.randn(2, 8, 3, 2, 16, dtype=torch.bfloat16, requires_grad=True)
    out = rope.rotate_qkv(qkv, 3)
    w = torch.randn_like(out)
    (grad,) = torch.autograd.grad(out, qkv, w)
    assert "failed" not in P._fused and counters["stats"]["unique_graphs"] == 2  # forward and backward compiled

    cos2, sin2 = (t[3:11] for t in rope._qkv_tables[(torch.bfloat16, "pair")])
    x = qkv.detach()
    eager = x * cos2 + P._swap_pairs(x) * sin2
    assert ((out.double() - eager.double()).abs() <= _round_off_bound(x * cos2, P._swap_pairs(x) * sin2)).all()
    eager_g = w * cos2 + P._swap_pairs(w * sin2)
    assert ((grad.double() - eager_g.double()).abs() <= _round_off_bound(w * cos2, P._swap_pairs(w * sin2))).all()

    x64 = x.double().requires_grad_()
    q, k, v = x64.permute(2, 0, 3, 1, 4).unbind(0)
    ref = torch.stack((roformer(q, 3), roformer(k, 3), v)).permute(1, 3, 0, 2, 4)  # back to [B, T, 3, H, hd]
    (ref_g,) = torch.autograd.grad(ref, x64, w.double())
    torch.testing.assert_close(out.double(), ref.detach(), **TOL[torch.bfloat16])
    torch.testing.assert_close(grad.double(), ref_g, **TOL[torch.bfloat16])
    assert torch.equal(out[:, :, 2], x[:, :, 2]) and torch.equal(grad[:, :, 2], w[:, :, 2])

    with torch.no_grad():  # an eval call (x not requiring grad) at other offsets
        for offset in (0, 1, 4):
            moved = rope.rotate_qkv(x, offset)
    assert counters["stats"]["unique_graphs"] == 2
    c4, s4 = (t[4:12] for t in rope._qkv_tables[(torch.bfloat16, "pair")])
    assert ((moved.double() - (x * c4 + P._swap_pairs(x) * s4).double()).abs()
            <= _round_off_bound(x * c4, P._swap_pairs(x) * s4)).all()


def test_fused_kernel_selection(monkeypatch):
    """Compiled kernels for an eager CUDA call (forward and transposed, built once); the eager form on the CPU (the
    compiled kernels are never called: the output is the pair formula bit for bit), with grad mode on (double
    backward), under vmap and under ``torch.compile``."""
    monkeypatch.setattr(P, "_fused", {})
    with torch.no_grad():
        fwd, bwd = P._fused_pair_kernel(CUDA), P._fused_pair_kernel(CUDA, transposed=True)
        assert callable(fwd) and callable(bwd) and fwd is not bwd
        assert P._fused_pair_kernel(CUDA) is fwd
        assert P._fused_pair_kernel(torch.device("cpu")) is None
    assert P._fused_pair_kernel(CUDA) is None  # grad mode on: a double backward differentiates the eager ops

    def boom(*args):
        raise AssertionError("the compiled kernel ran on the CPU")

    monkeypatch.setitem(P._fused, "kernels", (boom, boom))
    rope = RotaryEmbedding(8, 8, heads=2)
    qkv = torch.randn(2, 8, 3, 2, 8, dtype=torch.bfloat16, requires_grad=True)
    out = rope.rotate_qkv(qkv)
    cos2, sin2 = rope._qkv_tables[(torch.bfloat16, "pair")]
    x = qkv.detach()
    assert torch.equal(out, x * cos2 + torch.stack((x[..., 1::2], x[..., 0::2]), -1).flatten(-2) * sin2)
    out.sum().backward()

    seen = []

    def probe(t):
        seen.append(P._fused_pair_kernel(CUDA))
        return t * 2

    with torch.no_grad():
        torch.func.vmap(probe)(torch.randn(3, 4))
        compiled = torch.compile(lambda t: t + (P._fused_pair_kernel(CUDA) is None), backend="eager", fullgraph=True)
        t = torch.randn(4)
        assert torch.equal(compiled(t), t + 1)
    assert seen == [None]


@pytest.mark.parametrize("where", ["call", "construction"])
def test_a_failed_compile_falls_back_to_the_eager_form_once_with_a_warning(monkeypatch, caplog, where):
    """No triton / an inductor failure (``torch.compile`` raising on the first call or when built): the rotation
    runs in the eager pair form (its values bit for bit, forward and backward), one warning through ``logging``, and
    the compiled kernels are not tried again."""

    def broken(fn, **kwargs):
        if where == "construction":
            raise RuntimeError("torch.compile is not supported here")

        def run(*args):
            raise RuntimeError("Cannot find a working triton installation")

        return run

    monkeypatch.setattr(P, "_fused", {})
    monkeypatch.setattr(P, "FUSED_DEVICES", ("cuda", "cpu"))
    monkeypatch.setattr(torch, "compile", broken)
    torch.manual_seed(12)
    rope = RotaryEmbedding(8, 8, heads=2)
    qkv = torch.randn(2, 8, 3, 2, 8, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn_like(qkv)
    with caplog.at_level(logging.WARNING, logger=P.__name__):
        out = rope.rotate_qkv(qkv)
        (grad,) = torch.autograd.grad(out, qkv, w)
        out2 = rope.rotate_qkv(qkv.detach())
    cos2, sin2 = rope._qkv_tables[(torch.bfloat16, "pair")]
    x = qkv.detach()
    assert torch.equal(out, x * cos2 + P._swap_pairs(x) * sin2) and torch.equal(out2, out)
    assert torch.equal(grad, w * cos2 + P._swap_pairs(w * sin2))
    warnings = [r for r in caplog.records if r.name == P.__name__]
    assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING and "eager pair form" in warnings[0].message
    assert isinstance(P._fused["failed"], RuntimeError)
    with torch.no_grad():
        assert P._fused_pair_kernel(CUDA) is None


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("offset, T", [(0, 12), (3, 6), (10, 6)])  # (10, 6): past the table (a table for the call)
def test_pair_form_rotates_q_and_k_only_with_rotate_qkvs_values(dtype, offset, T, monkeypatch):
    """The pair form (bf16 / fp16, and every dtype under ``torch.compile``: the CUDA path) rotates the ``[:, :, :2]``
    view of the fused projection only -- v is never multiplied by its identity factor -- and gives ``rotate_qkv``'s
    q, k and v (then the head split) bit for bit, forward and backward."""
    from normlab.attention import positions as P

    seen = []
    real = P._pair_rotate
    monkeypatch.setattr(P, "_pair_rotate", lambda x, c, s: seen.append(tuple(x.shape)) or real(x, c, s))
    if dtype == torch.float32:  # the pair form as a compiled model traces it
        monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    torch.manual_seed(9)
    rope = RotaryEmbedding(16, 12, heads=3)
    qkv = torch.randn(2, T, 3, 3, 16, dtype=dtype, requires_grad=True)
    ref = rope.rotate_qkv(qkv, offset).permute(2, 0, 3, 1, 4).unbind(0)
    seen.clear()
    got = rope.rotate_split(qkv, offset)
    assert seen == [(2, T, 2, 3, 16)]  # q and k of the fused layout, not v
    for a, b in zip(ref, got):
        assert torch.equal(a, b)
    ws = [torch.randn(2, 3, T, 16, dtype=dtype) for _ in ref]
    (g_ref,) = torch.autograd.grad(ref, qkv, ws)
    (g_got,) = torch.autograd.grad(got, qkv, ws)
    assert torch.equal(g_ref, g_got)
