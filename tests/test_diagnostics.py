"""Diagnostics (normlab.diagnostics, normlab diagnose): each statistic against a hand-built case with a known answer."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from normlab.config import DiagConfig
from normlab.diagnostics import (
    AttentionUnavailable, SpikeDetector, TrainDiagnostics, angular_distance, attention_probs, detect_spikes,
    diagnose_model, log_slope, massive_by_block, norm_parameter_stats, sink_analysis, sink_stats, skip_losses,
    token_importance, variance_by_depth,
)
from normlab.diagnostics.capture import capture_stream
from normlab.model import ModelConfig, build_model
from tests.helpers import run_inproc


pytestmark = pytest.mark.usefixtures("one_thread")


def no_hooks(model: nn.Module) -> bool:
    return all(not m._forward_hooks and not m._forward_pre_hooks and not m._backward_hooks
               for m in model.modules())


def small(**kw) -> nn.Module:
    torch.manual_seed(0)
    cfg = dict(vocab_size=16, context=32, width=32, depth=3, heads=4)
    cfg.update(kw)
    return build_model(ModelConfig(**cfg))


def randidx(B=3, T=20, V=16, seed=1) -> torch.Tensor:
    return torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------------------------------- layer effectiveness


def test_angular_distance_known_pairs():
    x = torch.tensor([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0], [1.0, 1.0]])
    assert angular_distance(x[:1], torch.tensor([[0.0, 1.0]])) == pytest.approx(0.5)
    assert angular_distance(x[:1], torch.tensor([[-3.0, 0.0]])) == pytest.approx(1.0)
    assert angular_distance(x[:1], torch.tensor([[2.0, 0.0]])) == pytest.approx(0.0, abs=1e-12)
    y = torch.tensor([[0.0, 1.0], [-1.0, 0.0], [5.0, 0.0], [1.0, 0.0]])  # 1/2, 1, 0, 1/4 -> mean 7/16
    assert angular_distance(x, y) == pytest.approx(7 / 16)


def test_identity_blocks_have_zero_distance_and_zero_skip_cost():
    model = small(residual_scale="learnable")  # ReZero/SkipInit: branch scalars 0 at init -> blocks are identity
    idx, tgt = randidx(), randidx(seed=2)
    res = diagnose_model(model, idx, tgt, sink_context=16)
    for b in res["layer_effectiveness"]["blocks"]:
        assert b["angular_distance"] == pytest.approx(0.0, abs=1e-7)
        assert b["skip_loss_increase"] == 0.0
    assert res["variance"]["log_var_slope"] == pytest.approx(0.0, abs=1e-12)
    assert no_hooks(model)
    # a normal block does change the stream, and skipping a trained-or-not block changes the loss
    model = small()
    res = skip_losses(model, idx, tgt)
    assert all(d != 0.0 for d in res["skip_loss_increase"])
    assert no_hooks(model)


# ---------------------------------------------------------------------------------------- massive activations


@pytest.mark.parametrize("value,flagged", [(5000.0, True), (50.0, False)])
def test_planted_massive_activation_is_found(value, flagged):
    model = small(residual_scale="learnable")  # identity blocks: every block output = token embeddings
    idx = torch.tensor([[1, 2, 3, 4, 5, 6], [1, 2, 3, 9, 5, 6], [7, 7, 7, 7, 7, 7]])
    with torch.no_grad():
        model.tok_emb.weight[9, 11] = value  # token 9 occurs once: sequence 1, position 3
    hidden = capture_stream(model, idx).hidden
    res = massive_by_block(hidden)
    a = np.abs(model.tok_emb.weight.detach().double().numpy()[idx.numpy()]).ravel()
    lower_median = np.sort(a)[(a.size - 1) // 2]  # torch.median's convention (lower middle value), as the paper's code
    for b in res["blocks"]:
        assert b["top"][0] == {"value": pytest.approx(value), "seq": 1, "pos": 3, "channel": 11}
        assert b["median"] == pytest.approx(lower_median)
        assert b["ratio"] == pytest.approx(value / lower_median)
        assert b["flagged"] is flagged and b["n_massive"] == int(flagged)
        assert len(b["top"]) == 3 and b["top"][1]["value"] <= b["top"][0]["value"]
    assert res["any_flagged"] is flagged


# ---------------------------------------------------------------------------------------- attention sinks


def test_token_importance_formula():
    A = torch.tensor([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.2, 0.3, 0.5]])
    # key k: sum over queries / (T - k): (1 + .5 + .2)/3, (.5 + .3)/2, .5/1
    torch.testing.assert_close(token_importance(A), torch.tensor([1.7 / 3, 0.4, 0.5]))


def test_planted_sink_is_found():
    """Every query's q has a large component along a key direction only token 0 has -> all attend to token 0."""
    model = small(positions="learned", norm="none", bias=True, residual_scale="learnable", depth=2, heads=2, width=16)
    d, H = 16, 2
    hd = d // H
    with torch.no_grad():
        model.tok_emb.weight[:, 0] = 0.0
        model.pos_emb.weight.zero_()
        model.pos_emb.weight[0, 0] = 1.0  # channel 0 marks position 0
        for b in model.blocks:
            b.attn.qkv.weight.zero_()
            b.attn.qkv.bias.zero_()
            for h in range(H):
                b.attn.qkv.bias[h * hd] = 10.0  # q: constant
                b.attn.qkv.weight[d + h * hd, 0] = 10.0  # k: reads the position-0 marker
    idx = randidx(B=4, T=32)
    A = attention_probs(model, idx)
    assert A.shape == (2, 4, 2, 32, 32)
    torch.testing.assert_close(A.sum(-1), torch.ones(2, 4, 2, 32, dtype=A.dtype))
    assert float(A[..., 0].min()) > 0.999
    s = sink_stats(A)
    assert s["sink_rate"] == 1.0 and s["sink_rate_per_layer"] == [1.0, 1.0]
    assert np.allclose(s["first_token_importance"], 1.0, atol=1e-3)
    assert no_hooks(model)


