"""Model surgery (issue 13) on an imported random-initialised GPT-2 (``normlab import``, the papers' setting):
``quantize``, ``remove-norm`` and ``eval --label-free`` checked against transformers' own GPT-2 with the same
operation done by hand on its modules (RTN on its Conv1D weights, fixed-scale LayerNorms, MaNo / Matrix
Nuclear-Norm from its logits and last hidden states).

GPT-2 here: width 48 (= 12 x 4, a Hadamard order of the Paley x Sylvester kind, like GPT-2's 768 = 12 x 64),
2 layers, 4 heads, context 64, gelu_new, random weights with the 1-D parameters moved off their init.
"""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch

from normlab.run.rundir import load_run
from tests.helpers import run_inproc
from tests.test_interop import corpus, save_hf, text_ids  # noqa: F401 - corpus is a fixture

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def imported(tmp_path_factory, corpus, cache):  # noqa: F811
    """``(run_dir, hf_model)``: a random GPT-2 saved as an HF directory and imported with ``normlab import``."""
    import transformers as T

    d = tmp_path_factory.mktemp("gpt2")
    hf = save_hf(T.GPT2Config(vocab_size=256, n_positions=64, n_embd=48, n_layer=2, n_head=4), d / "hf")
    run = d / "run"
    run_inproc("import", str(d / "hf"), "--out", str(run), "--data", str(corpus), cache=cache, check=True)
    return run, hf


def _hf_rtn(hf: torch.nn.Module, bits: int) -> torch.nn.Module:
    """HF GPT-2 with every block linear (Conv1D, weight ``[in, out]``) fake-quantized by hand: symmetric RTN per
    output channel, ``s = max|w| / (2^(b-1) - 1)``, ``clamp(round(w / s), -2^(b-1), 2^(b-1) - 1) * s``."""
    q = copy.deepcopy(hf)
    qmax = 2 ** (bits - 1) - 1
    with torch.no_grad():
        for block in q.transformer.h:
            for lin in (block.attn.c_attn, block.attn.c_proj, block.mlp.c_fc, block.mlp.c_proj):
                w = lin.weight.double()
                s = w.abs().amax(0, keepdim=True) / qmax  # one scale per output column
                lin.weight.copy_((torch.clamp(torch.round(w / s), -qmax - 1, qmax) * s).float())
    return q


@pytest.mark.parametrize("bits", [4, 3])
def test_quantize_imported_gpt2_equals_hand_rtn_on_transformers(bits, imported, tmp_path, cache):
    run, hf = imported
    out = tmp_path / f"w{bits}"
    r = json.loads(run_inproc("quantize", str(run), "--weights", str(bits), "--out", str(out), "--max-tokens", "512",
                              "--json", cache=cache, check=True).stdout)
    assert r["simulated"] and len(r["layers"]) == 2 * 4  # qkv, proj, fc, proj per block
    x = text_ids()
    with torch.no_grad():
        ours, ref, orig = load_run(out).model(x), _hf_rtn(hf, bits)(input_ids=x).logits, hf(input_ids=x).logits
    assert (ours - ref).abs().max() <= 1e-4
    assert (ours - orig).abs().max() > 1e-3  # the quantization did change the function
    assert r["bpb_increase"] == pytest.approx(r["bpb_after"] - r["bpb_before"])


def test_quantize_imported_gpt2_with_hadamard_rotation(imported, tmp_path, cache):
    """--rotate hadamard converts the imported GPT-2 exactly to parameter-free RMSNorm form, rotates with a
    randomized Hadamard of order 48 (checked to 1e-4 before quantizing) and writes a run with W8 weights whose
    logits stay close to transformers' unquantized GPT-2."""
    run, hf = imported
    out = tmp_path / "w8h"
    r = json.loads(run_inproc("quantize", str(run), "--weights", "8", "--rotate", "hadamard", "--out", str(out),
                              "--max-tokens", "512", "--json", cache=cache, check=True).stdout)
    rot = r["rotation"]
    assert rot["rotation"] == "randomized hadamard" and rot["conversion"] == "rmsnorm"
    assert rot["max_abs_logit_diff"] <= 1e-4
    x = text_ids()
    with torch.no_grad():
        diff = (load_run(out).model(x) - hf(input_ids=x).logits).abs().max()
    assert 0 < diff < 0.05  # 8-bit weights: a small, non-zero change
    assert abs(r["bpb_increase"]) < 0.01


class _FixedLN(torch.nn.Module):
    """An HF LayerNorm with its per-token std replaced by the scalar ``s``: ``(x - mean(x)) / s * w + b``."""

    def __init__(self, ln: torch.nn.LayerNorm, s: float):
        super().__init__()
        self.ln, self.s = ln, s

    def forward(self, x):
        return (x - x.mean(-1, keepdim=True)) / self.s * self.ln.weight + self.ln.bias


