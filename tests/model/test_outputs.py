"""StableMax (Prieto et al. 2025, normlab.model.outputs) against its closed form, its gradient and its limits, and
``model.output: stablemax`` wired into the model; perp-Grad (normlab.train.optim.orthograd_) against its
definition; the Softmax-Collapse detector (normlab.diagnostics.collapse) on logits that collapse in float32 and
not in float64.

Output-normalization options wired into the model and the training loop."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

from normlab.config import DiagConfig, OptimConfig, TrainConfig
from normlab.diagnostics.collapse import FP32_EXP_FLOOR, collapse_fractions
from normlab.diagnostics.training import TrainDiagnostics
from normlab.errors import NormlabError
from normlab.model import ModelConfig, build_model
from normlab.model.outputs import log_stablemax, stablemax
from normlab.train.optim import build_optimizer, orthograd_
from tests.helpers import run_inproc

def s_ref(x: float) -> float:
    return x + 1 if x >= 0 else 1 / (1 - x)


def ds_ref(x: float) -> float:
    return 1.0 if x >= 0 else 1 / (1 - x) ** 2


def test_stablemax_values_match_the_closed_form():
    x = torch.tensor([[-3.0, -0.5, 0.0, 2.0, 7.25]], dtype=torch.float64)
    s = [s_ref(v) for v in x[0].tolist()]  # 1/4, 2/3, 1, 3, 8.25
    want = torch.tensor([[v / sum(s) for v in s]], dtype=torch.float64)
    torch.testing.assert_close(stablemax(x), want, rtol=1e-14, atol=0)
    torch.testing.assert_close(log_stablemax(x), want.log(), rtol=1e-13, atol=1e-14)
    assert stablemax(x).sum().item() == pytest.approx(1.0, abs=1e-15)


def test_stablemax_cross_entropy_gradient_matches_the_closed_form():
    """d/dz_k [-log StableMax(z)_y] = -s'(z_y)/s(z_y) [k = y] + s'(z_k) / sum_j s(z_j)."""
    g = torch.Generator().manual_seed(0)
    for y in range(6):
        z = (torch.randn(6, dtype=torch.float64, generator=g) * 3).requires_grad_()
        loss = -log_stablemax(z)[y]
        loss.backward()
        zs = z.detach().tolist()
        total = sum(s_ref(v) for v in zs)
        want = [ds_ref(v) / total - (ds_ref(v) / s_ref(v) if k == y else 0.0) for k, v in enumerate(zs)]
        torch.testing.assert_close(z.grad, torch.tensor(want, dtype=torch.float64), rtol=1e-12, atol=1e-14)


def test_stablemax_limits_and_continuity():
    # s is continuous with a continuous first derivative at 0
    eps = 1e-9
    assert s_ref(eps) == pytest.approx(1.0, abs=1e-8) and 1 / (1 + eps) == pytest.approx(1.0, abs=1e-8)
    x = torch.tensor([-eps, eps], dtype=torch.float64, requires_grad=True)
    log_stablemax(x).sum().backward()  # no NaN from the branch not taken
    assert torch.isfinite(x.grad).all()
    # a margin M: softmax rounds the top probability to exactly 1 in float32 long before StableMax does
    V = 16
    for M in (30.0, 1e3, 1e5):
        z = torch.zeros(V)
        z[0] = M
        assert torch.softmax(z, -1)[0].item() == 1.0
        p = stablemax(z)[0].item()
        assert p < 1.0
        assert p == pytest.approx((M + 1) / (M + 1 + (V - 1)), rel=1e-6)  # -> 1 only like 1 - (V-1)/M
    # large negative logits decay like 1/|x| (not exponentially): s(-1e6) * 1e6 -> 1
    z = torch.tensor([0.0, -1e6], dtype=torch.float64)
    assert stablemax(z)[1].item() * 1e6 == pytest.approx(1.0, rel=1e-5)


def test_model_output_stablemax_is_log_stablemax_of_the_softmax_models_logits():
    kw = {"vocab_size": 40, "context": 12, "width": 32, "depth": 2, "heads": 4, "logit_softcap": 5.0}
    torch.manual_seed(0)
    a = build_model(ModelConfig(**kw)).double().eval()
    torch.manual_seed(0)
    b = build_model(ModelConfig(output="stablemax", **kw)).double().eval()
    x = torch.randint(0, 40, (2, 12))
    raw, out = a(x), b(x)
    torch.testing.assert_close(torch.softmax(out, -1), stablemax(raw), rtol=1e-12, atol=1e-14)
    y = torch.randint(0, 40, (2, 12))
    _, loss = b(x, y)  # the model's cross-entropy is the StableMax cross-entropy
    want = -stablemax(raw).gather(-1, y[..., None]).log().mean()
    assert loss.item() == pytest.approx(want.item(), rel=1e-6)  # GPT.forward scores in float32


def test_unknown_output_is_one_line():
    with pytest.raises(NormlabError, match=r"model.output .sparsemax.*allowed: softmax, stablemax"):
        ModelConfig(output="sparsemax").validate()


# ---------------------------------------------------------------- perp-Grad
def test_orthograd_removes_the_weight_direction_and_keeps_the_norm():
    g = torch.Generator().manual_seed(1)
    p = torch.nn.Parameter(torch.randn(5, 3, dtype=torch.float64, generator=g))
    grad = torch.randn(5, 3, dtype=torch.float64, generator=g) + 0.7 * p.detach()
    p.grad = grad.clone()
    orthograd_([p])
    w, gv = p.detach().flatten(), grad.flatten()
    perp = gv - (w @ gv) / (w @ w) * w  # the paper's definition
    want = perp * gv.norm() / perp.norm()  # the authors' OrthoGrad keeps the norm
    torch.testing.assert_close(p.grad.flatten(), want, rtol=1e-12, atol=1e-14)
    assert abs(float(p.grad.flatten() @ w)) < 1e-12


def test_perp_grad_option_projects_before_the_optimizer_step():
    torch.manual_seed(0)
    model = build_model(ModelConfig(vocab_size=20, context=8, width=16, depth=1, heads=2))
    opt, _ = build_optimizer(model, TrainConfig(lr=1e-2), OptimConfig(perp_grad=True))
    x = torch.randint(0, 20, (2, 8))
    _, loss = model(x, x)
    loss.backward()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    opt.step()
    name = next(n for n in grads if n.endswith("qkv.weight"))
    p = dict(model.named_parameters())[name]
    # the hook replaced the gradient by its projection on the weights *before* the step
    wv, gv = before[name].flatten().double(), grads[name].flatten().double()
    perp = gv - (wv @ gv) / (wv @ wv) * wv
    torch.testing.assert_close(p.grad.flatten().double(), perp * gv.norm() / perp.norm(), rtol=1e-5, atol=1e-9)


# ---------------------------------------------------------------- Softmax Collapse
def margin_logits(margin: float, V: int = 8, n: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    z = torch.zeros(n, V, dtype=torch.float64)
    z[:, 3] = margin
    return z, torch.full((n,), 3)


def test_collapse_detector_fires_in_float32_and_not_in_float64():
    # margin 20: exp(-20) * 7 = 1.4e-8 < 2^-24 (float32 rounds 1 + that to 1), > 2^-53 (float64 does not)
    z, y = margin_logits(20.0)
    assert collapse_fractions(z, y, dtype=torch.float32)["softmax_collapse"] == 1.0
    assert collapse_fractions(z, y, dtype=torch.float64)["softmax_collapse"] == 0.0
    # the float32 cross-entropy gradient at the target is exactly 0 there (what "collapse" means)
    zf = z.float().requires_grad_()
    F.cross_entropy(zf, y).backward()
    assert (zf.grad[:, 3] == 0).all()
    # a margin of 10 does not collapse in float32 either
    assert collapse_fractions(*margin_logits(10.0))["softmax_collapse"] == 0.0
    # a confidently wrong prediction: its softmax is one-hot (a collapse as the authors count it, the default rule),
    # but its target probability is 0, not 1, and its gradient is large (not counted by rule target_prob)
    z, _ = margin_logits(20.0)
    wrong = torch.zeros(5, dtype=torch.int64)
    assert collapse_fractions(z, wrong)["softmax_collapse"] == 1.0
    assert collapse_fractions(z, wrong, rule="target_prob")["softmax_collapse"] == 0.0


def test_logits_beyond_the_float32_exp_range():
    z, y = margin_logits(120.0)  # exp(-120) underflows in float32 (floor -103.28), not in float64 (-745)
    assert FP32_EXP_FLOOR == pytest.approx(-103.2789, abs=1e-4)
    assert collapse_fractions(z, y)["logits_beyond_exp"] == pytest.approx(7 / 8)
    assert collapse_fractions(z, y, dtype=torch.float64)["logits_beyond_exp"] == 0.0
    assert collapse_fractions(*margin_logits(100.0))["logits_beyond_exp"] == 0.0


def test_stablemax_does_not_collapse_where_softmax_does():
    z, y = margin_logits(20.0)
    assert collapse_fractions(log_stablemax(z), y)["softmax_collapse"] == 0.0
    assert collapse_fractions(log_stablemax(margin_logits(1e5)[0]), y)["softmax_collapse"] == 0.0


def test_training_diagnostics_record_the_collapse_fractions():
    torch.manual_seed(0)
    model = build_model(ModelConfig(vocab_size=20, context=8, width=16, depth=1, heads=2))
    diag = TrainDiagnostics(model, DiagConfig(every=1))
    x = torch.randint(0, 20, (3, 8))
    logits = torch.zeros(3, 8, 20)
    logits[0, :, 0] = 40.0  # one sequence of 3 collapses on target 0
    y = torch.zeros(3, 8, dtype=torch.int64)
    diag.start_step(0)
    out = model(x)
    diag.observe_output(logits, y)
    out.sum().backward()
    diag.after_backward(0, 1.0)
    rec = diag.collect()
    assert rec["diag/softmax_collapse"] == pytest.approx(1 / 3)
    assert rec["diag/logits_beyond_exp"] == 0.0
    off = TrainDiagnostics(model, DiagConfig(every=2))
    off.start_step(0)  # not a diagnostic step: nothing is counted or recorded
    off.observe_output(logits, y)
    off.after_backward(0, 1.0)
    assert "diag/softmax_collapse" not in off.collect()


def test_hf_export_refuses_stablemax_in_one_line():
    from normlab.interop.arch import hf_arch

    cfg = ModelConfig(norm="rmsnorm", activation="swiglu", positions="rope", output="stablemax").validate()
    with pytest.raises(NormlabError, match="model.output 'stablemax'"):
        hf_arch(cfg)
    assert hf_arch(ModelConfig(norm="rmsnorm", activation="swiglu", positions="rope").validate())


# ---------------------------------------------------------------- output options wired into model and loop
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
