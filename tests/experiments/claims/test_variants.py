"""normlab.experiments.claims.variants: the papers' recipes build the models the papers describe (DyT's untied
head and the authors' DyT, PowerNorm's groups, LSSAR trained re-weighted)."""

from __future__ import annotations


import pytest
import torch
from torch import nn


torch.set_num_threads(1)


def _build(variant: str, budget: str = "quick"):
    from normlab.config import config_from_dict
    from normlab.experiments.claims.budgets import get_budget
    from normlab.experiments.claims.variants import variant_config
    from normlab.model import build_model

    cfg = config_from_dict(variant_config(variant, get_budget(budget), 0))
    torch.manual_seed(0)
    return cfg, build_model(cfg.model)


def test_dyt_recipe_builds_an_untied_head_and_the_authors_dyt():
    """The DyT claim's model is the authors' LLaMA recipe: untied LM head, DyT without bias, alpha0 set for the
    width as the paper recommends (1.0 at every site at width <= 1024, Zhu et al. 2025 Tables 10-11), a learnable
    embedding scalar starting at sqrt(4096) = 64."""
    from normlab.norms.simple import DyT

    cfg, m = _build("dyt")
    assert cfg.model.tie_embeddings is False
    assert m.lm_head.weight is not m.tok_emb.weight
    assert m.lm_head.weight.data_ptr() != m.tok_emb.weight.data_ptr()
    assert isinstance(m.embed_scale, nn.Parameter) and m.embed_scale.item() == 64.0
    blk = m.blocks[0]
    alphas = {site: getattr(blk, site).alpha.item() for site in ("attn_in", "mlp_in")}
    assert alphas == {"attn_in": 1.0, "mlp_in": 1.0}
    assert isinstance(m.final_norm, DyT) and m.final_norm.alpha.item() == 1.0
    assert (
        all(getattr(b, s).bias is None for b in m.blocks for s in ("attn_in", "mlp_in")) and m.final_norm.bias is None
    )
    # the stream starts at the authors' RMS: 64 * 0.02 = 1.28
    x = (m.tok_emb.weight * m.embed_scale).detach()
    assert float(x.pow(2).mean().sqrt()) == pytest.approx(1.28, rel=0.05)
    # its baseline has the same untied head
    _, ln = _build("ln_untied")
    assert ln.lm_head.weight is not ln.tok_emb.weight and ln.embed_scale is None


def test_powernorm_recipe_groups_are_heads_and_lssar_trains_reweighted():
    cfg, m = _build("powernorm")
    assert {getattr(b, s).groups for b in m.blocks for s in ("attn_in", "mlp_in")} == {cfg.model.heads}
    cfg, m = _build("softplus_lssar")
    assert cfg.model.lssa_reweight is True and all(b.attn.reweight for b in m.blocks)
    cfg, _ = _build("softplus")
    assert cfg.model.lssa_reweight is False


def test_variants_are_named_keyword_configs_evaluated_on_the_budget():
    """A variant is a named config (``Variant``: depth class, model / train overrides by keyword); a budget-
    dependent override (PowerNorm's groups = heads) is evaluated on the budget it runs with, and the claims' recipe
    reads it on the full budget."""
    from normlab.experiments.claims.budgets import get_budget
    from normlab.experiments.claims.variants import (ALL_VARIANTS, GRID_VARIANTS, VARIANTS, Variant, recipe,
                                                     variant_config)

    assert set(ALL_VARIANTS) == set(VARIANTS) | set(GRID_VARIANTS) and all(
        isinstance(v, Variant) and v.name == k for k, v in {**VARIANTS, **GRID_VARIANTS}.items())
    for b in ("tiny", "full"):
        assert variant_config("powernorm", get_budget(b), 0)["model"]["norm_options"] == {
            "groups": get_budget(b).heads}
    assert recipe("powernorm")["model"]["norm_options"] == {"groups": get_budget("full").heads}
    cfg = variant_config("deep_post_nowarm", get_budget("tiny"), 1)
    assert cfg["model"]["depth"] == get_budget("tiny").deep_depth and cfg["train"]["warmup_steps"] == 0
    assert cfg["model"]["placement"] == "post" and cfg["seed"] == 1
    grid = variant_config("grid_pre_z", get_budget("tiny"), 0, 0.01)
    assert grid["train"]["z_loss"] == 1e-4 and grid["train"]["lr"] == 0.01
    assert grid["model"]["depth"] == get_budget("tiny").grid_depth
    with pytest.raises(ValueError, match="depth must be one of"):
        Variant("x", "medium")