def test_remove_norm_on_imported_gpt2_matches_fixed_scale_transformers(imported, tmp_path, cache):
    """--steps 0: the removed model is transformers' GPT-2 with ln_2, ln_1 and ln_f each dividing by the scalar
    the command stored for that site (logits to 1e-4); no norm computes a statistic; three stages in the
    paper's order (MLP-input norms, attention-input norms, final norm) with their losses recorded."""
    from normlab.norms.fixedscale import FixedScaleNorm

    run, hf = imported
    out = tmp_path / "nonorm"
    r = json.loads(run_inproc("remove-norm", str(run), "--out", str(out), "--steps", "0", "--max-tokens", "512",
                              "--json", cache=cache, check=True).stdout)
    assert [(s["label"], s["sites"]) for s in r["stages"]] == [
        ("mlp", ["blocks.0.mlp_in", "blocks.1.mlp_in"]), ("attn", ["blocks.0.attn_in", "blocks.1.attn_in"]),
        ("final", ["final_norm"])]
    assert all(np.isfinite(s["after_removal"]["loss"]) for s in r["stages"])
    assert not r["check"]["live_sites"]
    model = load_run(out).model
    norms = {n: m for n, m in model.named_modules() if isinstance(m, FixedScaleNorm)}
    assert len(norms) == 2 * 2 + 1 and all(m.fixed for m in norms.values())
    ref = copy.deepcopy(hf)
    for i, block in enumerate(ref.transformer.h):
        block.ln_1 = _FixedLN(block.ln_1, float(norms[f"blocks.{i}.attn_in"].scale))
        block.ln_2 = _FixedLN(block.ln_2, float(norms[f"blocks.{i}.mlp_in"].scale))
    final = next(n for n in norms if not n.startswith("blocks."))
    ref.transformer.ln_f = _FixedLN(ref.transformer.ln_f, float(norms[final].scale))
    x = text_ids()
    with torch.no_grad():
        assert (model(x) - ref(input_ids=x).logits).abs().max() <= 1e-4
        # and the removal changed the function (the scales are averages, not each token's std)
        assert (model(x) - hf(input_ids=x).logits).abs().max() > 1e-4


def test_remove_norm_fine_tunes_an_imported_gpt2(imported, tmp_path, cache):
    """With fine-tuning (here 2 steps a stage on the imported run's own corpus) every stage is a run directory
    trained from the previous one, and the final model is statistic-free."""
    run, _ = imported
    out = tmp_path / "nonorm-ft"
    r = json.loads(run_inproc("remove-norm", str(run), "--out", str(out), "--steps", "2", "--max-tokens", "256",
                              "--json", cache=cache, check=True).stdout)
    assert len(r["stages"]) == 3 and not r["check"]["live_sites"]
    assert r["delta_nats"] == pytest.approx(r["final"]["loss"] - r["original"]["loss"])
    from tests.helpers import assert_same_weights

    names = [f"{k:02d}-{g}" for k, g in ((1, "mlp"), (2, "attn"), (3, "final"))]
    assert sorted(p.name for p in (out / "stages").iterdir()) == sorted(
        f"{n}-{kind}" for n in names for kind in ("removed", "tuned"))
    for n in names:
        s = json.loads((out / "stages" / f"{n}-tuned" / "summary.json").read_text())
        assert s["status"] == "completed" and s["step"] == 2
    assert [s["run"] for s in r["stages"]] == [f"stages/{n}-tuned" for n in names]
    assert_same_weights(out / "stages" / f"{names[-1]}-tuned", out)  # the result is the last fine-tuned stage


def test_eval_label_free_on_imported_gpt2_matches_transformers(imported, cache):
    """MaNo and the Matrix Nuclear-Norm of the imported run equal the papers' formulas applied by hand to
    transformers' logits and last hidden states (after ln_f) on the same windows."""
    from normlab.run.rundir import run_data

    run, hf = imported
    r = json.loads(run_inproc("eval", str(run), "--label-free", "--max-tokens", "512", "--json", cache=cache,
                              check=True).stdout)["label_free"]
    loaded = load_run(run)
    ctx = loaded.cfg.model.context
    val = run_data(run, loaded.cfg).val
    n = min(512 // ctx, (len(val) - 1) // ctx)
    x = torch.from_numpy(np.stack([val[i * ctx:(i + 1) * ctx].astype(np.int64) for i in range(n)]))
    with torch.no_grad():
        o = hf(input_ids=x, output_hidden_states=True)
    p = torch.softmax(o.logits.double().reshape(-1, 256), -1)  # K = 256 > e^5: the softmax branch
    mano = float(p.pow(4).mean().pow(0.25))
    mnn = []
    for h in o.hidden_states[-1].double():
        h = h - h.mean(0)
        h = h / h.norm(dim=1, keepdim=True)
        mnn.append(float(torch.sort(h.norm(dim=0), descending=True).values[: min(h.shape)].sum()) / h.shape[0])
    assert r["windows"] == n and r["normalisation"] == "softmax"
    assert r["mano"] == pytest.approx(mano, rel=1e-5)
    assert r["matrix_nuclear_norm"] == pytest.approx(float(np.mean(mnn)), rel=1e-5)
