"""Residual sinks (Qiu et al. 2026; normlab.diagnostics.residual_sinks): detection of a planted outlier dimension,
the share of the RMS against a direct computation, and the clipping ablation against a hand-written forward."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from normlab.diagnostics.residual_sinks import ablate_residual_sinks, residual_sinks, residual_sinks_by_block
from normlab.model import ModelConfig, build_model
from tests.helpers import run_inproc


def planted(seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(4, 50, 16, generator=g, dtype=torch.float64)
    h[..., 3] = 40.0 + torch.randn(4, 50, generator=g, dtype=torch.float64)  # a persistent outlier dim
    h[0, 7, 9] = 500.0  # a massive activation on one token only: not a residual sink
    keep = torch.rand(4, 50, generator=g) < 0.3
    h[..., 12] = torch.where(keep, torch.full_like(h[..., 12], 60.0), h[..., 12])  # large on ~30% of tokens
    return h


def test_detects_the_planted_outlier_dim_and_its_share_of_the_rms():
    h = planted()
    r = residual_sinks(h)
    assert r["dims"] == [3]  # not 9 (one token) nor 12 (a minority of tokens)
    assert r["persistence"] == [1.0]
    m = float(h.abs().median())
    assert r["median_abs"] == pytest.approx(m) and r["threshold"] == pytest.approx(10 * m)
    energy = (h ** 2).mean(dim=(0, 1))
    assert r["rms_share"] == pytest.approx(float(energy[3] / energy.sum()), rel=1e-12)
    assert r["rms_share"] > 0.3  # one dim of 16 carries a large part of mean(h^2)
    # dim 12 becomes a sink when "most" is relaxed below its share of tokens
    assert residual_sinks(h, persist=0.2)["dims"] == [3, 12]
    # no sink in a Gaussian stream
    assert residual_sinks(torch.randn(4, 50, 16, dtype=torch.float64))["dims"] == []
    by = residual_sinks_by_block([torch.randn(2, 5, 16, dtype=torch.float64), h])
    assert by["dims"] == [3] and [b["dims"] for b in by["blocks"]] == [[], [3]]


def hand_clipped_loss(model, idx, targets, dims_per_block, scales):
    """The GPT forward written out, clamping the chosen dims of each block's output."""
    x = model.tok_emb(idx)
    x = model.drop(model.embed_norm(x))
    for blk, dims, s in zip(model.blocks, dims_per_block, scales):
        x = blk(x).clone()
        for j in dims:
            x[..., j] = x[..., j].clamp(-s, s)
    logits = model.lm_head(model.final_norm(x))
    return float(F.cross_entropy(logits.double().reshape(-1, logits.size(-1)), targets.reshape(-1)))


def test_ablation_matches_a_hand_written_forward():
    torch.manual_seed(0)
    model = build_model(ModelConfig(vocab_size=30, context=12, width=16, depth=2, heads=2)).eval()
    with torch.no_grad():  # plant a residual sink: embeddings carry a large constant in dim 5
        model.tok_emb.weight[:, 5] += 3.0
    idx = torch.randint(0, 30, (3, 12), generator=torch.Generator().manual_seed(1))
    targets = torch.randint(0, 30, (3, 12), generator=torch.Generator().manual_seed(2))
    hidden = []
    hs = [b.register_forward_hook(lambda m, i, o: hidden.append(o.detach())) for b in model.blocks]
    with torch.no_grad():
        model(idx)
    for h in hs:
        h.remove()
    sinks = residual_sinks_by_block(hidden)
    assert 5 in sinks["dims"]
    ab = ablate_residual_sinks(model, idx, targets, sinks)
    with torch.no_grad():
        base = hand_clipped_loss(model, idx, targets, [[], []], [0, 0])
        want = hand_clipped_loss(model, idx, targets, [b["dims"] for b in sinks["blocks"]],
                                 [b["median_abs"] for b in sinks["blocks"]])
        ctrl = hand_clipped_loss(model, idx, targets, ab["control_dims"], [b["median_abs"] for b in sinks["blocks"]])
    assert ab["base_loss"] == pytest.approx(base, rel=1e-6)
    assert ab["clipped_loss"] == pytest.approx(want, rel=1e-6)
    assert ab["control_loss"] == pytest.approx(ctrl, rel=1e-6)
    assert all(not set(c) & set(b["dims"]) and len(c) == len(b["dims"])
               for c, b in zip(ab["control_dims"], sinks["blocks"]))


def test_diagnose_cli_reports_and_ablates(tmp_path):
    run = tmp_path / "run"
    cache = tmp_path / "cache"
    run_inproc("train", "tiny", "--set", "train.steps=4", "--set", "train.eval_every=4", "--out", str(run),
               cache=cache, check=True)
    out = json.loads(run_inproc("diagnose", str(run), "--sequences", "4", "--ablate-residual-sinks", "--json",
                                cache=cache, check=True).stdout)
    rs, ab = out["residual_sinks"], out["residual_sink_ablation"]
    assert len(rs["blocks"]) == out["model"]["depth"] and rs["ratio"] == 10.0
    assert ab["base_loss"] == pytest.approx(out["layer_effectiveness"]["base_loss"], rel=1e-9)
    if not rs["dims"]:  # nothing clipped: the ablation changes nothing
        assert ab["clipped_loss"] == ab["base_loss"]
    text = run_inproc("diagnose", str(run), "--sequences", "4", cache=cache, check=True).stdout
    assert "residual sinks" in text
