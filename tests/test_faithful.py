"""Issue 16: claims that test what the papers claim -- the recipes' models, LINA's input convolution, the authors'
massive-activation statistic, run fingerprints, and the rebuilt initialisation the Peri-LN growth metric uses."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from tests.helpers import run_inproc

torch.set_num_threads(1)


# ------------------------------------------------------------------------------------------------ recipes
def _build(variant: str, budget: str = "quick"):
    from normlab.config import config_from_dict
    from normlab.experiments.claims.budgets import get_budget
    from normlab.experiments.claims.variants import variant_config
    from normlab.model import build_model

    cfg = config_from_dict(variant_config(variant, get_budget(budget), 0))
    torch.manual_seed(0)
    return cfg, build_model(cfg.model)


def test_dyt_recipe_builds_an_untied_head_and_the_authors_dyt():
    """The DyT claim's model is the authors' LLaMA recipe: untied LM head, DyT without bias, alpha 0.8 / 0.2 / 0.2
    at attention input / MLP input / final, a learnable embedding scalar starting at sqrt(4096) = 64."""
    from normlab.norms.simple import DyT

    cfg, m = _build("dyt")
    assert cfg.model.tie_embeddings is False
    assert m.lm_head.weight is not m.tok_emb.weight
    assert m.lm_head.weight.data_ptr() != m.tok_emb.weight.data_ptr()
    assert isinstance(m.embed_scale, nn.Parameter) and m.embed_scale.item() == 64.0
    blk = m.blocks[0]
    alphas = {site: getattr(blk, site).alpha.item() for site in ("attn_in", "mlp_in")}
    assert alphas == pytest.approx({"attn_in": 0.8, "mlp_in": 0.2})
    assert isinstance(m.final_norm, DyT) and m.final_norm.alpha.item() == pytest.approx(0.2)
    assert all(getattr(b, s).bias is None for b in m.blocks for s in ("attn_in", "mlp_in")) and m.final_norm.bias is None
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


# ------------------------------------------------------------------------------------ LINA input convolution
def _lina(conv_source: str, seed: int = 0):
    from normlab.attention.linear import LinearAttention

    torch.manual_seed(seed)
    return LinearAttention(16, 2, conv=4, conv_source=conv_source).double()


def test_lina_input_conv_is_causal_and_convolves_the_input():
    """Future tokens do not change past outputs; the branch is conv1d of the attention input x (left-padded with
    K-1 zeros), i.e. out = proj(attention(x) + conv(x)), checked against the attention without the branch."""
    att = _lina("input")
    x = torch.randn(3, 10, 16, dtype=torch.float64)
    y = att(x)
    x2 = x.clone()
    x2[:, 6:] = torch.randn(3, 4, 16, dtype=torch.float64) * 5
    y2 = att(x2)
    assert torch.equal(y[:, :6], y2[:, :6]) and not torch.allclose(y[:, 6:], y2[:, 6:])
    # reference: the same module without its conv, plus proj(conv of x) computed by hand
    conv = att.conv
    att.conv = None
    base = att(x)
    att.conv = conv
    K = conv.kernel_size[0]
    w, b = conv.weight[:, 0, :], conv.bias  # [C, K], [C]
    xp = torch.cat([x.new_zeros(3, K - 1, 16), x], dim=1)
    local = torch.stack([(xp[:, t:t + K, :] * w.T).sum(1) + b for t in range(10)], dim=1)
    assert torch.allclose(y, base + local @ att.proj.weight.T, atol=1e-12)
    # the value conv is a different map of the same shapes
    val = _lina("value")
    val.load_state_dict({k: v for k, v in att.state_dict().items() if k != "conv.bias"}, strict=False)
    assert not torch.allclose(val(x), y)


def test_lina_input_conv_generation_matches_the_full_forward():
    from normlab.model import GPT, ModelConfig

    torch.manual_seed(0)
    m = GPT(ModelConfig(vocab_size=32, context=16, width=16, depth=2, heads=2, attention="linear", linear_conv=3,
                        linear_conv_source="input")).double().eval()
    idx = torch.randint(0, 32, (2, 12))
    full = m(idx)
    state = m.init_state(2)
    parts = []
    for a, b in ((0, 5), (5, 6), (6, 12)):
        out, state = m.step(idx[:, a:b], state)
        parts.append(out)
    assert torch.allclose(torch.cat(parts, 1), full, atol=1e-10)


def test_linear_conv_source_needs_a_kernel(tmp_path):
    from tests.helpers import assert_bad_input

    assert_bad_input(run_inproc("train", "tiny", "--set", "model.attention=linear", "--set",
                                "model.linear_conv_source=input", "--out", str(tmp_path / "r"), cache=tmp_path / "c"),
                     "linear_conv")
    p = run_inproc("train", "tiny", "--set", "model.attention=linear", "--set", "model.linear_conv=2", "--set",
                   "model.linear_conv_source=keys", "--out", str(tmp_path / "r2"), cache=tmp_path / "c")
    assert_bad_input(p, "linear_conv_source")


# ------------------------------------------------------------------------------------- massive activations
def test_massive_per_sequence_is_the_authors_mean_over_sequences():
    """Per sequence: top-3 of |h| over tokens and channels and torch.median(|h|), then np.mean over sequences
    (locuslab/massive-activations main_llm.py --exp2 + plot_layer_ax), against a plain numpy loop."""
    from normlab.diagnostics.massive import massive_by_block, per_sequence

    g = torch.Generator().manual_seed(0)
    h = torch.randn(4, 6, 5, generator=g, dtype=torch.float64)
    h[2, 3, 1] = 40.0  # one massive entry in one sequence
    cols = []
    for s in range(4):
        a = np.abs(h[s].numpy()).ravel()
        srt = np.sort(a)[::-1]
        med = np.sort(a)[(a.size - 1) // 2]  # torch.median: the lower middle value
        cols.append([srt[0], srt[1], srt[2], med])
    mean = np.mean(np.array(cols), axis=0)
    r = per_sequence(h)
    assert r["top"] == pytest.approx(list(mean[:3]), rel=1e-12) and r["median"] == pytest.approx(mean[3], rel=1e-12)
    assert r["ratio"] == pytest.approx(mean[0] / mean[3], rel=1e-12)
    assert r["ratio_mean"] == pytest.approx(np.mean([c[0] / c[3] for c in cols]), rel=1e-12)
    mb = massive_by_block([h, h, 2 * h])
    assert mb["max_ratio"] == pytest.approx(40.0 / float(h.abs().median()), rel=1e-12)  # pooled: max over sequences
    assert mb["max_ratio_per_seq"] == pytest.approx(r["ratio"], rel=1e-12) and r["ratio"] < mb["max_ratio"]
    assert mb["max_top1_per_seq"] == pytest.approx(2 * mean[0], rel=1e-12)


# ------------------------------------------------------------------------------------------- fingerprints
class _Cfg:
    def to_dict(self):
        return {"model": {"width": 4}}


class _AB(nn.Module):
    def __init__(self, first: str):
        super().__init__()
        for n in ((first, "b") if first == "a" else (first, "a")):
            setattr(self, n, nn.Linear(4, 4))


def test_fingerprint_changes_with_parameter_order_and_not_otherwise():
    from normlab.fingerprint import fingerprint_record

    torch.manual_seed(0)
    one = fingerprint_record(_Cfg(), _AB("a"))
    torch.manual_seed(1)
    same = fingerprint_record(_Cfg(), _AB("a"))  # other weights, same layout and config
    swapped = fingerprint_record(_Cfg(), _AB("b"))  # the same names and shapes, registered in the other order
    assert one["sha256"] == same["sha256"]
    assert swapped["sha256"] != one["sha256"]
    assert sorted((n, tuple(s)) for n, s in one["layout"]["parameters"]) == sorted(
        (n, tuple(s)) for n, s in swapped["layout"]["parameters"])


def _train_tiny(run_dir: Path) -> None:
    from normlab.config import load_config
    from normlab.train.loop import train

    cfg = load_config("tiny", ["train.steps=2", "train.eval_every=2", "train.checkpoint_every=2",
                               "train.eval_batches=1", "train.log_every=1"])
    train(cfg, run_dir, quiet=True)


def test_a_run_records_its_fingerprint_and_the_check_names_what_changed(tmp_path):
    from normlab.fingerprint import check_run

    run = tmp_path / "r"
    _train_tiny(run)
    rec = json.loads((run / "fingerprint.json").read_text())
    assert len(rec["sha256"]) == 64 and rec["torch"] == torch.__version__
    assert check_run(run) is None
    lay = rec["layout"]["parameters"]
    rec["layout"]["parameters"] = [lay[1], lay[0], *lay[2:]]
    rec["sha256"] = "0" * 64
    (run / "fingerprint.json").write_text(json.dumps(rec))
    assert check_run(run) == "model layout changed: parameters order changed"
    rec["torch"] = "1.0"
    (run / "fingerprint.json").write_text(json.dumps(rec))
    assert check_run(run).startswith("trained with torch 1.0")
    (run / "fingerprint.json").unlink()
    assert "no fingerprint" in check_run(run)


def test_initialisation_rebuilt_for_the_growth_metric_is_the_runs_own(tmp_path):
    """The Peri-LN growth metric compares a run with its own initialisation, rebuilt from config.yaml under the
    run's seed; the rebuilt model gives exactly the loss the training loop measured at step 0."""
    from normlab.model import build_model
    from normlab.rundir import load_run
    from normlab.train.init_eval import initial_eval
    from normlab.rundir import load_data

    run = tmp_path / "r"
    _train_tiny(run)
    cfg = load_run(run).cfg
    torch.manual_seed(cfg.seed)
    model = build_model(cfg.model)
    got = initial_eval(model, load_data(cfg), cfg)
    step0 = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    assert got["init_val_loss"] == pytest.approx(step0["init_val_loss"], abs=1e-6)


