"""AdaGC (Wang et al. 2025, normlab.train.clipping) against a hand-computed sequence of thresholds, and wired into
training: per-group logging, the summary and bit-exact resume."""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch import nn

from normlab.config import TrainConfig
from normlab.errors import NormlabError
from normlab.train.clipping import AdaGC, GlobalClip, param_group
from tests.helpers import run_inproc, summary, weights


def set_grads(params, norms):
    """Gradient of each parameter = a fixed direction with the given L2 norm."""
    for p, n in zip(params, norms):
        d = torch.arange(1, p.numel() + 1, dtype=torch.float64).view_as(p)
        p.grad = (d / d.norm() * n).clone()


def test_adagc_thresholds_follow_the_hand_computed_ema():
    a = nn.Parameter(torch.zeros(3, dtype=torch.float64))
    b = nn.Parameter(torch.zeros(2, 2, dtype=torch.float64))
    clip = AdaGC({"blocks.0.attn.qkv.weight": a, "blocks.0.mlp.fc.weight": b}, lambda_abs=1.0, lambda_rel=1.05,
                 beta=0.98, warmup=2)
    eps = 1e-6
    # step 0 (warm-up): norms 3 and 4, global 5 > 1: both scaled by 1/5 -> 0.6, 0.8; gamma = min(inf, .) = 0.6, 0.8
    set_grads([a, b], [3.0, 4.0])
    assert clip.clip(0) == pytest.approx(5.0)
    h = 1.0 / (5.0 + eps)
    assert a.grad.norm().item() == pytest.approx(3 * h) and b.grad.norm().item() == pytest.approx(4 * h)
    torch.testing.assert_close(clip.gamma, torch.tensor([3 * h, 4 * h], dtype=torch.float64))
    # step 1 (warm-up): norms 0.3, 0.4, global 0.5 < 1: unclipped; gamma = min(gamma, norm) = 0.3, 0.4
    set_grads([a, b], [0.3, 0.4])
    clip.clip(1)
    torch.testing.assert_close(clip.gamma, torch.tensor([0.3, 0.4], dtype=torch.float64))
    assert a.grad.norm().item() == pytest.approx(0.3)
    # step 2 (adaptive): a's norm 1.0 > 1.05 * 0.3 -> clipped to 0.315; b's 0.41 < 1.05 * 0.4 = 0.42 -> kept
    set_grads([a, b], [1.0, 0.41])
    clip.clip(2)
    ha = 1.05 * 0.3 / (1.0 + eps)
    assert a.grad.norm().item() == pytest.approx(ha, rel=1e-12)
    assert b.grad.norm().item() == pytest.approx(0.41, rel=1e-12)
    g_a = 0.98 * 0.3 + 0.02 * ha
    g_b = 0.98 * 0.4 + 0.02 * 0.41
    torch.testing.assert_close(clip.gamma, torch.tensor([g_a, g_b], dtype=torch.float64))
    assert clip.metrics() == pytest.approx({"adagc/clipped/attn": 1.0, "adagc/clipped/mlp": 0.0,
                                            "adagc/threshold/attn": 1.05 * g_a, "adagc/threshold/mlp": 1.05 * g_b})
    # step 3: the threshold uses the previous step's gamma
    set_grads([a, b], [0.2, 5.0])
    clip.clip(3)
    hb = 1.05 * g_b / (5.0 + eps)
    assert b.grad.norm().item() == pytest.approx(5.0 * hb, rel=1e-12)
    torch.testing.assert_close(clip.gamma, torch.tensor([0.98 * g_a + 0.02 * 0.2, 0.98 * g_b + 0.02 * 5.0 * hb],
                                                        dtype=torch.float64))
    assert clip.summary() == {"adagc_clipped": {"attn": 2, "mlp": 2}}  # step 0 (global), then 2 and 3
    # the state round-trips through JSON
    again = AdaGC({"blocks.0.attn.qkv.weight": a, "blocks.0.mlp.fc.weight": b}, lambda_abs=1.0, lambda_rel=1.05,
                  beta=0.98, warmup=2)
    again.load_state_dict(json.loads(json.dumps(clip.state_dict())))
    torch.testing.assert_close(again.gamma, clip.gamma, rtol=0, atol=0)


def test_global_clip_is_clip_grad_norm():
    p = nn.Parameter(torch.zeros(4, dtype=torch.float64))
    set_grads([p], [3.0])
    assert GlobalClip([p], 1.0).clip(0) == pytest.approx(3.0)
    assert p.grad.norm().item() == pytest.approx(1.0, rel=1e-5)


def test_param_groups_for_logging():
    assert [param_group(n) for n in ("blocks.3.attn.qkv.weight", "blocks.0.mlp.proj.weight", "blocks.1.attn_in.weight",
                                     "tok_emb.weight", "final_norm.bias", "lm_head.weight", "x")] == \
        ["attn", "mlp", "norm", "embed", "norm", "head", "other"]


def test_clip_config_errors_are_one_line():
    with pytest.raises(NormlabError, match="train.clip 'ada'.*allowed: adagc, global"):
        TrainConfig(clip="ada").validate()
    with pytest.raises(NormlabError, match="train.adagc_beta must be in"):
        TrainConfig(adagc_beta=1.0).validate()


def test_adagc_trains_logs_per_group_and_resumes_exactly(tmp_path):
    sets = ["--set", "train.steps=12", "--set", "train.log_every=2", "--set", "train.checkpoint_every=6",
            "--set", "train.eval_every=12", "--set", "train.clip=adagc", "--set", "train.warmup_steps=3",
            "--set", "train.adagc_lambda=0.5"]
    cache = tmp_path / "cache"
    run_inproc("train", "tiny", *sets, "--out", str(tmp_path / "a"), cache=cache, check=True)
    s = summary(tmp_path / "a")
    assert s["status"] == "completed" and sum(s["adagc_clipped"].values()) > 0  # lambda 0.5 clips
    recs = [json.loads(line) for line in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    keys = {k for r in recs for k in r if k.startswith("adagc/")}
    assert {"adagc/clipped/attn", "adagc/clipped/mlp", "adagc/threshold/attn"} <= keys
    assert all(math.isfinite(r[k]) for r in recs for k in r if k.startswith("adagc/"))
    # the run rolled back to its step-6 checkpoint and resumed ends with the same weights (AdaGC state included)
    import shutil

    shutil.copytree(tmp_path / "a", tmp_path / "b")
    ckpts = sorted((tmp_path / "b" / "checkpoints").iterdir())
    assert [c.name for c in ckpts][-1].endswith("12") and len(ckpts) == 2
    shutil.rmtree(ckpts[-1])
    (tmp_path / "b" / "model.safetensors").unlink()
    state = json.loads((ckpts[0] / "state.json").read_text())
    assert state["clip"]["names"] and len(state["clip"]["gamma"]) == len(state["clip"]["names"])
    run_inproc("train", "--resume", str(tmp_path / "b"), cache=cache, check=True)
    wa, wb = weights(tmp_path / "a"), weights(tmp_path / "b")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
