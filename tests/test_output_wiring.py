"""Output-normalization options wired into the model and the training loop."""

from __future__ import annotations

import json
import math

import torch

from normlab.model import ModelConfig, build_model
from tests.helpers import run_inproc


def test_logit_softcap_in_forward():
    torch.manual_seed(0)
    plain = build_model(ModelConfig(vocab_size=40, context=8, width=16, depth=1, heads=2))
    torch.manual_seed(0)
    capped = build_model(ModelConfig(vocab_size=40, context=8, width=16, depth=1, heads=2, logit_softcap=0.05))
    x = torch.randint(0, 40, (2, 8))
    raw = plain(x)
    torch.testing.assert_close(capped(x), 0.05 * torch.tanh(raw / 0.05))
    assert capped(x).abs().max() < 0.05


def test_selu_uses_lecun_normal_init():
    torch.manual_seed(0)
    m = build_model(ModelConfig(width=256, heads=4, depth=2, norm="none", activation="selu"))
    fc = m.blocks[0].mlp.fc.weight
    assert abs(fc.std().item() - 1 / math.sqrt(256)) < 0.05 / math.sqrt(256)
    proj = m.blocks[1].mlp.proj.weight  # fan_in = 4 * 256, no depth scaling
    assert abs(proj.std().item() - 1 / math.sqrt(1024)) < 0.05 / math.sqrt(1024)
    x = torch.randn(4096, 256)
    assert abs(torch.nn.functional.selu(m.blocks[0].mlp.fc(x)).var().item() - 1.0) < 0.1  # self-normalising


def test_z_loss_and_logitnorm_are_logged(tmp_path):
    cache = tmp_path / "cache"
    for key, name in (("train.z_loss=0.001", "z_loss"), ("train.logitnorm_tau=0.04", "logitnorm_ce")):
        out = tmp_path / name
        run_inproc("train", "tiny", "--set", key, "--set", "train.steps=4", "--set", "train.log_every=2",
                   "--out", str(out), cache=cache, check=True)
        recs = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
        logged = [r for r in recs if name in r]
        assert logged and all(r[name] > 0 for r in logged)
        # the logged 'loss' stays the raw cross-entropy (near ln 16 .. ln 256 early on), not the objective
        assert all(1.0 < r["loss"] < math.log(256) + 0.5 for r in logged)
