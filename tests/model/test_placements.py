"""Placements (peri, output, mix) and modifiers (LayerNorm Scaling, residual scaling) against hand-written equations."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from normlab.config import config_from_dict, load_config
from normlab.errors import NormlabError
from normlab.model import PLACEMENTS, ModelConfig, build_model
from normlab.model.placements import SITES, mix_post_blocks
from normlab.norms import norm_names


def cfg(**kw) -> ModelConfig:
    base = dict(vocab_size=50, context=16, width=32, depth=3, heads=4)
    base.update(kw)
    return ModelConfig(**base)


def is_norm(m: nn.Module) -> bool:
    return not isinstance(m, nn.Identity)


def sites(block) -> set[str]:
    return {s for s in SITES if is_norm(getattr(block, s))}


def perturb_norms(model: nn.Module) -> None:
    """Give every norm gain/bias a random value so a missing or swapped norm cannot pass by accident."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "_in." in name or "_out." in name or "_post." in name or "_norm." in name:
                p.add_(0.3 * torch.randn_like(p))


# ---------------------------------------------------------------- structure and equations


@pytest.mark.parametrize("placement, expected, final, embed", [
    ("pre", {"attn_in", "mlp_in"}, True, False),
    ("post", {"attn_post", "mlp_post"}, False, False),
    ("peri", {"attn_in", "attn_out", "mlp_in", "mlp_out"}, True, True),
    ("output", {"attn_out", "mlp_out"}, True, False),
])
def test_uniform_placement_structure(placement, expected, final, embed):
    m = build_model(cfg(placement=placement))
    assert all(sites(b) == expected for b in m.blocks)
    assert is_norm(m.final_norm) == final and is_norm(m.embed_norm) == embed


def test_final_and_embed_norm_switches_override_defaults():
    assert not is_norm(build_model(cfg(placement="peri", embed_norm=False)).embed_norm)
    assert is_norm(build_model(cfg(placement="pre", embed_norm=True)).embed_norm)
    assert is_norm(build_model(cfg(placement="post", final_norm=True)).final_norm)
    assert not is_norm(build_model(cfg(placement="mix", final_norm=False)).final_norm)


@pytest.mark.parametrize("depth, alpha, n_post", [(8, 0.25, 2), (12, 0.25, 3), (24, 0.25, 6), (8, 0.0, 0),
                                                  (8, 1.0, 8), (10, 0.29, 2), (100, 0.29, 29), (5, 0.5, 2)])
def test_mix_block_split(depth, alpha, n_post):
    assert mix_post_blocks(depth, alpha) == n_post
    m = build_model(cfg(placement="mix", depth=depth, mix_alpha=alpha, width=16, heads=2))
    kinds = ["post" if sites(b) == {"attn_post", "mlp_post"} else "pre" if sites(b) == {"attn_in", "mlp_in"} else "?"
             for b in m.blocks]
    assert kinds == ["post"] * n_post + ["pre"] * (depth - n_post)
    assert is_norm(m.final_norm)  # Mix-LN: final norm always applied (default)


def test_block_equations_peri_output_mix():
    """Each placement's block against its sublayers and norms called by hand."""
    torch.manual_seed(0)
    x = torch.randn(2, 5, 32)
    b = build_model(cfg(placement="peri")).blocks[1]
    perturb_norms(b)
    h = x + b.attn_out(b.attn(b.attn_in(x)))
    torch.testing.assert_close(b(x), h + b.mlp_out(b.mlp(b.mlp_in(h))))

    b = build_model(cfg(placement="output")).blocks[1]
    perturb_norms(b)
    h = x + b.attn_out(b.attn(x))
    torch.testing.assert_close(b(x), h + b.mlp_out(b.mlp(h)))

    m = build_model(cfg(placement="mix", depth=4, mix_alpha=0.5))
    perturb_norms(m)
    for b in m.blocks[:2]:  # Post-LN part
        h = b.attn_post(x + b.attn(x))
        torch.testing.assert_close(b(x), b.mlp_post(h + b.mlp(h)))
    for b in m.blocks[2:]:  # Pre-LN part
        h = x + b.attn(b.attn_in(x))
        torch.testing.assert_close(b(x), h + b.mlp(b.mlp_in(h)))


