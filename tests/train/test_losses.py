"""Output-normalization losses against hand-computed values (z-loss: PaLM; LogitNorm: Wei et al. 2022;
softcap: Gemma 2)."""

from __future__ import annotations

import math

import pytest
import torch

from normlab.model.gpt import softcap
from normlab.train.losses import lm_loss, logitnorm


def _one(row, target):
    return torch.tensor([[row]], dtype=torch.float32), torch.tensor([[target]])


def test_plain_ce_hand_value():
    # logits [0, ln 3] -> p = [1/4, 3/4]; target 1 -> CE = ln(4/3)
    logits, y = _one([0.0, math.log(3.0)], 1)
    loss, parts = lm_loss(logits, y)
    assert float(loss) == pytest.approx(math.log(4 / 3), rel=1e-6)
    assert set(parts) == {"ce"} and float(parts["ce"]) == pytest.approx(math.log(4 / 3), rel=1e-6)


def test_z_loss_hand_value():
    # logsumexp([0, ln 3]) = ln 4; z-loss = c * (ln 4)^2
    logits, y = _one([0.0, math.log(3.0)], 1)
    loss, parts = lm_loss(logits, y, z_loss=1e-2)
    assert float(parts["z_loss"]) == pytest.approx(1e-2 * math.log(4) ** 2, rel=1e-6)
    assert float(loss) == pytest.approx(math.log(4 / 3) + 1e-2 * math.log(4) ** 2, rel=1e-6)


def test_z_loss_is_a_mean_over_tokens_and_skips_ignored():
    logits = torch.tensor([[[0.0, 0.0], [math.log(3.0), 0.0], [5.0, 5.0]]])  # lse = ln 2, ln 4, (ignored)
    y = torch.tensor([[0, 0, -100]])
    _, parts = lm_loss(logits, y, z_loss=1.0)
    assert float(parts["z_loss"]) == pytest.approx((math.log(2) ** 2 + math.log(4) ** 2) / 2, rel=1e-6)
    assert float(parts["ce"]) == pytest.approx((math.log(2) + math.log(4 / 3)) / 2, rel=1e-6)


def test_logitnorm_hand_value():
    # logits [3, 4]: norm 5 -> [0.6, 0.8] / tau(0.1) = [6, 8]; target 0 -> CE = ln(1 + e^2)
    logits, y = _one([3.0, 4.0], 0)
    loss, parts = lm_loss(logits, y, logitnorm_tau=0.1)
    expect = math.log(1 + math.exp(2.0))
    assert float(loss) == pytest.approx(expect, rel=1e-5)
    assert float(parts["logitnorm_ce"]) == pytest.approx(expect, rel=1e-5)
    assert float(parts["ce"]) == pytest.approx(math.log(1 + math.e), rel=1e-6)  # raw logits: ln(1 + e^1)
    assert torch.allclose(logitnorm(torch.tensor([3.0, 4.0]), 0.1), torch.tensor([6.0, 8.0]), atol=1e-5)


def test_logitnorm_is_scale_invariant_and_z_loss_uses_raw_logits():
    x = torch.randn(2, 3, 7)
    y = torch.randint(0, 7, (2, 3))
    a, _ = lm_loss(x, y, logitnorm_tau=0.04)
    b, _ = lm_loss(10 * x, y, logitnorm_tau=0.04)
    assert float(a) == pytest.approx(float(b), rel=1e-5)
    _, pz = lm_loss(x, y, logitnorm_tau=0.04, z_loss=1e-4)
    assert float(pz["z_loss"]) == pytest.approx(1e-4 * float(torch.logsumexp(x, -1).square().mean()), rel=1e-5)


def test_softcap_hand_values_and_bound():
    c = 2.0
    x = torch.tensor([0.0, 2 * math.atanh(0.5), -2 * math.atanh(0.5), 1e6])
    assert torch.allclose(softcap(x, c), torch.tensor([0.0, 1.0, -1.0, 2.0]), atol=1e-6)
    assert softcap(x, None) is x and softcap(x, 0.0) is x
    z = torch.randn(1000) * 100
    assert softcap(z, 30.0).abs().max() <= 30.0


def test_lm_loss_softcap_applies_before_ce():
    c = 2.0
    logits, y = _one([0.0, 2 * math.atanh(0.5)], 1)  # capped: [0, 1] -> CE = ln(1 + e^-1)
    loss, _ = lm_loss(logits, y, logit_softcap=c)
    assert float(loss) == pytest.approx(math.log(1 + math.exp(-1.0)), rel=1e-6)


def test_gradients_flow():
    x = torch.randn(2, 4, 5, requires_grad=True)
    loss, _ = lm_loss(x, torch.randint(0, 5, (2, 4)), z_loss=1e-4, logitnorm_tau=0.05, logit_softcap=30.0)
    loss.backward()
    assert x.grad is not None and torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
