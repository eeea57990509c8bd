"""HF transformers export / import (normlab.interop) and the harness-exact per-document evaluation.

Independent references: transformers' own model classes (built from configs, nothing downloaded) and
``AutoTokenizer``; a direct per-document forward; lm-evaluation-harness's ``HFLM.loglikelihood_rolling`` and its
wikitext metric functions (when ``lm-eval`` is installed, as ``make test`` does).
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from normlab.config import DataConfig, RunConfig, dump_config
from normlab.eval.documents import doc_windows, evaluate_documents, harness_words
from normlab.io import write_text
from normlab.model import ModelConfig, build_model
from normlab.rundir.readers import load_run
from normlab.rundir.tensors import save_model
from tests.helpers import assert_bad_input, run_inproc

pytestmark = pytest.mark.usefixtures("one_thread")

SHAPE = dict(vocab_size=256, context=32, width=32, depth=2, heads=4)
EXPORTS = {  # normlab config -> HF family it must export as
    "gpt2": dict(norm="layernorm", positions="learned", activation="gelu", bias=True),
    "gpt2-tanh-untied": dict(norm="layernorm", positions="learned", activation="gelu_tanh", tie_embeddings=False,
                             norm_options={"bias": False}),
    "gpt_neox": dict(norm="layernorm", positions="rope", activation="gelu", bias=True),
    "llama": dict(norm="rmsnorm", positions="rope", activation="swiglu"),
    "qwen3": dict(norm="rmsnorm", positions="rope", activation="swiglu", qk_norm=True),
    "gemma2": dict(norm="rmsnorm", positions="rope", activation="swiglu", placement="peri", embed_norm=False,
                   embed_scale="fixed", logit_softcap=30.0, attn_softcap=50.0),
    "gemma2-offset-untied": dict(norm="rmsnorm", positions="rope", activation="swiglu", placement="peri",
                                 embed_norm=False, embed_scale="none", tie_embeddings=False,
                                 norm_options={"unit_offset": True}),
    "olmo2": dict(norm="rmsnorm", positions="rope", activation="swiglu", placement="output", qk_norm=True,
                  qk_norm_scope="width"),
}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Six real-text documents (standard-library docstrings, some non-ASCII)."""
    import inspect
    import json as json_mod
    import string
    import textwrap

    root = tmp_path_factory.mktemp("corpus")
    for i, mod in enumerate([textwrap, inspect, json_mod, string, shutil, math]):
        (root / f"d{i}.txt").write_text(((mod.__doc__ or "") * 2 + "café ü — ok\n").strip() + "\n", encoding="utf-8")
    return root


def make_run(root: Path, name: str, corpus: Path, tokenizer: str = "bytes", **model_kw) -> Path:
    """A run directory holding a random model whose norm gains and biases are not at their init values."""
    cfg = RunConfig(
        data=DataConfig(source=str(corpus), tokenizer=tokenizer), model=ModelConfig(**{**SHAPE, **model_kw})
    )
    cfg.validate()
    torch.manual_seed(0)
    model = build_model(cfg.model)
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.add_(torch.randn_like(p) * (0.3 if p.dim() == 1 else 0.05))
    run = root / name
    run.mkdir(parents=True)
    write_text(run / "config.yaml", dump_config(cfg))
    save_model(model, run / "model.safetensors", cfg.hash())
    return run