def test_claims_retrain_a_run_whose_fingerprint_changed_and_say_why(tmp_path):
    out, cache = tmp_path / "claims", tmp_path / "cache"
    first = run_inproc("claims", "--budget", "tiny", "--seeds", "1", "--only", "powernorm-lm", "--out", str(out),
                       "--json", cache=cache, check=True)
    fp = Path(json.loads(first.stdout)["claims"][0]["runs"][0]["powernorm"]) / "fingerprint.json"
    rec = json.loads(fp.read_text())
    rec["sha256"], rec["normlab"] = "0" * 64, "0.0.1"
    fp.write_text(json.dumps(rec))
    p = run_inproc("claims", "--budget", "tiny", "--seeds", "1", "--only", "powernorm-lm", "--out", str(out),
                   "--json", cache=cache, check=True)
    rep = json.loads(p.stdout)
    assert rep["trained_runs"] == 1 and rep["reused_runs"] == 1
    (why, names), = rep["retrained"].items()
    assert "normlab 0.0.1" in why and names == ["powernorm/seed0"]
    assert "retraining 1 run(s)" in p.stderr


@pytest.mark.slow
def test_changed_claims_tiny_end_to_end(tmp_path):
    """Peri-LN growth during training, the authors' massive statistic, LSSAR trained vs switched at evaluation:
    per-seed values recomputed from the cached statistics and the extrapolation details."""
    out, cache = tmp_path / "claims", tmp_path / "cache"
    p = run_inproc("claims", "--budget", "tiny", "--only", "peri-variance,peri-variance-magnitude,peri-massive,lssar-extrapolation,"
                   "lssar-eval-only", "--out", str(out), "--json", cache=cache, check=True)
    rep = {c["name"]: c for c in json.loads(p.stdout)["claims"]}
    pv = rep["peri-variance"]
    for v, d, runs in zip(pv["values"], pv["details"], pv["runs"]):
        g = {}
        for name in ("deep_pre", "deep_peri"):
            end = json.loads((Path(runs[name]) / "claims_diag.json").read_text())["variance"]["var"][-1]
            init = json.loads((Path(runs[name]) / "claims_diag_init.json").read_text())["variance"]["var"][-1]
            g[name] = math.log(end / init)
        assert d["growth_last_block_diff"] == pytest.approx(g["deep_pre"] - g["deep_peri"], abs=1e-12)
        assert v == pytest.approx((d["slope_end_pre"] - d["slope_init_pre"])
                                  - (d["slope_end_peri"] - d["slope_init_peri"]), abs=1e-12)  # issue 26's measure
        assert d["slope_diff_init"] == pytest.approx(d["slope_init_pre"] - d["slope_init_peri"], abs=1e-12)
    for v, d in zip(rep["peri-variance-magnitude"]["values"], pv["details"]):
        assert v == pytest.approx(math.log10(d["var_end_pre"] / d["var_end_peri"]), abs=1e-12)
    pm = rep["peri-massive"]
    for v, d in zip(pm["values"], pm["details"]):
        assert v == pytest.approx(math.log10(d["ratio_per_seq_pre"] / d["ratio_per_seq_peri"]), abs=1e-12)
        assert d["pooled_log10_ratio"] == pytest.approx(math.log10(d["pooled_ratio_pre"] / d["pooled_ratio_peri"]))
    lt, le = rep["lssar-extrapolation"], rep["lssar-eval-only"]
    assert set(lt["runs"][0]) == {"ln", "softplus_lssar"} and set(le["runs"][0]) == {"ln", "softplus"}
    for d in lt["details"]:
        assert d["degradation"]["softmax"] == pytest.approx(d["loss_softmax"]["4"] - d["loss_softmax"]["1"])
    assert lt["details"][0]["loss_softmax"] == le["details"][0]["loss_softmax"]  # the same softmax run and tokens


def test_sweep_retrains_a_finished_run_whose_fingerprint_changed_and_keeps_the_old_one(tmp_path):
    from types import SimpleNamespace

    from normlab.experiments.runner import _refingerprint

    sweep_dir = tmp_path / "sweep"
    _train_tiny(sweep_dir / "runs" / "a")
    sweep = SimpleNamespace(runs=[SimpleNamespace(run_id="a")])
    logs: list[str] = []
    assert _refingerprint(sweep, sweep_dir, {"a": {"status": "completed"}}, logs.append) == [] and logs == []
    fp = sweep_dir / "runs" / "a" / "fingerprint.json"
    rec = json.loads(fp.read_text())
    rec["sha256"], rec["torch"] = "0" * 64, "0.1"
    fp.write_text(json.dumps(rec))
    assert _refingerprint(sweep, sweep_dir, {"a": {"status": "completed"}}, logs.append) == sweep.runs
    assert not (sweep_dir / "runs" / "a").exists() and (sweep_dir / "stale" / "a-0" / "model.safetensors").is_file()
    assert "trained with torch 0.1" in logs[0]