def test_frontier_variants_build_what_their_claims_name():
    """The residual-stream papers' variants: HC / mHC with 4 streams, nGPT for a quarter of the grid's steps with its
    recipe (no norm, untied, no weight decay, no warm-up; every evaluation and checkpoint at its own last step),
    DeepNorm deep without warm-up, Derf and DyT in the Derf authors' GPT-2 recipe (alpha 1.0, bias, learnable
    embedding scale)."""
    from normlab.experiments.claims.budgets import get_budget
    from normlab.experiments.claims.variants import recipe, variant_config

    full = get_budget("full")
    g = variant_config("grid_ngpt_quarter", full, 0, 0.01)
    assert g["train"]["steps"] == full.grid_steps // 4 == g["train"]["eval_every"] == g["train"]["checkpoint_every"]
    assert (g["train"]["weight_decay"], g["train"]["warmup_steps"]) == (0.0, 0)
    assert recipe("grid_ngpt_quarter")["train"]["steps"] == full.grid_steps // 4  # hashed as a number
    _, m = _build("grid_ngpt_quarter")
    assert m.logit_scale is not None and m.lm_head.weight is not m.tok_emb.weight
    _, m = _build("grid_mhc")
    assert m.streams == 4 and m.blocks[0].attn_hc.sinkhorn_iters == 20
    cfg, m = _build("deep_deepnorm_nowarm")
    assert cfg.model.placement == "deepnorm" and cfg.train.warmup_steps == 0
    assert m.blocks[0].skip_scale == pytest.approx((2 * cfg.model.depth) ** 0.25)
    for v, cls in (("grid_derf", "Derf"), ("grid_dyt_gpt2", "DyT")):
        _, m = _build(v)
        blk = m.blocks[0]
        assert type(blk.attn_in).__name__ == cls and blk.attn_in.alpha.item() == 1.0 and blk.attn_in.bias is not None
        assert isinstance(m.embed_scale, nn.Parameter) and m.lm_head.weight is m.tok_emb.weight


def test_hc_at_equal_flops_trains_for_pre_lns_training_flops():
    """hc-vs-pre-flops' HC: steps x HC's training FLOPs per token equals the grid's steps x Pre-LN's, within half a
    step (the rounding), the FLOPs counted independently by torch's FlopCounterMode on the two grid models' matmuls
    and attention (model/flops.py adds norms and elementwise ops by declaration: within 1% of the steps)."""
    from torch.utils.flop_counter import FlopCounterMode

    from normlab.experiments.claims.budgets import get_budget
    from normlab.experiments.claims.variants import recipe, variant_config

    for budget in ("quick", "full"):
        b = get_budget(budget)
        steps = variant_config("grid_hc_flops", b, 0, 0.01)["train"]["steps"]
        flops = {}
        for v in ("grid_pre", "grid_hc"):
            cfg, m = _build(v, budget)
            x = torch.zeros(1, cfg.model.context, dtype=torch.long)
            with FlopCounterMode(display=False) as fc:
                m(x)
            flops[v] = fc.get_total_flops()
        ratio = flops["grid_pre"] / flops["grid_hc"]
        assert 0.80 < ratio < 0.97  # HC costs more per token at width 64
        assert abs(steps - b.grid_steps * ratio) <= 0.5 + 0.02 * b.grid_steps  # norms/elementwise: the 2% left
        assert steps < b.grid_steps
    assert recipe("grid_hc_flops")["train"]["steps"] == variant_config("grid_hc_flops", get_budget("full"), 0,
                                                                        0.01)["train"]["steps"]