def text_ids(n: int = 64) -> torch.Tensor:
    data = ("Normalization layers: LayerNorm, RMSNorm. Ünïcode too!\n" * 4).encode()[:n]
    return torch.tensor([list(data[: n // 2]), list(data[n // 2 : n])])


@pytest.mark.parametrize("name", list(EXPORTS))
def test_export_matches_transformers_and_imports_back(name, corpus, cache, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run = make_run(tmp_path, "run", corpus, **EXPORTS[name])
    out = tmp_path / "hf"
    proc = run_inproc("export", str(run), "--to", "hf", "--out", str(out), "--json", cache=cache, check=True)
    r = json.loads(proc.stdout)
    assert r["arch"] == name.split("-")[0]
    assert r["max_abs_logit_diff"] <= 1e-4 and r["greedy_equal"] is True
    assert json.loads((out / "normlab_export.json").read_text())["max_abs_logit_diff"] == r["max_abs_logit_diff"]
    nl = load_run(run).model
    hf = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, trust_remote_code=False).eval()
    x = text_ids()
    with torch.no_grad():
        assert (nl(x) - hf(input_ids=x).logits).abs().max() <= 1e-4
    tok = AutoTokenizer.from_pretrained(out, trust_remote_code=False)
    s = "héllo wörld\n\tx  y"
    assert tok.encode(s, add_special_tokens=False) == list(s.encode("utf-8"))
    assert tok.decode(list(s.encode("utf-8"))) == s
    # and back: the exported directory imports as a run computing the same logits
    back = tmp_path / "back"
    run_inproc("import", str(out), "--out", str(back), "--data", str(corpus), cache=cache, check=True)
    nl2 = load_run(back).model
    with torch.no_grad():
        assert (nl(x) - nl2(x)).abs().max() <= 1e-4
    assert load_run(back).cfg.model.placement == load_run(run).cfg.model.placement


def _hf_configs():
    import transformers as T

    small = dict(vocab_size=256, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
                 max_position_embeddings=64)
    return {
        "gpt2": T.GPT2Config(vocab_size=256, n_positions=64, n_embd=32, n_layer=2, n_head=4),  # gelu_new
        "gpt_neox": T.GPTNeoXConfig(**small, use_parallel_residual=False, attention_bias=False,
                                    rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                     "partial_rotary_factor": 1.0}),
        "llama": T.LlamaConfig(**small, tie_word_embeddings=True, rope_parameters={"rope_type": "default",
                                                                                 "rope_theta": 500.0}),
        "qwen3": T.Qwen3Config(**small, head_dim=8, num_key_value_heads=4),
        "gemma2": T.Gemma2Config(**small, head_dim=8, num_key_value_heads=4, hidden_activation="silu",
                                 query_pre_attn_scalar=8, layer_types=["full_attention"] * 2),
        "olmo2": T.Olmo2Config(**small),
    }


def save_hf(cfg, path: Path) -> torch.nn.Module:
    """A random-initialised HF model (1-D parameters moved off their init) with the byte tokenizer, saved."""
    from transformers import AutoModelForCausalLM

    from normlab.interop.hf_tokenizer import write_hf_tokenizer
    from normlab.data import BytesTokenizer

    torch.manual_seed(1)
    m = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.3)
    m.save_pretrained(path)
    write_hf_tokenizer(BytesTokenizer(), path, 64)
    return m.eval()


@pytest.mark.parametrize("family", ["gpt2", "gpt_neox", "llama", "qwen3", "gemma2", "olmo2"])
def test_import_random_hf_models(family, corpus, cache, tmp_path):
    hf = save_hf(_hf_configs()[family], tmp_path / "hf")
    run = tmp_path / "run"
    proc = run_inproc("import", str(tmp_path / "hf"), "--out", str(run), "--data", str(corpus), "--json",
                      cache=cache, check=True)
    r = json.loads(proc.stdout)
    assert r["arch"] == family and r["max_abs_logit_diff"] <= 1e-4 and r["greedy_equal"]
    nl = load_run(run).model
    x = text_ids()
    with torch.no_grad():
        assert (nl(x) - hf(input_ids=x).logits).abs().max() <= 1e-4
    ev = run_inproc("eval", str(run), "--json", "--max-tokens", "200", cache=cache, check=True)
    assert json.loads(ev.stdout)["mode"] == "stream"


def test_imported_gpt2_converts_and_diagnoses(corpus, cache, tmp_path):
    """An imported run is a normal run directory: the exact conversion and diagnostics run on it."""
    save_hf(_hf_configs()["gpt2"], tmp_path / "hf")
    run = tmp_path / "run"
    run_inproc("import", str(tmp_path / "hf"), "--out", str(run), "--data", str(corpus), cache=cache, check=True)
    c = json.loads(run_inproc("convert", str(run), "--to", "rmsnorm", "--max-tokens", "256", "--json",
                              cache=cache, check=True).stdout)
    assert c["max_abs_logit_diff"] <= 1e-4
    run_inproc("diagnose", str(run), "--sequences", "2", "--json", cache=cache, check=True)
    assert (run / "diagnostics.json").is_file()


@pytest.mark.parametrize("kw,fragment", [
    (dict(placement="post"), "model.placement 'post'"),
    (dict(norm="dyt"), "model.norm 'dyt'"),
    (dict(norm="rmsnorm", activation="gelu"), "model.activation 'gelu'"),
    (dict(norm="layernorm", positions="alibi"), "model.positions 'alibi'"),
    (dict(norm="rmsnorm", activation="swiglu", placement="output"), "qk_norm_scope"),
    (dict(norm="rmsnorm", activation="swiglu", placement="peri"), "model.embed_norm: true"),
    (dict(layernorm_scaling=True), "layernorm_scaling"),
    (dict(residual="hc"), "model.residual 'hc'"),  # n streams: no HF family carries them
])
def test_export_refuses_configs_without_an_exact_counterpart(kw, fragment, corpus, cache, tmp_path):
    run = make_run(tmp_path, "run", corpus, **kw)
    proc = run_inproc("export", str(run), "--to", "hf", "--out", str(tmp_path / "hf"), cache=cache)
    assert_bad_input(proc, fragment, "exportable:")
    assert not (tmp_path / "hf").exists()


def test_export_of_a_bpe_run_gives_autotokenizer_the_same_ids(corpus, cache, tmp_path):
    from transformers import AutoTokenizer

    run = make_run(tmp_path, "run", corpus, tokenizer="bpe:300", norm="rmsnorm", activation="swiglu",
                   vocab_size=300)
    out = tmp_path / "hf"
    run_inproc("export", str(run), "--to", "hf", "--out", str(out), cache=cache, check=True)
    from normlab.data import load_tokenizer

    nl_tok = load_tokenizer(out / "tokenizer.json")
    s = (corpus / "d0.txt").read_text(encoding="utf-8")[:300]
    hf_tok = AutoTokenizer.from_pretrained(out, trust_remote_code=False)
    assert hf_tok.encode(s, add_special_tokens=False) == nl_tok.encode(s)


# ---- harness-exact per-document evaluation ----

def test_doc_windows_score_every_token_once_within_the_context():
    for n in range(1, 40):
        for L in (1, 3, 8):
            wins = doc_windows(n, L)
            scored = [t for b, e, k in wins for t in range(e - k + 1, e + 1)]  # target positions in [p] + doc
            assert scored == list(range(1, n + 1))
            assert all(e - b <= L and b >= 0 for b, e, _ in wins)
            assert wins[0][0] == 0  # the first token is predicted from the document-start token


def test_documents_mode_equals_a_direct_per_document_forward():
    """Two hand-made documents, context longer than each: one forward of ``[p] + doc`` per document."""
    torch.manual_seed(0)
    model = build_model(ModelConfig(**{**SHAPE, "context": 64})).eval()
    docs = [b"first document\n", b"the second one, a bit longer\tthan that"]
    p = 10
    m = evaluate_documents(model, docs, lambda d: np.frombuffer(d, np.uint8), p, context=64)
    total = 0.0
    with torch.no_grad():
        for d in docs:
            s = torch.tensor([[p, *d]])
            logp = torch.log_softmax(model(s[:, :-1]).double(), -1)
            total -= logp[0, torch.arange(len(d)), s[0, 1:]].sum().item()
    n_bytes = sum(map(len, docs))
    assert m["tokens"] == n_bytes and m["documents"] == 2 and m["words"] == 3 + 8
    assert m["bpb"] == pytest.approx(total / n_bytes / math.log(2), rel=1e-6)
    assert m["word_perplexity"] == pytest.approx(math.exp(total / 11), rel=1e-5)
    # with a short window the rolling windows give each token less context: a different, larger total
    short = evaluate_documents(model, docs, lambda d: np.frombuffer(d, np.uint8), p, context=4)
    assert short["tokens"] == n_bytes and short["bpb"] != pytest.approx(m["bpb"], rel=1e-9)


# \\s is Unicode-aware on str
WORD_CASES = {"": 1, "one": 1, " a b ": 4, "a\n\nb\tc": 3, "ünï cödé  x": 3, "trailing\n": 2, "x\u00a0y": 2}


def test_word_count_is_the_harness_rule():
    for text, expected in WORD_CASES.items():
        assert harness_words(text) == expected, text
    lm_wikitext = pytest.importorskip("lm_eval.tasks.wikitext.preprocess_wikitext")
    for text in WORD_CASES:
        r = lm_wikitext.process_results({"page": text}, (0.0,))
        assert harness_words(text) == r["word_perplexity"][1]
        assert len(text.encode("utf-8")) == r["bits_per_byte"][1]


def test_eval_documents_cli_labels_its_mode(corpus, cache, tmp_path):
    run = make_run(tmp_path, "run", corpus, norm="rmsnorm", activation="swiglu")
    d = json.loads(run_inproc("eval", str(run), "--documents", "--json", cache=cache, check=True).stdout)
    s = json.loads(run_inproc("eval", str(run), "--json", cache=cache, check=True).stdout)
    assert d["mode"] == "documents" and s["mode"] == "stream" and d["doc_start_token"] == 10
    assert d["bytes"] == s["bytes"] + 1  # the stream never scores the split's first token
    assert (run / "eval_val_documents.json").is_file() and (run / "eval_val.json").is_file()
    assert_bad_input(run_inproc("eval", str(run), "--documents", "--stride", "8", cache=cache), "--stride")


@pytest.mark.slow
def test_lm_eval_harness_rolling_loglikelihood_matches_eval_documents(corpus, cache, tmp_path, monkeypatch):
    """lm-evaluation-harness (HFLM on the exported model, loglikelihood_rolling, wikitext's metric functions)
    and ``normlab eval --documents`` give the same bits/byte, byte and word perplexity (1e-4 relative)."""
    pytest.importorskip("lm_eval")
    from normlab.interop.harness import crosscheck

    monkeypatch.setenv("NORMLAB_CACHE_DIR", str(cache))
    run = make_run(tmp_path, "run", corpus, norm="rmsnorm", activation="swiglu")
    out = tmp_path / "hf"
    run_inproc("export", str(run), "--to", "hf", "--out", str(out), cache=cache, check=True)
    r = crosscheck(run, out, "test")
    ours, theirs = r["normlab"], r["lm_eval"]
    assert ours["documents"] == theirs["documents"] >= 1 and ours["bytes"] == theirs["bytes"] > 2 * SHAPE["context"]
    assert ours["words"] == theirs["words"]
    for k in ("bits_per_byte", "byte_perplexity", "word_perplexity"):
        assert ours[k] == pytest.approx(theirs[k], rel=1e-4), k
    doc_start = json.loads((out / "normlab_export.json").read_text())["doc_start_token"]
    cli = json.loads(run_inproc("eval", str(run), "--split", "test", "--batch-size", "16", "--documents", "--doc-start",
                                str(doc_start), "--json", cache=cache, check=True).stdout)
    assert {"bits_per_byte": cli["bpb"], **{k: cli[k] for k in ours if k != "bits_per_byte"}} == ours  # as eval
