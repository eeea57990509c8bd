"""normlab.diagnostics.streams: the composite residual mapping's gain (mHC's Amax gain magnitude) against closed
forms, and the training-time probe against the product of a static model's H_res read from its parameters."""

from __future__ import annotations

import pytest
import torch

from normlab.config import DiagConfig
from normlab.diagnostics.streams import StreamGainProbe, composite_gain
from normlab.diagnostics.training import TrainDiagnostics
from normlab.model import ModelConfig, build_model
from normlab.model.streams import sinkhorn_knopp


def test_composite_gain_closed_form():
    # doubly stochastic layers: product doubly stochastic, gains 1; a scaled identity 1.5 per layer over 4 layers:
    # 1.5^4; a rank-one [[1, 1], [0, 0]]: row sums 2 (forward), column sums 1 (backward)
    ds = [sinkhorn_knopp(torch.randn(3, 3, 3, generator=torch.Generator().manual_seed(i)), 300) for i in range(6)]
    g = composite_gain(ds)
    assert g["fwd"] == pytest.approx(1.0, abs=1e-5) and g["bwd"] == pytest.approx(1.0, abs=1e-5)
    g = composite_gain([1.5 * torch.eye(2)] * 4)
    assert g == {"fwd": pytest.approx(1.5 ** 4), "bwd": pytest.approx(1.5 ** 4)}
    g = composite_gain([torch.tensor([[1.0, 1.0], [0.0, 0.0]])])
    assert g == {"fwd": 2.0, "bwd": 1.0}
    # order matters: P = H2 @ H1 (H1 applied first)
    h1, h2 = torch.tensor([[1.0, 0.0], [1.0, 0.0]]), torch.tensor([[0.0, 3.0], [0.0, 0.0]])
    assert composite_gain([h1, h2]) == {"fwd": 3.0, "bwd": 3.0}
    assert composite_gain([h2, h1]) == {"fwd": 3.0, "bwd": 6.0}



def test_probe_reads_the_product_of_static_maps():
    """Static HC: H_res = static_alpha[:, 1:]^T for every token, so the composite is the product of the parameters."""
    torch.manual_seed(0)
    m = build_model(ModelConfig(vocab_size=32, context=8, width=16, depth=3, heads=2, residual="hc", streams=3,
                                hc_dynamic=False))
    with torch.no_grad():
        for p in m.parameters():
            if p.shape == (3, 4):  # static_alpha
                p.add_(0.4 * torch.randn_like(p))
    mats = [c.static_alpha[:, 1:].T.detach() for blk in m.blocks for c in (blk.attn_hc, blk.mlp_hc)]
    p_ = mats[0]
    for h in mats[1:]:
        p_ = h @ p_
    probe = StreamGainProbe(m)
    probe.attach()
    m(torch.randint(0, 32, (2, 8)))
    probe.detach()
    got = probe.read()
    assert got["diag/hc_gain_fwd"] == pytest.approx(p_.abs().sum(1).max().item(), rel=1e-6)
    assert got["diag/hc_gain_bwd"] == pytest.approx(p_.abs().sum(0).max().item(), rel=1e-6)
    assert got["diag/hc_gain_fwd"] > 1.5  # the perturbed product is far from 1: the check can fail
    assert probe.read() == {}  # read resets


def test_training_diagnostics_record_the_gain_for_stream_models_only():
    torch.manual_seed(0)
    for residual, expect in (("mhc", True), ("add", False), ("ngpt", False)):
        ngpt = dict(norm="none", tie_embeddings=False) if residual == "ngpt" else {}
        m = build_model(ModelConfig(vocab_size=32, context=8, width=16, depth=4, heads=2, residual=residual, **ngpt))
        diag = TrainDiagnostics(m, DiagConfig(every=1))
        diag.start_step(0)
        _, loss = m(torch.randint(0, 32, (2, 8)), torch.randint(0, 32, (2, 8)))
        loss.backward()
        diag.after_backward(0, float(loss.detach()))
        rec = diag.collect()
        assert ("diag/hc_gain_fwd" in rec) == expect and ("diag/hc_gain_bwd" in rec) == expect
        if expect:  # mHC: column sums exactly 1 after Sinkhorn's last step, row sums 1 up to its convergence
            assert rec["diag/hc_gain_bwd"] == pytest.approx(1.0, abs=1e-5)
            assert rec["diag/hc_gain_fwd"] == pytest.approx(1.0, abs=1e-2)
