"""normlab.attention.dropout against torch's own dropout and SDPA: unchanged outside a stacked step; recorded and
supplied noise reproduces torch's CPU draws bit for bit (F.dropout) or to round-off (SDPA's math kernel), also per
member under torch.func.vmap."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from normlab.attention.dropout import Dropout, draw_noise, dropout, recorded, sdpa, supplied

P = 0.3


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_outside_a_stacked_step_it_is_torchs_dropout(dtype):
    x = torch.randn(3, 5, 8).to(dtype)
    torch.manual_seed(4)
    ref = torch.nn.Dropout(P)(x)
    torch.manual_seed(4)
    assert torch.equal(Dropout(P)(x), ref)
    torch.manual_seed(4)
    assert torch.equal(dropout(x, P, True), ref)
    assert torch.equal(Dropout(P).eval()(x), x)
    assert Dropout(P).state_dict() == {}


def test_outside_a_stacked_step_sdpa_is_torchs():
    q, k, v = (torch.randn(2, 3, 6, 4) for _ in range(3))
    torch.manual_seed(5)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=P)
    torch.manual_seed(5)
    assert torch.equal(sdpa(q, k, v, is_causal=True, dropout_p=P), ref)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_drawn_noise_is_the_mask_f_dropout_draws(dtype):
    """Record two calls, draw their noise from a seed: the outputs equal F.dropout's from that seed, bit for bit,
    and the generator ends where F.dropout leaves it."""
    x1, x2 = torch.randn(4, 7).to(dtype), torch.randn(2, 3, 5).to(dtype)
    with recorded() as sites:
        assert torch.equal(dropout(x1, P, True), x1) and torch.equal(Dropout(0.5)(x2), x2)
        dropout(x1, 0.0, True), dropout(x1, P, False)  # nothing to drop: not a call
    assert sites == [((4, 7), dtype, P), ((2, 3, 5), dtype, 0.5)]
    torch.manual_seed(11)
    ref = (F.dropout(x1, P, True), F.dropout(x2, 0.5, True))
    after = torch.rand(3)
    torch.manual_seed(11)
    noise = draw_noise(sites, "cpu")
    assert torch.equal(torch.rand(3), after)
    with supplied(noise):
        out = (dropout(x1, P, True), Dropout(0.5)(x2))
    assert torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1])


@pytest.mark.parametrize("mask", ["causal", "bool", "additive"])
def test_supplied_sdpa_is_the_math_kernel_with_its_mask(mask):
    """SDPA with ``dropout_p`` on a CPU draws one Bernoulli mask over ``[B, H, Tq, Tk]``; the supplied noise drawn
    from the same seed gives its output to fp32 round-off (under bf16 autocast too, where SDPA computes in fp32 on
    autocast's bf16 inputs)."""
    B, H, T, D = 2, 3, 6, 4
    q, k, v = (torch.randn(B, H, T, D) for _ in range(3))
    allowed = torch.rand(T, T) > 0.3
    allowed.fill_diagonal_(True)
    kw = {"causal": {"is_causal": True}, "bool": {"attn_mask": allowed},
          "additive": {"attn_mask": torch.randn(T, T).masked_fill(~allowed, float("-inf"))}}[mask]
    torch.manual_seed(3)
    ref = F.scaled_dot_product_attention(q, k, v, dropout_p=P, **kw)
    with recorded() as sites:
        sdpa(q, k, v, dropout_p=P, **kw)
    assert sites == [((B, H, T, T), torch.float32, P)]
    torch.manual_seed(3)
    with supplied(draw_noise(sites, "cpu")):
        out = sdpa(q, k, v, dropout_p=P, **kw)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    torch.manual_seed(3)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = F.scaled_dot_product_attention(q, k, v, dropout_p=P, **kw)
        torch.manual_seed(3)
        with supplied(draw_noise(sites, "cpu")):
            out = sdpa(q, k, v, dropout_p=P, **kw)
    assert out.dtype == ref.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), ref.float(), rtol=0, atol=1e-6)  # a bf16 step is 4e-3 here


def test_a_non_contiguous_input_is_refused_when_recorded():
    """torch's CPU Bernoulli kernel fills ``empty_like(x)`` in memory order: a transposed input's mask is not the
    contiguous draw, so recording such a call raises (a stacked trial then trains the runs alone)."""
    x = torch.randn(6, 4).t()
    with pytest.raises(RuntimeError, match="non-contiguous"), recorded():
        dropout(x, P, True)


def test_under_vmap_each_member_gets_its_own_seeds_masks():
    """Three members' noise, each drawn from its own seed, stacked and handed to one vmapped forward: member ``k``'s
    output equals the forward alone after ``manual_seed(seed_k)``."""
    lin = torch.nn.Linear(8, 8)

    def forward(x):
        h = Dropout(P)(lin(x))
        q = h.view(2, 5, 2, 4).transpose(1, 2)
        return sdpa(q, q, q, is_causal=True, dropout_p=P)

    xs = torch.randn(3, 2, 5, 8)
    seeds = [7, 8, 9]
    alone = []
    for s, x in zip(seeds, xs):
        torch.manual_seed(s)
        alone.append(forward(x))
    with recorded() as sites:
        forward(xs[0])
    noise = []
    for s in seeds:
        torch.manual_seed(s)
        noise.append(draw_noise(sites, "cpu"))
    stacked_noise = [torch.stack(n) for n in zip(*noise)]

    def one(x, ns):
        with supplied(ns):
            return forward(x)

    out = torch.func.vmap(one, randomness="error")(xs, stacked_noise)
    torch.testing.assert_close(out, torch.stack(alone), rtol=1e-5, atol=1e-6)


def test_a_forward_whose_calls_differ_from_the_recorded_ones_raises():
    x = torch.randn(4, 4)
    with pytest.raises(RuntimeError, match="does not match"), supplied([torch.ones(3, 3)]):
        dropout(x, P, True)
    with pytest.raises(RuntimeError, match="1 were recorded"), supplied([torch.ones(4, 4)]):
        pass