@pytest.mark.parametrize("placement", sorted(PLACEMENTS))
def test_model_equation(placement):
    """logits = lm_head(final_norm(blocks(embed_norm(tok_emb(idx))))) for every placement."""
    torch.manual_seed(0)
    m = build_model(cfg(placement=placement, embed_norm=True, final_norm=True)).eval()
    perturb_norms(m)
    idx = torch.randint(0, 50, (2, 7))
    h = m.embed_norm(m.tok_emb(idx))
    for b in m.blocks:
        h = b(h)
    torch.testing.assert_close(m(idx), m.lm_head(m.final_norm(h)))


# ---------------------------------------------------------------- LayerNorm Scaling


def _record_inputs(model, store):
    hooks = []
    for i, b in enumerate(model.blocks):
        for site, sub in (("attn_in", b.attn), ("mlp_in", b.mlp)):
            hooks.append(getattr(b, site).register_forward_hook(
                lambda mod, inp, out, i=i, site=site: store.__setitem__((i, site, "norm_out"), out.detach())))
            hooks.append(sub.register_forward_pre_hook(
                lambda mod, inp, i=i, site=site: store.__setitem__((i, site, "sub_in"), inp[0].detach())))
    return hooks


@pytest.mark.parametrize("placement", ["pre", "peri"])
def test_layernorm_scaling_factor_is_one_over_sqrt_l(placement):
    torch.manual_seed(0)
    on = build_model(cfg(placement=placement, depth=5, layernorm_scaling=True)).eval()
    off = build_model(cfg(placement=placement, depth=5, layernorm_scaling=False)).eval()
    off.load_state_dict(on.state_dict())
    perturb_norms(on)
    off.load_state_dict(on.state_dict())
    rec_on, rec_off = {}, {}
    _record_inputs(on, rec_on)
    _record_inputs(off, rec_off)
    x = torch.randn(2, 6, 32)
    for l, (b_on, b_off) in enumerate(zip(on.blocks, off.blocks), start=1):
        assert b_on.in_scale == 1.0 / math.sqrt(l)
        b_on(x), b_off(x)  # same input to both blocks
        s = 1.0 / math.sqrt(l)
        for site in ("attn_in", "mlp_in"):  # sublayer input = input-norm output * 1/sqrt(l), exactly
            assert torch.equal(rec_on[(l - 1, site, "sub_in")], rec_on[(l - 1, site, "norm_out")] * s)
            assert torch.equal(rec_off[(l - 1, site, "sub_in")], rec_off[(l - 1, site, "norm_out")])
        # same block input and weights: the attention input differs from the unscaled model by exactly 1/sqrt(l)
        assert torch.equal(rec_on[(l - 1, "attn_in", "sub_in")], rec_off[(l - 1, "attn_in", "sub_in")] * s)
    # embedding and final norm untouched: the model is still lm_head(final_norm(blocks(embed_norm(emb))))
    idx = torch.randint(0, 50, (2, 6))
    h = on.embed_norm(on.tok_emb(idx))
    torch.testing.assert_close(h, off.embed_norm(off.tok_emb(idx)), rtol=0, atol=0)
    for b in on.blocks:
        h = b(h)
    torch.testing.assert_close(on(idx), on.lm_head(on.final_norm(h)), rtol=0, atol=0)


def test_layernorm_scaling_peri_keeps_output_norm_unscaled():
    torch.manual_seed(0)
    b = build_model(cfg(placement="peri", depth=4, layernorm_scaling=True)).blocks[3]
    x = torch.randn(2, 5, 32)
    h = x + b.attn_out(b.attn(b.attn_in(x) * 0.5))
    torch.testing.assert_close(b(x), h + b.mlp_out(b.mlp(b.mlp_in(h) * 0.5)))