def test_attention_probs_reproduce_rope_attention_and_no_sink_at_uniform():
    model = small()  # RoPE softmax attention, random init: recomputation must reproduce each module's output
    A = attention_probs(model, randidx(T=24))
    assert A.shape == (3, 3, 4, 24, 24)
    assert float(A.triu(1).abs().max()) == 0.0
    torch.testing.assert_close(A.sum(-1), torch.ones(A.shape[:-1], dtype=A.dtype))
    # uniform causal attention: first-token importance = H_T / T (harmonic number), below 0.3 at T = 64
    T = 64
    U = torch.tril(torch.ones(T, T)) / torch.arange(1, T + 1)[:, None]
    s = sink_stats(U.expand(1, 2, 1, T, T).double())
    assert s["first_token_importance"][0][0] == pytest.approx(sum(1 / i for i in range(1, T + 1)) / T)
    assert s["sink_rate"] == 0.0
    assert no_hooks(model)


def test_sinks_unavailable_with_reason():
    class Linear(nn.Module):  # no T x T probability matrix
        def forward(self, x):
            return x * 0

    model = small()
    model.blocks[1].attn = Linear()
    s = sink_analysis(model, randidx())
    assert s["available"] is False and "block 1" in s["reason"] and "probability matrix" in s["reason"]
    assert no_hooks(model)

    model = small()  # a softmax variant with an option the recomputation does not know (here: output x 2)
    attn = model.blocks[0].attn
    orig = attn.forward
    attn.forward = lambda x: 2 * orig(x)
    with pytest.raises(AttentionUnavailable, match="does not reproduce"):
        attention_probs(model, randidx())
    assert no_hooks(model)

    model = small()  # ... the module's own attention_probs(x) is what is used
    attn = model.blocks[0].attn
    attn.attention_probs = lambda x: type(attn).attention_probs(attn, x)
    assert sink_analysis(model, randidx())["available"] is True


@pytest.mark.parametrize("kw", [dict(qk_norm=True), dict(attn_softcap=3.0, positions="alibi"), dict(positions="none"),
                                dict(attention="softplus"), dict(attention="softplus", lssa_reweight=True),
                                dict(attention="linear"), dict(attention="nala")])
