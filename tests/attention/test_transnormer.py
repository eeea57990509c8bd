"""TransNormer's NormAttention (normlab.attention.transnormer) against a direct O(T^2) computation of its
definition in float64: ``SRMSNorm(sum_{j<=i} (phi(q_i) . phi(k_j)) v_j)``, ``phi = 1 + elu``; chunked == direct for
every chunk size; the shared attention tests (tests/test_attention.py) pick the kind up from the registry."""

from __future__ import annotations

import pytest
import torch

from normlab.attention import attention_names, build_attention
from normlab.attention.positions import RotaryEmbedding
from normlab.attention.transnormer import norm_linear_chunked
from normlab.errors import NormlabError
from normlab.model import ModelConfig

W, H, CTX = 16, 2, 32
HD = W // H


def direct(m, x, rope: bool):
    """Per query a Python loop over the keys it sees (no prefix sums, no masks), float64."""
    B, T, _ = x.shape
    q, k, v = (t.view(B, T, H, HD).transpose(1, 2) for t in m.qkv(x).split(W, dim=-1))
    if rope:
        q, k = m.rope(q, k, 0)  # the rotation itself is tested against a naive RoPE in test_attention.py
    phi = lambda t: torch.where(t > 0, t + 1, torch.exp(t))
    fq, fk = phi(q), phi(k)
    out = torch.zeros(B, H, T, HD, dtype=x.dtype)
    for i in range(T):
        for j in range(i + 1):
            out[:, :, i] += (fq[:, :, i] * fk[:, :, j]).sum(-1, keepdim=True) * v[:, :, j]
    y = out.transpose(1, 2).reshape(B, T, W)
    y = y / torch.sqrt((y ** 2).mean(-1, keepdim=True) + m.norm_eps)  # SRMSNorm: no gain
    return m.proj(y)


@pytest.mark.parametrize("positions, chunk", [("none", 64), ("none", 3), ("rope", 5), ("rope", 1)])
def test_causal_output_matches_the_direct_quadratic_computation(positions, chunk):
    cfg = ModelConfig(vocab_size=10, context=CTX, width=W, heads=H, attention="transnormer", positions=positions,
                      linear_chunk=chunk).validate()
    torch.manual_seed(0)
    rope = RotaryEmbedding(HD, CTX) if positions == "rope" else None
    m = build_attention(cfg, rope).double().eval()
    with torch.no_grad():
        m.qkv.weight.mul_(10.0)  # features of order 1: elu's both branches matter
    x = torch.randn(2, 11, W, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(m(x), direct(m, x, positions == "rope"), rtol=1e-10, atol=1e-10)


def test_chunked_prefix_sums_continue_a_state():
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.rand(1, 2, 9, 4, dtype=torch.float64, generator=g) for _ in range(3))
    full, S = norm_linear_chunked(q, k, v, chunk=4)
    a, Sa = norm_linear_chunked(q[:, :, :5], k[:, :, :5], v[:, :, :5], chunk=2)
    b, Sb = norm_linear_chunked(q[:, :, 5:], k[:, :, 5:], v[:, :, 5:], chunk=3, state=Sa)
    torch.testing.assert_close(torch.cat([a, b], 2), full)
    torch.testing.assert_close(Sb, S)
    torch.testing.assert_close(S, torch.einsum("bhtk,bhtv->bhkv", k, v))


def test_no_denominator_the_output_norm_bounds_the_scale():
    """Without the denominator the raw output grows with the number of keys; after SRMSNorm every token's output
    has RMS 1 (up to eps) whatever the sequence length."""
    cfg = ModelConfig(vocab_size=10, context=CTX, width=W, heads=H, attention="transnormer", positions="none",
                      norm_eps=1e-12).validate()
    m = build_attention(cfg, None).double()
    seen = {}
    m.proj.register_forward_hook(lambda mod, inp, out: seen.__setitem__("y", inp[0]))
    m(torch.randn(1, 30, W, dtype=torch.float64))
    rms = seen["y"].pow(2).mean(-1).sqrt()
    torch.testing.assert_close(rms, torch.ones_like(rms))


def test_registered_and_refusals():
    assert "transnormer" in attention_names()
    with pytest.raises(NormlabError, match="qk_norm"):
        ModelConfig(attention="transnormer", qk_norm=True).validate()
    with pytest.raises(NormlabError, match="alibi"):
        ModelConfig(attention="transnormer", positions="alibi").validate()