def test_layernorm_scaling_in_mix_uses_global_depth_on_pre_blocks_only():
    m = build_model(cfg(placement="mix", depth=8, mix_alpha=0.25, layernorm_scaling=True))
    assert [b.in_scale for b in m.blocks] == [1.0, 1.0] + [1.0 / math.sqrt(l) for l in range(3, 9)]


# ---------------------------------------------------------------- residual scaling


@pytest.mark.parametrize("placement", ["pre", "post", "peri"])
def test_fixed_residual_scale(placement):
    torch.manual_seed(0)
    L = 4
    b = build_model(cfg(placement=placement, depth=L, residual_scale="fixed")).blocks[2]
    a = 1.0 / math.sqrt(2 * L)
    x = torch.randn(2, 5, 32)
    h = b.attn_post(x + a * b.attn_out(b.attn(b.attn_in(x))))
    torch.testing.assert_close(b(x), b.mlp_post(h + a * b.mlp_out(b.mlp(b.mlp_in(h)))))


@pytest.mark.parametrize("placement", ["pre", "peri", "output", "mix"])
def test_learnable_residual_scale_starts_as_identity(placement):
    torch.manual_seed(0)
    m = build_model(cfg(placement=placement, residual_scale="learnable", mix_alpha=0.0, depth=3)).eval()
    names = {n for n, _ in m.named_parameters() if "res_scale" in n}
    assert names == {f"blocks.{i}.{s}_res_scale" for i in range(3) for s in ("attn", "mlp")}
    assert all(p.shape == () and p.item() == 0.0 for n, p in m.named_parameters() if "res_scale" in n)
    perturb_norms(m)
    idx = torch.randint(0, 50, (2, 9))
    torch.testing.assert_close(m(idx), m.lm_head(m.final_norm(m.embed_norm(m.tok_emb(idx)))), rtol=0, atol=0)
    # the scalars learn: they get a gradient at init, and the optimizer does not decay them
    m.train()
    _, loss = m(idx, idx)
    loss.backward()
    assert m.blocks[0].attn_res_scale.grad is not None and m.blocks[0].attn_res_scale.grad.abs() > 0
    from normlab.config import TrainConfig
    from normlab.train.optim import param_groups

    _, groups = param_groups(m, TrainConfig())
    assert names <= set(groups["no_decay"])


# ---------------------------------------------------------------- every norm x placement x modifier


@pytest.mark.parametrize("placement", sorted(PLACEMENTS))
@pytest.mark.parametrize("norm", norm_names())
def test_every_norm_and_placement_trains_and_evaluates(norm, placement):
    torch.manual_seed(0)
    kw = dict(layernorm_scaling=placement in ("pre", "peri", "mix"), residual_scale="fixed", mix_alpha=0.5,
              depth=2, dropout=0.1)
    m = build_model(cfg(norm=norm, placement=placement, **kw))
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
    idx = torch.randint(0, 50, (4, 12))
    for _ in range(2):
        _, loss = m(idx[:, :-1], idx[:, 1:])
        loss.backward()
        assert all(torch.isfinite(p.grad).all() for p in m.parameters() if p.grad is not None)
        opt.step()
        opt.zero_grad()
    m.eval()
    with torch.no_grad():
        assert torch.isfinite(m(idx)).all()


# ---------------------------------------------------------------- config contract


def test_config_keys_through_yaml_and_overrides():
    c = load_config("tiny", ["model.placement=mix", "model.mix_alpha=0.5", "model.layernorm_scaling=true",
                             "model.residual_scale=learnable", "model.embed_norm=true"])
    m = c.model
    assert (m.placement, m.mix_alpha, m.layernorm_scaling, m.residual_scale, m.embed_norm) == (
        "mix", 0.5, True, "learnable", True)