def test_sinks_for_attention_kinds(kw):
    """Softmax options and softplus: probabilities that reproduce each module's output; linear kinds: a reason."""
    s = sink_analysis(small(**kw), randidx(T=24))
    if kw.get("attention") in ("linear", "nala"):
        assert s["available"] is False and "no T x T probability matrix" in s["reason"]
    else:
        assert s["available"] is True and s["attention"] == [kw.get("attention", "softmax")]
        assert 0.0 <= s["sink_rate"] <= 1.0


# ---------------------------------------------------------------------------------------- variance with depth


def test_variance_slope_of_hand_built_stream():
    z = torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(0))
    hidden = [z * 2.0**j for j in range(5)]  # variance x4 per block
    v = variance_by_depth(hidden)
    zv = float(z.double().square().mean() - z.double().mean() ** 2)
    assert v["var"] == pytest.approx([zv * 4.0**j for j in range(5)])
    assert v["log_var_slope"] == pytest.approx(math.log(4.0))
    assert v["var_growth_per_block"] == pytest.approx(4.0)
    assert v["log_var_slope_blocks"] == pytest.approx(math.log(4.0))
    assert v["log_rms_slope"] == pytest.approx(math.log(2.0), rel=0.05)  # rms includes the (small) mean
    assert log_slope([1.0, math.e, math.e**2, math.e**3]) == pytest.approx(1.0)
    assert log_slope([3.0, 1.0, 3.0]) == pytest.approx(0.0)  # least squares, not end points
    assert log_slope([1.0]) is None


# ---------------------------------------------------------------------------------------- norm parameter stats


def test_norm_parameter_stats():
    model = small(norm="dyt", norm_options={"alpha_init@attn": 0.8})
    with torch.no_grad():
        model.blocks[0].attn_in.weight.copy_(torch.arange(32.0))
    st = norm_parameter_stats(model)
    assert set(st) == {f"blocks.{l}.{s}" for l in range(3) for s in ("attn_in", "mlp_in")} | {"final_norm"}
    w = st["blocks.0.attn_in"]["weight"]
    assert (w["mean"], w["min"], w["max"], w["q50"]) == (15.5, 0.0, 31.0, 15.5)
    assert w["std"] == pytest.approx(float(torch.arange(32.0).std()))
    assert st["blocks.0.attn_in"]["alpha"] == pytest.approx(0.8)
    assert st["blocks.0.mlp_in"]["alpha"] == pytest.approx(0.5)
    bn = norm_parameter_stats(small(norm="batchnorm"))["final_norm"]
    assert bn["buffers"]["running_var"]["mean"] == 1.0 and bn["buffers"]["running_mean"]["max"] == 0.0
    rms = norm_parameter_stats(small(norm="rmsnorm", norm_options={"unit_offset": True}))["final_norm"]
    assert rms["weight"]["mean"] == 0.0 and rms["gain"]["mean"] == 1.0  # applied gain is 1 + w


# ---------------------------------------------------------------------------------------- loss spikes


def test_spike_detection_on_synthetic_losses():
    losses = [1.0] * 25 + [2.5] + [1.0] * 5 + [1.9] + [1.0] * 20 + [float("nan")]
    assert detect_spikes(losses, factor=2.0, window=20) == [25, 52]
    assert detect_spikes([5.0, 100.0], factor=2.0, window=20) == []  # no full window yet
    rng = np.random.default_rng(0)
    seq = list(3.0 + 0.1 * rng.standard_normal(300))
    for i in (40, 41, 150, 299):
        seq[i] *= 3
    ref = detect_spikes(seq, 2.0, 20)
    det = SpikeDetector(2.0, 20)
    for i, l in enumerate(seq[:100]):
        det.update(i, l)
    resumed = SpikeDetector(2.0, 20)  # checkpoint round trip through JSON
    resumed.load_state_dict(json.loads(json.dumps(det.state_dict())))
    for i, l in enumerate(seq[100:], start=100):
        resumed.update(i, l)
    assert resumed.summary() == {"count": len(ref), "steps": ref} and ref[:3] == [40, 41, 150]


# ---------------------------------------------------------------------------------------- training-time stats


