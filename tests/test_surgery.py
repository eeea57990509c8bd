"""Model surgery (issue 13; docs/surgery.md): train --init-from, RTN quantization against its closed form, the
Hadamard rotation's exactness on a trained model, W8 vs W3, LayerNorm removal, label-free scores by hand, the
report columns, and the bad-input contract.

Model surgery (issue 13) on an imported random-initialised GPT-2 (``normlab import``, the papers' setting):
``quantize``, ``remove-norm`` and ``eval --label-free`` checked against transformers' own GPT-2 with the same
operation done by hand on its modules (RTN on its Conv1D weights, fixed-scale LayerNorms, MaNo / Matrix
Nuclear-Norm from its logits and last hidden states).

GPT-2 here: width 48 (= 12 x 4, a Hadamard order of the Paley x Sylvester kind, like GPT-2's 768 = 12 x 64),
2 layers, 4 heads, context 64, gelu_new, random weights with the 1-D parameters moved off their init."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from normlab.config import dump_config, load_config
from normlab.model import build_model
from normlab.rundir.readers import load_run
from normlab.rundir.tensors import save_model
from tests.helpers import assert_bad_input, run_inproc, weights
from tests.test_interop import corpus, save_hf, text_ids  # noqa: F401 - corpus is a fixture

pytestmark = pytest.mark.usefixtures("one_thread")

# an order-1 Markov source with peaked transitions: 40 steps learn real structure (2.32 bits/byte, floor 2.01)
SOURCE = "synthetic:markov?order=1&alphabet=16&length=60000&concentration=0.1&seed=0"
SETS = ["--set", f"data.source={SOURCE}", "--set", "train.lr=0.01", "--set", "train.eval_every=40",
        "--set", "train.checkpoint_every=40", "--set", "diag.every=0"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory, cache):
    d = tmp_path_factory.mktemp("surgery") / "ln"
    run_inproc("train", "tiny", *SETS, "--set", "train.steps=40", "--out", str(d), cache=cache, check=True)
    return d


def write_untrained(path: Path, cache: Path, *overrides: str) -> Path:
    """A run directory from a config without training (seeded init): enough for refusals."""
    cfg = load_config("tiny", [f"data.source={SOURCE}", f"data.cache_dir={cache}", *overrides])
    from normlab.rundir.readers import load_data

    cfg.model.vocab_size = load_data(cfg).vocab_size
    torch.manual_seed(0)
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(dump_config(cfg))
    save_model(build_model(cfg.model), path / "model.safetensors", cfg.hash())
    return path


# ---------------------------------------------------------------- train --init-from
def test_init_from_starts_from_the_source_weights(trained, tmp_path, cache):
    out = tmp_path / "ft"
    run_inproc("train", "tiny", *SETS, "--set", "train.steps=1", "--set", "train.lr=1e-12",
               "--set", "train.warmup_steps=0", "--init-from", str(trained), "--out", str(out), cache=cache, check=True)
    a, b = weights(trained), weights(out)
    assert a.keys() == b.keys()
    assert max((a[k] - b[k]).abs().max().item() for k in a) < 1e-6  # one step at lr 1e-12: the source weights
    assert json.loads((out / "init_from.json").read_text())["init_from"] == str(trained)
    assert json.loads((out / "summary.json").read_text())["init_from"] == str(trained)


def test_init_from_names_the_first_mismatching_parameter(trained, tmp_path, cache):
    out = tmp_path / "wide"
    p = run_inproc("train", "tiny", *SETS, "--set", "model.width=32", "--init-from", str(trained), "--out", str(out),
                   cache=cache)
    assert_bad_input(p, "--init-from", "'tok_emb.weight'", "(256, 64)", "(256, 32)")
    assert not out.exists()


# ---------------------------------------------------------------- RTN against its closed form
def test_rtn_per_channel_and_group_closed_form():
    from normlab.surgery.quantize import rtn, rtn_tokens

    w = torch.tensor([[1.0, -0.5, 0.25, 0.1], [0.3, 0.0, -0.9, 0.46]], dtype=torch.float64)
    # 4 bits: qmax 7; row 0: s = 1/7, w/s = 7, -3.5, 1.75, 0.7 -> 7, -4, 2, 1 (round half to even)
    # row 1: s = 0.9/7, w/s = 2.33, 0, -7, 3.58 -> 2, 0, -7, 4
    expect = torch.tensor([[7, -4, 2, 1], [2 * 0.9, 0, -7 * 0.9, 4 * 0.9]], dtype=torch.float64) / 7
    torch.testing.assert_close(rtn(w, 4), expect, rtol=0, atol=1e-12)
    # groups of 2, 3 bits (qmax 3): [1, -.5] s=1/3 -> 3, -1.5 -> 3, -2; [.25, .1] s=.25/3 -> 3, 1.2 -> 3, 1
    g = rtn(w, 3, group=2)
    torch.testing.assert_close(g[0], torch.tensor([1.0, -2 / 3, 0.25, 0.25 / 3], dtype=torch.float64))
    # [.3, 0] s = .1 -> 3, 0; [-.9, .46] s = .3 -> -3, 1.53 -> -3, 2
    torch.testing.assert_close(g[1], torch.tensor([0.3, 0.0, -0.9, 0.6], dtype=torch.float64))
    x = torch.tensor([[0.5, -1.27, 0.0]])  # per token, 8 bits: s = 1.27/127 = 0.01
    torch.testing.assert_close(rtn_tokens(x), torch.tensor([[0.5, -1.27, 0.0]]), rtol=0, atol=1e-6)
    assert torch.equal(rtn(torch.zeros(2, 4), 4), torch.zeros(2, 4))


def test_quantize_weights_reports_relative_error():
    from normlab.surgery.quantize import quantize_weights, rtn

    torch.manual_seed(0)
    model = torch.nn.Module()
    model.blocks = torch.nn.ModuleList([torch.nn.Linear(8, 4)])
    w = model.blocks[0].weight.detach().double().clone()
    stats = quantize_weights(model, 4)["blocks.0"]
    q = rtn(w, 4)
    assert stats["rel_err"] == pytest.approx(float(((w - q) ** 2).sum() / (w ** 2).sum()), rel=1e-12)
    torch.testing.assert_close(model.blocks[0].weight.double(), q, rtol=0, atol=1e-7)


# ---------------------------------------------------------------- rotation
@pytest.mark.parametrize("n", [1, 2, 8, 12, 24, 48, 768])
def test_hadamard_orders(n):
    from normlab.surgery.rotate import hadamard

    h = hadamard(n)
    assert h is not None and set(np.unique(h)) <= {-1.0, 1.0}
    np.testing.assert_array_equal(h @ h.T, n * np.eye(n))


def test_rotation_is_orthogonal_and_falls_back():
    from normlab.surgery.rotate import hadamard, random_rotation

    for d, kind in ((64, "randomized hadamard"), (6, "random orthogonal")):
        q, k = random_rotation(d, seed=3)
        assert k.startswith(kind)
        torch.testing.assert_close(q @ q.T, torch.eye(d, dtype=torch.float64), rtol=0, atol=1e-12)
    assert hadamard(6) is None


def test_hadamard_rotation_leaves_logits_unchanged(trained):
    from normlab.convert.run import max_logit_diff
    from normlab.surgery.quantize import activation_stats
    from normlab.surgery.run_quantize import rotated_copy
    from normlab.rundir.readers import load_data

    src = load_run(trained)
    data = load_data(src.cfg)
    cfg, rot, info = rotated_copy(src.model, src.cfg, data.val)
    assert cfg.model.norm == "rmsnorm" and info["rotation"] == "randomized hadamard"
    # an independent check on other windows than the command's own
    diff = max_logit_diff(src.model, rot, data.val[1000:], src.cfg.model.context, n_windows=6)
    assert diff <= 1e-4
    assert not torch.allclose(rot.tok_emb.weight, src.model.tok_emb.weight, atol=1e-3)  # the weights did change
    x = torch.from_numpy(data.val[:128].astype(np.int64)).view(2, 64)
    before, after = activation_stats(src.model, x), activation_stats(rot, x)
    assert before.keys() == after.keys()
    # the residual-stream readers see rotated inputs: their statistics change, the MLP-internal ones do not
    assert before["blocks.0.attn.qkv"]["kurtosis"] != pytest.approx(after["blocks.0.attn.qkv"]["kurtosis"], rel=1e-3)


def test_quantize_w8_changes_little_w3_more(trained, tmp_path, cache):
    res = {}
    for bits in (8, 3):
        out = tmp_path / f"w{bits}"
        p = run_inproc("quantize", str(trained), "--weights", str(bits), "--out", str(out), "--max-tokens", "4096",
                       "--json", cache=cache, check=True)
        res[bits] = json.loads(p.stdout)
        rec = json.loads((out / "quantization.json").read_text())
        assert rec["simulated"] is True and rec["weights"] == bits and set(rec["layers"]) == {
            f"blocks.{l}.{n}" for l in range(2) for n in ("attn.qkv", "attn.proj", "mlp.fc", "mlp.proj")}
        # the written run is the fake-quantized model: re-evaluating it gives the recorded bits/byte
        ev = json.loads(run_inproc("eval", str(out), "--max-tokens", "4096", "--json", cache=cache, check=True).stdout)
        assert ev["bpb"] == pytest.approx(rec["bpb_after"], abs=1e-9)
    assert abs(res[8]["bpb_increase"]) < 1e-3  # W8: a change below 0.001 bits/byte
    assert res[3]["bpb_increase"] > 2e-3 and res[3]["bpb_increase"] > 5 * abs(res[8]["bpb_increase"])
    w8 = np.mean([s["rel_err"] for s in res[8]["layers"].values()])
    w3 = np.mean([s["rel_err"] for s in res[3]["layers"].values()])
    assert w3 > 100 * w8  # each bit fewer doubles the step: (127/3)^2 ~ 1800x the squared error


def test_quantize_with_rotation_and_activations(trained, tmp_path, cache):
    out = tmp_path / "w4a8"
    p = run_inproc("quantize", str(trained), "--weights", "4", "--group", "32", "--acts", "8", "--rotate", "hadamard",
                   "--out", str(out), "--max-tokens", "2048", "--json", cache=cache, check=True)
    r = json.loads(p.stdout)
    assert r["rotation"]["max_abs_logit_diff"] <= 1e-4 and r["acts"] == 8 and r["group"] == 32
    assert load_run(out).cfg.model.norm == "rmsnorm"


# ---------------------------------------------------------------- LayerNorm removal
def test_remove_norm_leaves_no_statistic_and_records_stages(trained, tmp_path, cache):
    from normlab.norms.fixedscale import FixedScaleNorm
    from normlab.surgery.remove_norm import affine_defect, norm_modules

    out = tmp_path / "noln"
    p = run_inproc("remove-norm", str(trained), "--out", str(out), "--steps", "2", "--max-tokens", "1024", "--json",
                   cache=cache, check=True)
    r = json.loads(p.stdout)
    assert [s["label"] for s in r["stages"]] == ["mlp", "attn", "final"]
    assert [len(s["sites"]) for s in r["stages"]] == [2, 2, 1]
    for s in r["stages"]:
        for k in ("after_removal", "after_finetune"):
            assert math.isfinite(s[k]["loss"]) and math.isfinite(s[k]["bpb"])
        assert s["delta_nats"] == pytest.approx(s["after_finetune"]["loss"] - r["original"]["loss"])
        assert all(v > 0 for v in s["scales"].values())
        assert (out / s["run"] / "model.safetensors").is_file()
    rec = json.loads((out / "removal.json").read_text())
    assert rec["delta_bpb"] == pytest.approx(rec["final"]["bpb"] - rec["original"]["bpb"])
    run = load_run(out)
    assert run.cfg.model.norm == "fixedscale"
    mods = norm_modules(run.model)
    assert len(mods) == 5 and all(isinstance(m, FixedScaleNorm) and m.fixed for m in mods.values())
    assert max(affine_defect(m, 64) for m in mods.values()) < 1e-9  # every norm is an affine map of its input
    assert affine_defect(torch.nn.LayerNorm(64), 64) > 0.1  # while a LayerNorm is not
    ev = json.loads(run_inproc("eval", str(out), "--max-tokens", "1024", "--json", cache=cache, check=True).stdout)
    assert ev["loss"] == pytest.approx(rec["final"]["loss"], abs=1e-9)
    # every recorded path names the published directory, never the publish temp dir (.noln.XXXX) it was built in
    texts = {f: f.read_text() for f in out.rglob("*") if f.suffix in (".json", ".jsonl", ".yaml")}
    assert texts and not [f for f, t in texts.items() if f".{out.name}." in t]
    for s in r["stages"]:
        stage = out / s["run"]
        assert json.loads((stage / "summary.json").read_text())["run_dir"] == str(stage)
        init = json.loads((stage / "init_from.json").read_text())
        assert Path(init["weights"]).is_file() and Path(init["init_from"]).parent == out / "stages"


def test_fixedscale_live_equals_layernorm_and_fixed_divides_by_scale():
    from normlab.norms import build_norm

    torch.manual_seed(0)
    m = build_norm("fixedscale", 8)
    with torch.no_grad():
        m.weight.normal_(), m.bias.normal_()
    x = torch.randn(3, 8) * 4 + 1
    ref = torch.nn.functional.layer_norm(x, (8,), m.weight, m.bias, 1e-5)
    torch.testing.assert_close(m(x), ref)
    m.scale.fill_(2.5)
    torch.testing.assert_close(m(x), (x - x.mean(-1, keepdim=True)) / 2.5 * m.weight + m.bias)
    r = build_norm("fixedscale", 8, center=False)
    r.scale.fill_(2.0)
    torch.testing.assert_close(r(x), x / 2.0)


# ---------------------------------------------------------------- label-free scores by hand
LOGITS = [[2.0, 0.0, -1.0, 0.5], [0.1, 0.2, 0.3, 0.4], [-3.0, 1.0, 0.0, 0.0]]


def test_mano_against_hand_computation():
    from normlab.surgery.label_free import mano_score

    n, k = 3, 4
    probs = []
    for row in LOGITS:
        z = sum(math.exp(v) for v in row)
        probs.append([math.exp(v) / z for v in row])
    phi = sum(-sum(math.log(p) for p in row) / k for row in probs) / n
    soft = (sum(p ** 4 for row in probs for p in row) / (n * k)) ** 0.25
    r = mano_score(torch.tensor(LOGITS, dtype=torch.float64), eta=1.0)  # phi ~ 1.7 > 1: softmax branch
    assert r["criterion"] == pytest.approx(phi, rel=1e-12) and r["normalisation"] == "softmax"
    assert r["mano"] == pytest.approx(soft, rel=1e-12)
    taylor = []
    for row in LOGITS:
        v = [1 + q + q * q / 2 for q in row]
        lo = min(v)
        taylor.append([(x - lo) / sum(y - lo for y in v) for x in v])
    tay = (sum(p ** 4 for row in taylor for p in row) / (n * k)) ** 0.25
    r = mano_score(torch.tensor(LOGITS, dtype=torch.float64))  # default eta = 5 > phi: Taylor branch
    assert r["normalisation"] == "taylor" and r["mano"] == pytest.approx(tay, rel=1e-12)


def test_matrix_nuclear_norm_against_hand_computation():
    from normlab.surgery.label_free import nuclear_norm_score

    h = [[1.0, 2.0, 0.0], [0.0, 1.0, 1.0], [2.0, 0.0, 1.0], [1.0, 1.0, 3.0]]  # T = 4 tokens, d = 3
    t, d = 4, 3
    mu = [sum(r[j] for r in h) / t for j in range(d)]
    c = [[r[j] - mu[j] for j in range(d)] for r in h]
    c = [[x / math.sqrt(sum(y * y for y in r)) for x in r] for r in c]
    cols = sorted((math.sqrt(sum(r[j] ** 2 for r in c)) for j in range(d)), reverse=True)
    assert nuclear_norm_score(torch.tensor(h)) == pytest.approx(sum(cols[: min(t, d)]) / t, rel=1e-12)


def test_eval_label_free(trained, cache):
    ev = json.loads(run_inproc("eval", str(trained), "--label-free", "--max-tokens", "1024", "--json", cache=cache,
                               check=True).stdout)
    lf = ev["label_free"]
    assert 0 < lf["mano"] <= 1 and lf["matrix_nuclear_norm"] > 0 and lf["positions"] == 1024
    assert lf["normalisation"] == "softmax"  # K = 256 byte classes: the criterion is >= ln 256 > 5


def test_spearman_and_pearson_by_hand():
    from normlab.surgery.robustness import pearson, spearman

    x, y = [1.0, 2.0, 3.0, 4.0], [10.0, 30.0, 20.0, 40.0]
    assert spearman(x, y) == pytest.approx(0.8)  # ranks 1 3 2 4: 1 - 6 * 2 / (4 * 15)
    mx, my = 2.5, 25.0
    num = sum((a - mx) * (b - my) for a, b in zip(x, y))
    den = math.sqrt(sum((a - mx) ** 2 for a in x) * sum((b - my) ** 2 for b in y))
    assert pearson(x, y) == pytest.approx(num / den)
    assert spearman([1.0, 2.0], [2.0, 1.0]) is None


# ---------------------------------------------------------------- report columns
def test_report_quantization_and_label_free_columns(tmp_path):
    from normlab.surgery.robustness import FORMAT
    from tests.test_report import make_sweep

    (tmp_path / "sweep").mkdir()
    d = make_sweep(tmp_path / "sweep")
    q = {"alpha": (0.01, 0.004), "beta": (0.02, 0.01), "gamma": (0.03, None)}
    loss = {}
    for run in sorted((d / "runs").iterdir()):
        v, seed = run.name.split("-s")
        if json.loads((run / "summary.json").read_text())["status"] != "completed":
            continue
        rtn, had = q[v]
        (run / "quant_robustness.json").write_text(json.dumps({
            "settings": {"format": FORMAT, "max_tokens": 8192, "bits": 4}, "bpb": 2.0,
            "w4_rtn": rtn + 0.001 * int(seed), "w4_hadamard": had, "hadamard_error": None if had else "Post-LN"}))
        loss[run.name] = 2.0 + 0.1 * len(loss)
        (run / "label_free.json").write_text(json.dumps({
            "settings": {"format": FORMAT, "max_tokens": 8192}, "mano": 1.0 - loss[run.name] / 10,
            "matrix_nuclear_norm": loss[run.name] ** 2, "loss": loss[run.name], "bpb": 3.0}))
    p = run_inproc("report", str(d), "--quantize", "--label-free", "--json", cache=d / "cache")
    assert p.returncode == 0, p.stderr
    md = (d / "report.md").read_text()
    assert "W4 RTN Δbits/byte" in md and "W4 + Hadamard Δbits/byte" in md and "max massive ratio" in md
    row = next(line for line in md.splitlines() if line.startswith("| Alpha |") and "0.011" in line)
    assert "0.004" in row  # mean of 0.010, 0.011, 0.012 and the Hadamard column
    assert "## Label-free metrics" in md
    # MaNo falls and MNN rises with the loss on every run: Spearman -1 and +1
    assert "MaNo vs loss Spearman -1.000" in md and "Matrix Nuclear-Norm vs loss Spearman +1.000" in md


# ---------------------------------------------------------------- bad input
def test_bad_inputs_are_one_line_errors(trained, tmp_path, cache):
    post = write_untrained(tmp_path / "post", cache, "model.placement=post")
    peri = write_untrained(tmp_path / "peri", cache, "model.placement=peri")
    dyt = write_untrained(tmp_path / "dyt", cache, "model.norm=dyt")
    out = tmp_path / "out"
    cases = [
        (("remove-norm", str(post), "--out", str(out)), ("placement 'post'", "Pre-LN")),
        (("remove-norm", str(dyt), "--out", str(out)), ("norm 'dyt'", "layernorm or rmsnorm")),
        (("remove-norm", str(trained), "--out", str(out), "--steps", "-1"), ("--steps",)),
        (("quantize", str(trained), "--weights", "5", "--out", str(out)), ("--weights", "8, 4, 3")),
        (("quantize", str(trained), "--weights", "4", "--acts", "4", "--out", str(out)), ("--acts",)),
        (("quantize", str(trained), "--weights", "4", "--group", "48", "--out", str(out)), ("--group 48", "width 64")),
        (("quantize", str(peri), "--weights", "4", "--rotate", "hadamard", "--out", str(out)),
         ("cannot convert", "placement 'peri'")),
        (("quantize", str(dyt), "--weights", "4", "--rotate", "hadamard", "--out", str(out)), ("norm 'dyt'",)),
        (("quantize", str(tmp_path / "missing"), "--weights", "4", "--out", str(out)), ("does not exist",)),
        (("train", "tiny", "--resume", str(trained), "--init-from", str(trained)), ("--init-from",)),
    ]
    for args, frags in cases:
        assert_bad_input(run_inproc(*args, cache=cache), *frags)
        assert not out.exists()


@pytest.mark.slow
def test_surgery_claims_tiny(tmp_path, cache):
    out = tmp_path / "claims"
    p = run_inproc("claims", "--budget", "tiny", "--only", "ln-removal,hadamard-w4", "--out", str(out), "--json",
                   cache=cache, check=True)
    rep = {c["name"]: c for c in json.loads(p.stdout)["claims"]}
    rem, had = rep["ln-removal"], rep["hadamard-w4"]
    assert rem["n"] == 2 and all(math.isfinite(v) for v in rem["values"])
    for v, d in zip(rem["values"], rem["details"]):  # the value is the LN-free loss minus the fine-tuned control's
        assert v == pytest.approx(d["loss_removed"] - d["loss_control"])
    for v, d in zip(had["values"], had["details"]):
        assert v == pytest.approx(d["w4_rtn_bpb_increase"] - d["w4_hadamard_bpb_increase"])


# ---------------------------------------------------------------- surgery on an imported GPT-2
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
    from normlab.rundir.readers import run_data

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
