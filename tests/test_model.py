"""GPT model: structure per placement, causality, attention and RoPE against naive references."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from normlab.attention.positions import RotaryEmbedding
from normlab.model import PLACEMENTS, ModelConfig, build_model
from normlab.norms import norm_names


def cfg(**kw) -> ModelConfig:
    base = dict(vocab_size=50, context=16, width=32, depth=3, heads=4)
    base.update(kw)
    return ModelConfig(**base)


@pytest.mark.parametrize("placement", sorted(PLACEMENTS))
@pytest.mark.parametrize("norm", norm_names())
def test_every_norm_and_placement_is_causal(norm, placement):
    torch.manual_seed(0)
    m = build_model(cfg(norm=norm, placement=placement)).eval()
    x = torch.randint(0, 50, (2, 12))
    y = x.clone()
    y[:, 7] = (y[:, 7] + 1) % 50  # change token 7
    a, b = m(x), m(y)
    torch.testing.assert_close(a[:, :7], b[:, :7])  # earlier positions unaffected
    assert not torch.allclose(a[:, 7:], b[:, 7:])


def test_pre_and_post_structure():
    pre = build_model(cfg(placement="pre"))
    post = build_model(cfg(placement="post"))
    for blk in pre.blocks:
        assert not isinstance(blk.attn_in, nn.Identity) and isinstance(blk.attn_post, nn.Identity)
    for blk in post.blocks:
        assert isinstance(blk.attn_in, nn.Identity) and not isinstance(blk.mlp_post, nn.Identity)
    assert not isinstance(pre.final_norm, nn.Identity) and isinstance(post.final_norm, nn.Identity)
    assert isinstance(build_model(cfg(placement="pre", final_norm=False)).final_norm, nn.Identity)


def test_block_equations():
    """Pre-LN: x + F(N(x)); Post-LN: N(x + F(x)) -- checked against the sublayers called by hand."""
    torch.manual_seed(0)
    x = torch.randn(2, 5, 32)
    b = build_model(cfg(placement="pre")).blocks[0]
    h = x + b.attn(b.attn_in(x))
    torch.testing.assert_close(b(x), h + b.mlp(b.mlp_in(h)))
    b = build_model(cfg(placement="post")).blocks[0]
    h = b.attn_post(x + b.attn(x))
    torch.testing.assert_close(b(x), b.mlp_post(h + b.mlp(h)))


def test_attention_matches_naive_masked_softmax():
    torch.manual_seed(0)
    m = build_model(cfg(positions="learned"))
    attn = m.blocks[0].attn
    x = torch.randn(2, 9, 32)
    B, T, C = x.shape
    q, k, v = attn.qkv(x).split(C, dim=-1)
    q, k, v = (t.view(B, T, 4, 8).transpose(1, 2) for t in (q, k, v))
    s = q @ k.transpose(-1, -2) / math.sqrt(8)
    s = s.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
    y = (s.softmax(-1) @ v).transpose(1, 2).reshape(B, T, C)
    torch.testing.assert_close(attn(x), attn.proj(y), atol=1e-5, rtol=1e-5)


def test_rope_scores_depend_on_relative_offset_only():
    torch.manual_seed(0)
    rope = RotaryEmbedding(8, 64).double()
    q = torch.randn(1, 1, 1, 8, dtype=torch.float64).expand(1, 1, 40, 8).contiguous()
    k = torch.randn(1, 1, 1, 8, dtype=torch.float64).expand(1, 1, 40, 8).contiguous()
    rq, rk = rope(q, k)
    s = (rq[0, 0] @ rk[0, 0].T)
    torch.testing.assert_close(s[10, 3], s[30, 23])  # both offset 7
    torch.testing.assert_close(s[5, 5], (q[0, 0, 0] @ k[0, 0, 0]))  # offset 0 = unrotated dot product
    # closed form for one pair of dims: rotation by angle pos * base^0 = pos
    x = torch.tensor([[[[1.0, 0.0] + [0.0] * 6]]], dtype=torch.float64).expand(1, 1, 3, 8)
    rx, _ = rope(x, x)
    torch.testing.assert_close(rx[0, 0, 2, :2], torch.tensor([math.cos(2.0), math.sin(2.0)], dtype=torch.float64))


def test_tied_embeddings_and_param_count():
    m = build_model(cfg(tie_embeddings=True, bias=False, activation="gelu"))
    assert m.lm_head.weight is m.tok_emb.weight
    d, V, L, h = 32, 50, 3, 128
    per_block = 3 * d * d + d * d + d * h + h * d + 2 * (2 * d)  # qkv, proj, fc, proj, two LayerNorms
    assert m.num_params() == V * d + L * per_block + 2 * d
    untied = build_model(cfg(tie_embeddings=False))
    assert untied.num_params() == m.num_params() + V * d


def test_swiglu_matches_formula():
    torch.manual_seed(0)
    mlp = build_model(cfg(activation="swiglu")).blocks[0].mlp
    x = torch.randn(3, 32)
    torch.testing.assert_close(mlp(x), mlp.proj(F.silu(mlp.fc(x)) * mlp.gate(x)))
    assert mlp.fc.out_features == int(2 * 4.0 * 32 / 3)


def test_init_is_seeded_and_scaled():
    torch.manual_seed(3)
    a = build_model(cfg())
    torch.manual_seed(3)
    b = build_model(cfg())
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    big = build_model(cfg(depth=8, width=128, heads=4))
    std = big.blocks[0].attn.proj.weight.std().item()
    assert abs(std - 0.02 / math.sqrt(16)) < 0.1 * 0.02 / math.sqrt(16)


def test_learned_positions_refuse_long_input():
    m = build_model(cfg(positions="learned"))
    with pytest.raises(ValueError, match="learned position table"):
        m(torch.zeros(1, 17, dtype=torch.long))


@pytest.mark.parametrize("kind,norm,expect", [
    ("none", "dyt", None), ("fixed", "layernorm", math.sqrt(32)), ("learnable", "layernorm", math.sqrt(32)),
    ("auto", "layernorm", None), ("auto", "dyt", 1 / 0.02)])
def test_embed_scale_multiplies_token_embeddings(kind, norm, expect):
    """``model.embed_scale``: the block-0 input equals ``scale * tok_emb(idx)`` with the documented scale
    (``auto`` = DyT's learnable scalar from ``1/init_std``, nothing for other norms)."""
    torch.manual_seed(0)
    m = build_model(cfg(norm=norm, embed_scale=kind, init_std=0.02)).eval()
    x = torch.randint(0, 50, (2, 5))
    seen = {}
    m.blocks[0].register_forward_pre_hook(lambda mod, args: seen.setdefault("x", args[0]))
    m(x)
    emb = m.tok_emb(x)
    torch.testing.assert_close(seen["x"], emb * (1.0 if expect is None else expect))
    learnable = any(n == "embed_scale" for n, _ in m.named_parameters())
    assert learnable == (kind == "learnable" or (kind == "auto" and norm == "dyt"))
    custom = build_model(cfg(norm=norm, embed_scale=kind, embed_scale_init=3.0))
    assert (custom.embed_scale is None) == (expect is None)
    if expect is not None:
        assert float(torch.as_tensor(custom.embed_scale).detach()) == 3.0


def test_embed_scale_rejects_unknown_and_nonpositive():
    from normlab.errors import NormlabError

    with pytest.raises(NormlabError, match="embed_scale.*allowed|auto"):
        build_model(cfg(embed_scale="sqrt"))
    with pytest.raises(NormlabError, match="embed_scale_init must be > 0"):
        build_model(cfg(embed_scale="fixed", embed_scale_init=0.0))