def test_training_stats_match_a_separate_forward():
    model = small(placement="peri")  # embed norm, input and output norms, final norm
    model.train()
    diag = TrainDiagnostics(model, DiagConfig(every=3))
    idx, tgt = randidx(), randidx(seed=2)
    diag.start_step(0)  # not a diagnostic step: nothing registered, nothing recorded
    assert no_hooks(model)
    diag.after_backward(0, 1.0)
    assert diag.collect() == {}
    diag.start_step(2)  # (2 + 1) % 3 == 0
    assert not no_hooks(model)
    model(idx, tgt)[1].backward()
    diag.after_backward(2, 1.0)
    assert no_hooks(model)
    rec = diag.collect()
    assert rec["step"] == 3

    with torch.no_grad():  # the same forward by hand
        x = model.embed_norm(model.tok_emb(idx))
        h = [x]
        norm_out = {"embed_norm": x, "blocks.0.attn_in": model.blocks[0].attn_in(x)}
        for b in model.blocks:
            x = b(x)
            h.append(x)
        norm_out["final_norm"] = model.final_norm(x)
        norm_out["blocks.1.mlp_out"] = model.blocks[1].mlp_out(model.blocks[1].mlp(model.blocks[1].mlp_in(
            h[1] + model.blocks[1].attn_out(model.blocks[1].attn(model.blocks[1].attn_in(h[1]))))))

    def rms(t):
        return float(t.double().square().mean().sqrt())

    assert rec["diag/embed_rms"] == pytest.approx(rms(h[0]), rel=1e-6)
    for l in range(3):
        assert rec[f"diag/resid_rms/{l}"] == pytest.approx(rms(h[l + 1]), rel=1e-6)
        t = h[l + 1].double()
        assert rec[f"diag/resid_var/{l}"] == pytest.approx(float(t.var(unbiased=False)), rel=1e-6)
        for part in ("attn", "mlp"):
            g = torch.cat([p.grad.reshape(-1) for p in getattr(model.blocks[l], part).parameters()])
            assert rec[f"diag/grad_norm/{part}/{l}"] == pytest.approx(float(g.double().norm()), rel=1e-6)
        g = torch.cat([p.grad.reshape(-1) for s in ("attn_in", "attn_out", "mlp_in", "mlp_out")
                       for p in getattr(model.blocks[l], s).parameters()])
        assert rec[f"diag/grad_norm/norm/{l}"] == pytest.approx(float(g.double().norm()), rel=1e-6)
    for name, t in norm_out.items():
        assert rec[f"diag/norm_rms/{name}"] == pytest.approx(rms(t), rel=1e-6)
    assert rec["diag/grad_norm/final_norm"] == pytest.approx(
        float(torch.cat([p.grad.reshape(-1) for p in model.final_norm.parameters()]).norm()), rel=1e-6)
    assert "diag/loss_spike" not in rec


# ---------------------------------------------------------------------------------------- end to end


STEPS = ["--set", "train.steps=12", "--set", "train.eval_every=12", "--set", "train.log_every=4",
         "--set", "train.checkpoint_every=12", "--set", "train.threads=1"]