@pytest.mark.parametrize("model, fragment", [
    ({"placement": "peri-ln"}, "allowed: deepnorm, mix, output, peri, post, pre"),
    ({"mix_alpha": 1.5}, "model.mix_alpha must be in [0, 1]"),
    ({"residual_scale": "rezero"}, "unknown model.residual_scale 'rezero'"),
    ({"residual_scale": True}, "model.residual_scale must be str"),
    ({"placement": "post", "layernorm_scaling": True}, "model.layernorm_scaling"),
    ({"placement": "output", "layernorm_scaling": True}, "no input norms"),
    ({"placement": "peri", "norm_options": {"affine": False}}, "learnable output-norm gain"),
    ({"embed_norm": "yes"}, "model.embed_norm must be bool or null"),
])
def test_bad_placement_config_is_one_line(model, fragment):
    with pytest.raises(NormlabError) as e:
        config_from_dict({"model": model})
    assert fragment in str(e.value) and "\n" not in str(e.value)


def test_peri_allows_fixed_final_and_embed_gain():
    m = build_model(cfg(placement="peri", norm_options={"affine@final": False, "affine@embed": False}))
    assert m.final_norm.weight is None and m.embed_norm.weight is None
    assert all(b.attn_out.weight is not None for b in m.blocks)


def test_pre_parameter_names_unchanged():
    """Default models keep their state-dict names (no embed norm, no residual scalars)."""
    names = set(build_model(cfg()).state_dict())
    assert not any(n.startswith("embed_norm") or "res_scale" in n for n in names)
    assert {"tok_emb.weight", "final_norm.weight", "blocks.0.attn.qkv.weight", "blocks.0.mlp.proj.weight"} <= names


# ---------------------------------------------------------------- DeepNorm (Wang et al. 2022, arXiv:2203.00555)


@pytest.mark.parametrize("N", [1, 2, 6, 18, 100])
def test_deepnorm_constants_are_the_papers_decoder_only_row(N):
    from normlab.model.placements import deepnorm_alpha, deepnorm_beta

    # Table 1, decoder-only: alpha = (2N)^(1/4), beta = (8N)^(-1/4); written out: alpha^4 = 2N, beta^-4 = 8N
    assert deepnorm_alpha(N) ** 4 == pytest.approx(2 * N) and deepnorm_beta(N) ** -4 == pytest.approx(8 * N)


def test_deepnorm_block_equation_and_structure():
    """x = LN(alpha x + F(x)) per sublayer, alpha = (2N)^(1/4) with N = depth; Post-LN sites, no final norm."""
    torch.manual_seed(0)
    m = build_model(cfg(placement="deepnorm", depth=4))
    assert all(sites(b) == {"attn_post", "mlp_post"} for b in m.blocks) and not is_norm(m.final_norm)
    a = 8.0 ** 0.25  # (2 * 4)^(1/4)
    b = m.blocks[2]
    perturb_norms(b)
    x = torch.randn(2, 5, 32)
    h = b.attn_post(a * x + b.attn(x))
    torch.testing.assert_close(b(x), b.mlp_post(a * h + b.mlp(h)))


def test_deepnorm_init_scales_the_value_writers_by_beta():
    """torchscale divides the FFN, value and output projection weights by (8N)^(1/4); queries, keys and the
    embedding keep the base std. Std estimates over >= 16k entries: within 5% of the target."""
    torch.manual_seed(0)
    N, w = 6, 128
    m = build_model(cfg(placement="deepnorm", depth=N, width=w, heads=4))
    beta = (8 * N) ** -0.25
    base = build_model(cfg(placement="pre", depth=N, width=w, heads=4))
    for blk, ref in zip(m.blocks, base.blocks):
        q, k, v = blk.attn.qkv.weight.chunk(3, 0)
        for t, s in ((q, 0.02), (k, 0.02), (v, 0.02 * beta), (blk.attn.proj.weight, 0.02 * beta),
                     (blk.mlp.fc.weight, 0.02 * beta), (blk.mlp.proj.weight, 0.02 * beta)):
            assert t.std().item() == pytest.approx(s, rel=0.05)
        assert ref.attn.proj.weight.std().item() == pytest.approx(0.02 / math.sqrt(2 * N), rel=0.05)  # GPT-2 scheme
    assert m.tok_emb.weight.std().item() == pytest.approx(0.02, rel=0.05)
