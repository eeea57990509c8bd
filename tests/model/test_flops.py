"""normlab.model.flops: the analytic FLOPs count against torch's FlopCounterMode (matmuls, exactly), nanoGPT's
``6 N + 12 L d T`` and the norms' declared costs; a run's summary records it."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from normlab.model import build_model
from normlab.model.config import ModelConfig
from normlab.model.flops import count_flops
from normlab.norms import get_norm_class, norm_names
from normlab.rundir.readers import open_config

pytestmark = pytest.mark.usefixtures("one_thread")
T = 48


def _reference(cfg: ModelConfig) -> float:
    """FlopCounterMode's matmul + convolution FLOPs per token of the real model on one ``[1, T]`` sequence."""
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    with FlopCounterMode(display=False) as fc, torch.no_grad():
        model(torch.randint(0, cfg.vocab_size, (1, cfg.context)))
    return fc.get_total_flops() / cfg.context


@pytest.mark.parametrize("kw", [
    {"attn_softcap": 50.0},  # softmax on its explicit path (CPU's fused SDPA is not counted by FlopCounterMode)
    {"attn_softcap": 30.0, "qk_norm": True, "activation": "swiglu", "positions": "alibi"},
    {"attention": "softplus"},
    {"attention": "linear", "linear_chunk": 16},
    {"attention": "linear", "linear_chunk": 20, "linear_conv": 4, "linear_gate": "sigmoid"},  # T not a multiple
    {"attention": "nala", "linear_chunk": 16},  # RoPE: the numerator's features differ from the denominator's
    {"attention": "nala", "positions": "none"},
    {"attention": "transnormer", "linear_chunk": 12},
    {"norm": "crmsnorm", "attn_softcap": 50.0},  # the width - 1 residual stream
    {"residual": "ngpt", "norm": "none", "tie_embeddings": False, "attn_softcap": 50.0},  # nGPT: no new matmul
], ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()))
def test_matmul_flops_equal_flop_counter_mode(kw):
    cfg = ModelConfig(vocab_size=97, context=T, width=32, depth=2, heads=4, **kw)
    count = count_flops(cfg)
    assert count.matmul + count.attention == _reference(cfg)
    assert not count.not_counted


def test_fused_sdpa_is_the_attention_term_flop_counter_mode_misses_on_cpu():
    """Default softmax attention runs the fused SDPA kernel, which FlopCounterMode does not count on CPU: the
    difference is exactly the attention term ``2 * 2 * T * T * d`` per layer (per token: ``4 T d L``)."""
    cfg = ModelConfig(vocab_size=97, context=T, width=32, depth=3, heads=4)
    count = count_flops(cfg)
    assert count.attention == 4 * T * 32 * 3
    assert count.matmul == _reference(cfg)


def test_training_matmuls_are_nanogpt_6n_plus_12ldt():
    """nanoGPT's ``estimate_mfu``: ``6 N + 12 L d T`` per token, N = the matrices (tied head counted once, as the
    LM head matmul)."""
    cfg = ModelConfig(vocab_size=101, context=T, width=48, depth=3, heads=6)
    torch.manual_seed(0)
    n = sum(m.weight.numel() for m in build_model(cfg).modules() if isinstance(m, nn.Linear))
    count = count_flops(cfg)
    assert 3 * (count.matmul + count.attention) == 6 * n + 12 * 3 * 48 * T


@pytest.mark.parametrize("norm", norm_names())
def test_norm_flops_are_each_site_times_the_declared_cost(norm):
    """Pre-LN with L blocks has 2 L + 1 norm sites of width d; each costs d * (flops_per_element + one per gain /
    bias vector), as the class declares."""
    cfg = ModelConfig(vocab_size=64, context=16, width=32, depth=2, heads=4, norm=norm)
    cls = get_norm_class(norm)
    assert cls.flops_per_element is not None, f"norm '{norm}' declares no flops_per_element"
    m = build_model(cfg).blocks[0].attn_in
    d = cfg.width - 1 if cls.compressed_stream else cfg.width
    affine = (getattr(m, "weight", None) is not None) + (getattr(m, "bias", None) is not None)
    assert count_flops(cfg).norms == 5 * d * (cls.flops_per_element + affine)


def test_rmsnorm_is_cheaper_than_layernorm_and_peri_adds_two_norms_per_block_and_the_embedding_norm():
    base = dict(vocab_size=64, context=16, width=32, depth=4, heads=4)
    ln, rms = count_flops(ModelConfig(**base)), count_flops(ModelConfig(**base, norm="rmsnorm"))
    peri = count_flops(ModelConfig(**base, placement="peri"))
    assert rms.norms < ln.norms and rms.matmul == ln.matmul
    assert peri.norms - ln.norms == (2 * 4 + 1) * 32 * (5 + 2)


def test_a_run_summary_records_flops_and_wall_time_per_token(run):
    s = json.loads((run / "summary.json").read_text())
    cfg = open_config(run).model
    assert s["flops_per_token"] == count_flops(cfg).training
    assert s["wall_s_per_token"] == pytest.approx(s["elapsed_s"] / s["tokens_seen"])


@pytest.mark.parametrize("kw", [
    {"residual": "hc", "streams": 4},
    {"residual": "hc", "streams": 3, "hc_dynamic": False},
    {"residual": "mhc", "streams": 4, "sinkhorn_iters": 5},
    {"residual": "mhc", "streams": 2, "placement": "peri", "activation": "swiglu"},
], ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()))
def test_stream_connections_matmul_flops_equal_flop_counter_mode(kw):
    """Hyper-connections add the stream mixing ``[n + 1, n] @ [n, d]`` and the dynamic maps' ``[n, d] @ [d, n + 1]``
    and ``[n, d] @ [d]`` per connection: the whole model's matmuls equal FlopCounterMode's exactly."""
    cfg = ModelConfig(vocab_size=97, context=T, width=32, depth=2, heads=4, attn_softcap=50.0, **kw)
    count = count_flops(cfg)
    assert count.matmul + count.attention == _reference(cfg)
    base = count_flops(ModelConfig(vocab_size=97, context=T, width=32, depth=2, heads=4, attn_softcap=50.0,
                                   **{k: v for k, v in kw.items() if k not in ("residual", "streams", "hc_dynamic",
                                                                                "sinkhorn_iters")}))
    n, d, conns = kw["streams"], 32, 4
    per = 2 * (n + 1) * n * d + (2 * n * d * (n + 1) + 2 * n * d if kw.get("hc_dynamic", True) else 0)
    assert count.matmul - base.matmul == conns * per  # written out: what the connections add
    assert count.elementwise > base.elementwise and not count.not_counted


def test_ngpt_counts_its_normalisations_and_scalings():
    """nGPT adds no matmul; per token it adds per connection 3 unit normalisations and the update (11 d), the
    scaled q/k (10 d per block), s_u / s_v (one multiply per MLP pre-activation) and s_z (one per logit)."""
    kw = dict(vocab_size=97, context=T, width=32, depth=2, heads=4, norm="none", tie_embeddings=False)
    ngpt, plain = count_flops(ModelConfig(**kw, residual="ngpt")), count_flops(ModelConfig(**kw))
    d, L, hidden = 32, 2, 128
    assert ngpt.matmul == plain.matmul and ngpt.attention == plain.attention
    assert ngpt.elementwise - plain.elementwise == 2 * L * 11 * d + L * 10 * d + L * hidden + 97