def test_training_records_and_diagnose_command(tmp_path, cache):
    from safetensors.torch import load_file

    on, off = tmp_path / "on", tmp_path / "off"
    run_inproc("train", "tiny", *STEPS, "--set", "diag.every=4", "--out", str(on), cache=cache, check=True)
    run_inproc("train", "tiny", *STEPS, "--set", "diag.every=0", "--out", str(off), cache=cache, check=True)
    wa, wb = load_file(str(on / "model.safetensors")), load_file(str(off / "model.safetensors"))
    assert all(torch.equal(wa[k], wb[k]) for k in wa), "diagnostics changed the training"
    recs = [json.loads(l) for l in (on / "metrics.jsonl").read_text().splitlines()]
    diag = [r for r in recs if "diag/resid_rms/0" in r]
    assert [r["step"] for r in diag] == [4, 8, 12]
    assert {"diag/resid_rms/1", "diag/resid_var/1", "diag/norm_rms/final_norm", "diag/grad_norm/attn/1",
            "diag/grad_norm/mlp/0", "diag/grad_norm/norm/0"} <= set(diag[0])
    assert not any(k.startswith("diag/") for l in (off / "metrics.jsonl").read_text().splitlines()
                   for k in json.loads(l))
    assert json.loads((on / "summary.json").read_text())["loss_spikes"] == {"count": 0, "steps": []}

    r = run_inproc("diagnose", str(on), "--sequences", "4", "--json", cache=cache, check=True)
    out = json.loads(r.stdout)  # exactly one JSON object
    assert out == json.loads((on / "diagnostics.json").read_text())
    assert {"variance", "massive", "sinks", "layer_effectiveness", "norm_params", "training"} <= set(out)
    assert len(out["variance"]["var"]) == 3 and out["sinks"]["available"] is True
    assert out["sinks"]["context"] == 64 and len(out["sinks"]["first_token_importance"]) == 2
    assert len(out["layer_effectiveness"]["blocks"]) == 2 and out["training"]["records"] == 3
    names = {"variance_depth.png", "massive_activations.png", "attention_sinks.png", "layer_effectiveness.png",
             "norm_gains.png", "training_curves.png"}
    assert {p.name for p in (on / "diagnostics").iterdir()} == names
    assert all((on / "diagnostics" / n).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for n in names)
    # a run without training-time records gets no training curves; bad input is a one-line error
    run_inproc("diagnose", str(off), "--sequences", "2", "--context", "16", cache=cache, check=True)
    assert not (off / "diagnostics" / "training_curves.png").exists()
    bad = run_inproc("diagnose", str(off), "--sequences", "0", cache=cache)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1
    bad = run_inproc("train", "tiny", "--set", "diag.every=-1", "--out", str(tmp_path / "x"), cache=cache)
    assert bad.returncode == 2 and "diag.every" in bad.stderr


def test_training_plot_says_it_draws_attention_and_mlp_gradient_norms_apart(tmp_path, monkeypatch):
    """The gradient panel plots each block's attention and MLP parts as their own curves (not the per-block norm of
    ``normlab.names.block_grad_norms``), and its title and legend say so."""
    from normlab.diagnostics import plots

    figs = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: figs.append(fig) or Path(path).name)
    recs = [{"step": s, "diag/resid_rms/0": 1.0, "diag/resid_rms/1": 1.5, "diag/norm_rms/blocks.0.attn_in": 1.0,
             **{f"diag/grad_norm/{p}/{l}": (s + 1) * (i + 1) * (l + 2) for i, p in enumerate(("attn", "mlp", "norm"))
                for l in (0, 1)}} for s in (0, 10)]
    plots.plot_training(recs, tmp_path / "t.png")
    ax = figs[0].axes[1]
    title = ax.get_title().lower()
    assert "attention" in title and "mlp" in title  # was "gradient norm per block"
    lines = {ln.get_label(): list(ln.get_ydata()) for ln in ax.get_lines()}
    assert lines == {f"block {l} {part}": [r[f"diag/grad_norm/{key}/{l}"] for r in recs]
                     for l in (0, 1) for part, key in (("attn", "attn"), ("MLP", "mlp"))}


def test_capture_stream_equals_a_manual_forward_through_the_blocks():
    """``capture_stream`` (hooks from ``record_io``): ``hidden[0]`` is what enters block 0 and ``hidden[l + 1]``
    block ``l``'s output, as a hand-run loop over ``model.blocks`` gives them; the logits are the model's; no hook
    is left behind."""
    model = small(depth=3).eval()
    idx = randidx()
    s = capture_stream(model, idx)
    entering = []
    model.blocks[0].register_forward_pre_hook(lambda _m, inp: entering.append(inp[0].detach()))
    logits = model(idx)
    model.blocks[0]._forward_pre_hooks.clear()
    want = [entering[0]]
    for b in model.blocks:
        want.append(b(want[-1]))
    assert len(s.hidden) == 4 and no_hooks(model)
    for got, ref in zip(s.hidden, want):
        torch.testing.assert_close(got, ref, atol=0, rtol=0)
    torch.testing.assert_close(s.logits, logits, atol=0, rtol=0)
