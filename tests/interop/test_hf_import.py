"""``normlab import`` (normlab.interop.hf_import, hf_files) on hostile and careless model directories (issue 27).

Table-driven: each row damages a copy of a tiny random-initialised GPT-2 / Llama directory saved by transformers'
own ``save_pretrained`` (nothing downloaded) and expects the bad-input contract (exit 2, one ``error:`` line with
the row's key words, no traceback) and nothing under ``--out``. Separately: a planted ``auto_map`` module is never
executed even with ``y`` on stdin (a marker file it would write must not appear; transformers itself does run it
when asked to trust it, the positive control), a pickle-only directory is refused without ``torch.load`` being
called, a missing tensor is refused (it used to be filled with transformers' random init), and an import without a
tokenizer uses bytes for a 256-token vocabulary and never a document token outside the vocabulary (issue 29).
Issue 39: config keys outside the allow-list never reach transformers (sizes bounded, semantic keys and hub-kernel
attention refused, the rest noted), every JSON file read is size-capped (1 GiB sparse files refused unread), a FIFO
in place of any file is refused or never opened, and ``python -m normlab`` ignores the current directory.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers import assert_bad_input, cli_env, run_inproc

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    for i in range(4):
        (root / f"d{i}.txt").write_text((json.__doc__ or "") + f"\ndocument {i} café\n", encoding="utf-8")
    return root


def _save(cfg, path: Path) -> Path:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    """Tiny HF directories (no tokenizer files): GPT-2 (tied, its default bos/eos 50256 outside the 256-token
    vocabulary), Llama (untied) and a GPT-2 with a 300-token vocabulary."""
    import transformers as T

    root = tmp_path_factory.mktemp("hf")
    gpt2 = dict(n_positions=64, n_embd=32, n_layer=2, n_head=4)
    return {
        "gpt2": _save(T.GPT2Config(vocab_size=256, **gpt2), root / "gpt2"),
        "llama": _save(T.LlamaConfig(vocab_size=256, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=48, max_position_embeddings=64, tie_word_embeddings=False),
                       root / "llama"),
        "gpt2-300": _save(T.GPT2Config(vocab_size=300, **gpt2), root / "gpt2-300"),
    }


def edit_config(d: Path, **changes) -> None:
    cfg = json.loads((d / "config.json").read_text())
    for k, v in changes.items():
        if v is _DELETE:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    (d / "config.json").write_text(json.dumps(cfg))  # json.dumps writes NaN for float('nan'), as a careless tool does


def edit_tensors(d: Path, fn) -> None:
    from safetensors.torch import load_file, save_file

    t = load_file(str(d / "model.safetensors"))
    fn(t)
    save_file(t, str(d / "model.safetensors"), metadata={"format": "pt"})


_DELETE = object()
WTE = "transformer.wte.weight"


def _raw(d: Path, data: bytes) -> None:
    (d / "model.safetensors").write_bytes(data)


def _truncate(d: Path) -> None:
    p = d / "model.safetensors"
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])


def _huge_header(d: Path) -> None:
    _raw(d, struct.pack("<Q", 2**62) + b"{}")


def _pickle_only(d: Path) -> None:
    (d / "model.safetensors").rename(d / "pytorch_model.bin")


def _bad_index(d: Path) -> None:
    (d / "model.safetensors").unlink()
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {WTE: "../elsewhere.safetensors"}}))


def _no_config(d: Path) -> None:
    (d / "config.json").unlink()


def _fifo(path: Path) -> None:
    path.unlink(missing_ok=True)
    os.mkfifo(path)


def _sparse(path: Path, size: int = 1 << 30) -> None:
    """A ``size``-byte file that takes no disk (reading it would take ``size`` bytes of memory)."""
    with open(path, "wb") as f:
        f.truncate(size)


def _as_index(d: Path, content) -> None:
    """Replace ``model.safetensors`` by an index: ``content`` (JSON value, or a function writing the file)."""
    (d / "model.safetensors").rename(d / "model-00001-of-00001.safetensors")
    idx = d / "model.safetensors.index.json"
    content(idx) if callable(content) else idx.write_text(json.dumps(content))


def _tokenizer(d: Path, content) -> None:
    t = d / "tokenizer.json"
    content(t) if callable(content) else t.write_text(json.dumps(content))


HUB_KERNEL = "kernels-community/flash-attn"


BAD = [  # (id, base directory, damage, key words of the one line)
    # config values of the wrong type (each was a traceback)
    ("n_embd-string", "gpt2", lambda d: edit_config(d, n_embd="32"), ["'n_embd' is \"32\"", "integer >= 1"]),
    ("n_layer-float", "gpt2", lambda d: edit_config(d, n_layer=2.5), ["'n_layer' is 2.5", "integer >= 1"]),
    ("vocab-null", "gpt2", lambda d: edit_config(d, vocab_size=None), ["'vocab_size' is null"]),
    ("eps-string", "llama", lambda d: edit_config(d, rms_norm_eps="abc"), ["'rms_norm_eps'", "finite number > 0"]),
    ("eps-nan", "gpt2", lambda d: edit_config(d, layer_norm_epsilon=float("nan")), ["not valid JSON", "NaN"]),
    ("heads-zero", "llama", lambda d: edit_config(d, num_attention_heads=0), ["'num_attention_heads' is 0"]),
    ("heads-not-dividing", "gpt2", lambda d: edit_config(d, n_head=5), ["config.json as a normlab model",
                                                                         "divisible"]),
    ("tie-string", "gpt2", lambda d: edit_config(d, tie_word_embeddings="yes"), ["'tie_word_embeddings'",
                                                                                  "true or false"]),
    ("bos-string", "gpt2", lambda d: edit_config(d, bos_token_id="1"), ["'bos_token_id' is \"1\"", "token id"]),
    ("rope-not-object", "llama", lambda d: edit_config(d, rope_parameters="x"), ["'rope_parameters'", "object"]),
    ("config-list", "gpt2", lambda d: (d / "config.json").write_text("[1, 2]"), ["must hold a JSON object", "list"]),
    ("config-garbage", "gpt2", lambda d: (d / "config.json").write_text("{not json"), ["not valid JSON"]),
    ("no-config", "gpt2", _no_config, ["no config.json"]),
    # model types: checked before transformers sees the directory
    ("type-unknown", "gpt2", lambda d: edit_config(d, model_type="bert"), ["model type 'bert'", "allowed: gpt2"]),
    ("type-missing", "gpt2", lambda d: edit_config(d, model_type=_DELETE), ["model type null", "allowed:"]),
    ("type-number", "gpt2", lambda d: edit_config(d, model_type=3), ["model type 3"]),
    ("type-control-chars", "gpt2", lambda d: edit_config(d, model_type="\x1b[31mevil\nline"),
     ['model type "\\u001b[31mevil\\nline"']),
    ("auto-map-known-type", "gpt2", lambda d: edit_config(d, auto_map={"AutoConfig": "x.C"}), ["auto_map",
                                                                                                 "never runs"]),
    # whole-model limits, before anything is allocated
    ("params-total", "llama", lambda d: edit_config(d, vocab_size=2**24, hidden_size=8192,
                                                     num_attention_heads=64, num_key_value_heads=64, head_dim=128,
                                                     intermediate_size=22016,
                                                     num_hidden_layers=2),
     ["parameters", "the limit is 1e+11"]),
    # weights: safetensors only, exact to the file
    ("pickle-only", "gpt2", _pickle_only, ["only pickle weights", "pytorch_model.bin", "safetensors/convert"]),
    ("no-weights", "gpt2", lambda d: (d / "model.safetensors").unlink(), ["no model.safetensors"]),
    ("index-escapes", "gpt2", _bad_index, ["shards must be *.safetensors files"]),
    ("empty-file", "gpt2", lambda d: _raw(d, b""), ["0 bytes", "truncated or empty"]),
    ("truncated", "gpt2", _truncate, ["truncated"]),
    ("header-2^62", "gpt2", _huge_header, ["header length 4611686018427387904", "truncated or not a safetensors"]),
    ("header-garbage", "gpt2", lambda d: _raw(d, struct.pack("<Q", 4) + b"{no}"), ["header is not valid JSON"]),
    ("missing-tensor", "gpt2", lambda d: edit_tensors(d, lambda t: t.pop("transformer.h.1.mlp.c_fc.weight")),
     ["tensor 'transformer.h.1.mlp.c_fc.weight' is missing"]),
    ("unexpected-tensor", "gpt2", lambda d: edit_tensors(d, lambda t: t.update(extra=torch.zeros(2))),
     ["tensor 'extra'", "unexpected"]),
    ("shape-mismatch", "gpt2", lambda d: edit_config(d, n_embd=64),
     ["tensor 'transformer.h.0.attn.c_attn.bias' has shape (96,)", "implies (192,)"]),
    ("int-tensor", "gpt2", lambda d: edit_tensors(d, lambda t: t.update({WTE: t[WTE].to(torch.int32)})),
     [f"tensor '{WTE}' has dtype I32", "floating point"]),
    ("nan-tensor", "gpt2", lambda d: edit_tensors(d, lambda t: t[WTE].__setitem__((0, 0), float("nan"))),
     [f"tensor '{WTE}'", "NaN or inf"]),
    ("tied-head-differs", "gpt2", lambda d: edit_tensors(d, lambda t: t.update({"lm_head.weight": t[WTE] + 1})),
     ["'lm_head.weight' differs from 'transformer.wte.weight'", "tie_word_embeddings"]),
    # tokenizer: bytes only fits a 256-token vocabulary
    ("vocab-300-no-tokenizer", "gpt2-300", lambda d: None, ["no tokenizer.json", "300 tokens", "--tokenizer"]),
    # config keys outside what normlab maps: sizes bounded before anything is built, semantics refused, and no
    # attention implementation but transformers' own (issue 39)
    ("num-labels-1e9", "gpt2", lambda d: edit_config(d, num_labels=10**9),
     ["'num_labels' is 1000000000", "integer in 1..16777216"]),
    ("vocab-2^40", "gpt2", lambda d: edit_config(d, vocab_size=2**40), ["'vocab_size' is 1099511627776"]),
    ("layers-1e9", "llama", lambda d: edit_config(d, num_hidden_layers=10**9), ["'num_hidden_layers'", "1..4096"]),
    ("eos-list-huge", "gpt2", lambda d: edit_config(d, eos_token_id=list(range(5000))), ["5000 token ids"]),
    ("return-dict-false", "gpt2", lambda d: edit_config(d, return_dict=False), ["'return_dict' is false",
                                                                               "allowed: true, null"]),
    ("output-hidden-states", "gpt2", lambda d: edit_config(d, output_hidden_states=True),
     ["'output_hidden_states' is true", "standard output"]),
    ("encoder-decoder", "gpt2", lambda d: edit_config(d, is_encoder_decoder=True), ["'is_encoder_decoder' is true",
                                                                                   "decoder-only"]),
    ("hub-kernel", "llama", lambda d: edit_config(d, attn_implementation=HUB_KERNEL),
     [f"'attn_implementation' is \"{HUB_KERNEL}\"", "loads no attention kernel", "allowed: null, \"eager\""]),
    ("hub-kernel-internal", "gpt2", lambda d: edit_config(d, _attn_implementation=HUB_KERNEL),
     ["'_attn_implementation'", "loads no attention kernel"]),
    ("quantized", "llama", lambda d: edit_config(d, quantization_config={"quant_method": "bitsandbytes"}),
     ["'quantization_config'", "float weights"]),
    ("pruned-heads", "gpt2", lambda d: edit_config(d, pruned_heads={"0": [1]}), ["'pruned_heads'", "unpruned"]),
    ("rope-scaling-linear", "llama", lambda d: edit_config(d, rope_scaling={"type": "linear", "factor": 2.0}),
     ["rope_scaling has RoPE type \"linear\"", "default RoPE only"]),
    ("config-fifo", "gpt2", lambda d: _fifo(d / "config.json"), ["not a regular file"]),
    ("config-1GiB-sparse", "gpt2", lambda d: _sparse(d / "config.json"), ["1073741824 bytes", "1 MiB"]),
    # every JSON file of the directory: size-capped from its size, never read whole, and type-checked
    ("index-1GiB-sparse", "gpt2", lambda d: _as_index(d, _sparse), ["1073741824 bytes", "16 MiB",
                                                                    "safetensors index"]),
    ("index-fifo", "gpt2", lambda d: _as_index(d, _fifo), ["not a regular file"]),
    ("index-list", "gpt2", lambda d: _as_index(d, [1, 2]), ["not a safetensors index"]),
    ("index-map-ints", "gpt2", lambda d: _as_index(d, {"weight_map": {WTE: 1}}), ["not a safetensors index"]),
    ("tokenizer-array", "gpt2", lambda d: _tokenizer(d, [1, 2, 3]), ["not a tokenizers file", "an array"]),
    ("tokenizer-null", "gpt2", lambda d: _tokenizer(d, None), ["not a tokenizers file", "holds null"]),
    ("tokenizer-model-string", "gpt2", lambda d: _tokenizer(d, {"model": "evil"}),
     ["not a tokenizers file", "'model' is a string"]),
    ("tokenizer-added-ints", "gpt2", lambda d: _tokenizer(d, {"model": {"type": "BPE", "vocab": {}},
                                                              "added_tokens": [1, 2]}),
     ["added_tokens[0] is not an object"]),
    ("tokenizer-garbage", "gpt2", lambda d: _tokenizer(d, lambda t: t.write_text("{no")), ["not valid JSON"]),
    ("tokenizer-1GiB-sparse", "gpt2", lambda d: _tokenizer(d, _sparse), ["1073741824 bytes", "64 MiB"]),
    ("tokenizer-fifo", "gpt2", lambda d: _tokenizer(d, _fifo), ["not a regular file"]),
]


@pytest.mark.parametrize("base,damage,fragments", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_model_directory_is_one_line_and_writes_nothing(base, damage, fragments, dirs, corpus, cache, tmp_path):
    d = tmp_path / "hf"
    shutil.copytree(dirs[base], d)
    damage(d)
    out = tmp_path / "out"
    proc = run_inproc("import", str(d), "--out", str(out), "--data", str(corpus), cache=cache)
    assert_bad_input(proc, *fragments)
    assert not out.exists() and not list(tmp_path.glob(".out.*")), "nothing half-written"
    assert proc.stdout == ""


@pytest.mark.parametrize("make,fragment", [(_fifo, "not a regular file"), (_sparse, "1073741824 bytes")],
                         ids=["fifo", "1GiB-sparse"])
def test_tokenizer_flag_that_is_a_fifo_or_huge_is_refused_unread(make, fragment, dirs, corpus, cache, tmp_path):
    """``--tokenizer PATH`` (read by ``data.tokenizer.BPETokenizer.from_file``) has the same guards."""
    tok = tmp_path / "tokenizer.json"
    make(tok)
    proc = run_inproc("import", str(dirs["gpt2"]), "--out", str(tmp_path / "out"), "--data", str(corpus),
                      "--tokenizer", str(tok), cache=cache)
    assert_bad_input(proc, f"tokenizer file '{tok}'", fragment)
    assert not (tmp_path / "out").exists()


def test_memory_is_checked_before_reading_weights(dirs, corpus, cache, tmp_path, monkeypatch):
    monkeypatch.setenv("NORMLAB_MEMORY_GB", "0.000001")
    proc = run_inproc("import", str(dirs["gpt2"]), "--out", str(tmp_path / "out"), cache=cache)
    assert_bad_input(proc, "importing this", "parameter model needs an estimated")
    assert not (tmp_path / "out").exists()


def test_import_not_a_directory(tmp_path, cache):
    (tmp_path / "f").write_text("x")
    assert_bad_input(run_inproc("import", str(tmp_path / "f"), "--out", str(tmp_path / "o"), cache=cache),
                     "is not a directory")


EVIL = '''
from pathlib import Path
Path({marker!r}).write_text("code from the model directory ran")
from transformers import PretrainedConfig
class EvilConfig(PretrainedConfig):
    model_type = "evil_custom"
'''


def _plant(d: Path, model_type: str, marker: Path) -> None:
    edit_config(d, model_type=model_type, auto_map={"AutoConfig": "evil.EvilConfig",
                                                    "AutoModelForCausalLM": "evil.EvilConfig"})
    (d / "evil.py").write_text(EVIL.format(marker=str(marker)))


@pytest.mark.parametrize("model_type", ["evil_custom", "gpt2"])
def test_planted_auto_map_code_never_runs_even_with_yes_on_stdin(model_type, dirs, cache, tmp_path):
    d = tmp_path / "hf"
    shutil.copytree(dirs["gpt2"], d)
    marker = tmp_path / "marker"
    _plant(d, model_type, marker)
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "normlab.cli", "import", str(d), "--out", str(out),
                           "--tokenizer", "bytes"], input="y\n" * 8, capture_output=True, text=True,
                          env=cli_env(cache), timeout=120)
    assert not marker.exists(), "the model directory's code ran"
    assert_bad_input(proc, "never runs")
    assert proc.stdout == "" and not out.exists()


def test_planted_auto_map_file_is_live_code(dirs, tmp_path):
    """Positive control: transformers, told to trust remote code, does execute the planted file (so the test above
    would see the marker if normlab ever let it run)."""
    from transformers import AutoConfig

    d = tmp_path / "hf"
    shutil.copytree(dirs["gpt2"], d)
    marker = tmp_path / "marker"
    _plant(d, "evil_custom", marker)
    try:
        AutoConfig.from_pretrained(d, trust_remote_code=True, local_files_only=True)
    except Exception:
        pass  # the planted class is not a real config; the marker is what matters
    assert marker.exists()


def test_pickle_only_directory_is_never_opened(dirs, cache, tmp_path, monkeypatch):
    import pickle

    def no_unpickle(*a, **k):
        raise AssertionError("a pickle was opened")

    monkeypatch.setattr(torch, "load", no_unpickle)
    monkeypatch.setattr(pickle, "load", no_unpickle)
    monkeypatch.setattr(pickle, "loads", no_unpickle)
    d = tmp_path / "hf"
    shutil.copytree(dirs["gpt2"], d)
    from safetensors.torch import load_file

    torch.save(load_file(str(d / "model.safetensors")), d / "pytorch_model.bin")  # a real, loadable pickle
    (d / "model.safetensors").unlink()
    proc = run_inproc("import", str(d), "--out", str(tmp_path / "out"), cache=cache)
    assert_bad_input(proc, "only pickle weights", "never unpickles")


def test_import_reads_only_the_safetensors_never_transformers_loaders(dirs, corpus, cache, tmp_path, monkeypatch):
    """No ``from_pretrained`` (the path with remote code, prompts and pickle fallbacks) runs during import, and the
    imported weights equal the file's tensors exactly."""
    import transformers
    from safetensors.torch import load_file

    from normlab.rundir.readers import load_run

    def forbidden(*a, **k):
        raise AssertionError("from_pretrained called")

    for cls in (transformers.AutoConfig, transformers.AutoModelForCausalLM, transformers.PreTrainedModel,
                transformers.PretrainedConfig):
        monkeypatch.setattr(cls, "from_pretrained", forbidden)
    out = tmp_path / "out"
    run_inproc("import", str(dirs["gpt2"]), "--out", str(out), "--data", str(corpus), cache=cache, check=True)
    nl = load_run(out).model.state_dict()
    hf = load_file(str(dirs["gpt2"] / "model.safetensors"))
    assert torch.equal(nl["tok_emb.weight"], hf[WTE])
    assert torch.equal(nl["blocks.1.mlp.fc.weight"], hf["transformer.h.1.mlp.c_fc.weight"].t())


def test_old_checkpoint_names_import(dirs, corpus, cache, tmp_path):
    """A base-model checkpoint without the ``transformer.`` prefix, with the causal-mask buffers old GPT-2 files
    carry, imports to the same weights (what transformers itself accepts)."""
    from safetensors.torch import load_file, save_file

    from normlab.rundir.readers import load_run

    d = tmp_path / "hf"
    shutil.copytree(dirs["gpt2"], d)
    t = load_file(str(d / "model.safetensors"))
    old = {k.removeprefix("transformer."): v for k, v in t.items()}
    old["h.0.attn.bias"] = torch.tril(torch.ones(1, 1, 64, 64))
    save_file(old, str(d / "model.safetensors"), metadata={"format": "pt"})
    out = tmp_path / "out"
    run_inproc("import", str(d), "--out", str(out), "--data", str(corpus), cache=cache, check=True)
    assert torch.equal(load_run(out).model.state_dict()["tok_emb.weight"], t[WTE])


def test_import_without_tokenizer_uses_bytes_and_no_document_token_outside_the_vocabulary(dirs, corpus, cache,
                                                                                         tmp_path):
    """GPT-2's default ``bos_token_id`` 50256 in a 256-token vocabulary: bytes, no document token from the config,
    and ``eval --documents`` falls back to the tokenizer's newline (issue 29, item 6)."""
    assert json.loads((dirs["gpt2"] / "config.json").read_text())["bos_token_id"] == 50256
    out = tmp_path / "out"
    r = json.loads(run_inproc("import", str(dirs["gpt2"]), "--out", str(out), "--data", str(corpus), "--json",
                              cache=cache, check=True).stdout)
    rec = json.loads((out / "hf_import.json").read_text())
    assert rec["tokenizer"] == "bytes" and "256 tokens" in rec["tokenizer_source"]
    assert r["doc_start_token"] is None and "50256 is outside the 256-token vocabulary" in rec["doc_start_source"]
    ev = json.loads(run_inproc("eval", str(out), "--documents", "--json", cache=cache, check=True).stdout)
    assert ev["doc_start_token"] == 10 and ev["doc_start_source"].startswith("newline")


def test_import_keeps_a_document_token_inside_the_vocabulary(dirs, corpus, cache, tmp_path):
    d = tmp_path / "hf"
    shutil.copytree(dirs["gpt2"], d)
    edit_config(d, bos_token_id=-1, eos_token_id=7, pad_token_id=-1)  # old LLaMA conversions: pad -1
    out = tmp_path / "out"
    run_inproc("import", str(d), "--out", str(out), "--data", str(corpus), cache=cache, check=True)
    rec = json.loads((out / "hf_import.json").read_text())
    assert rec["doc_start_token"] == 7 and rec["doc_start_source"] == "config.json eos_token_id"
    assert rec["doc_start_note"] == "bos_token_id -1 is outside the 256-token vocabulary"


def test_param_total_limit_counts_the_whole_model():
    """The limit is on the product, each factor being within its own range (issue 27 item 6)."""
    from normlab.model import ModelConfig
    from normlab.config import RANGES
    from normlab.validate import MAX_PARAMS, param_count

    kw = dict(vocab_size=2**24, width=8192, depth=2, heads=64, mlp_hidden=22016, positions="rope",
              tie_embeddings=False, norm="rmsnorm", activation="swiglu")
    for k in ("vocab_size", "width", "depth", "heads", "mlp_hidden"):
        assert RANGES[f"model.{k}"].contains(kw[k])
    n = param_count(ModelConfig(**kw))
    assert n == 2 * 2**24 * 8192 + 2 * (4 * 8192**2 + 3 * 8192 * 22016 + 8 * 8192) and n > MAX_PARAMS
    from normlab.errors import NormlabError

    with pytest.raises(NormlabError, match=r"the limit is 1e\+11"):
        ModelConfig(**kw).validate()
    ModelConfig(**{**kw, "vocab_size": 2**16}).validate()
    assert math.isfinite(n)


def test_dependency_io_drops_stdout_and_answers_no_prompt(capsys):
    import sys

    from normlab.errors import NormlabError
    from normlab.interop.hf_files import dependency_io

    with dependency_io():
        print("Do you wish to run the custom code? [y/N]")
        assert sys.stdin.read() == ""
        with pytest.raises(NormlabError, match="asked a question on standard input"):
            input("Do you wish to run the custom code? [y/N] ")
    assert capsys.readouterr().out == ""
    print("after")
    assert capsys.readouterr().out == "after\n"


def test_sharded_safetensors_import_to_the_same_weights(dirs, corpus, cache, tmp_path):
    """``model.safetensors.index.json`` and its shards (how transformers saves larger models) import exactly."""
    from safetensors.torch import load_file, save_file

    from normlab.rundir.readers import load_run

    d = tmp_path / "hf"
    shutil.copytree(dirs["llama"], d)
    t = load_file(str(d / "model.safetensors"))
    (d / "model.safetensors").unlink()
    names = sorted(t)
    shards = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    for f, keys in shards.items():
        save_file({k: t[k] for k in keys}, str(d / f), metadata={"format": "pt"})
    (d / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {k: f for f, keys in shards.items() for k in keys}}))
    out = tmp_path / "out"
    run_inproc("import", str(d), "--out", str(out), "--data", str(corpus), cache=cache, check=True)
    nl = load_run(out).model.state_dict()
    assert torch.equal(nl["tok_emb.weight"], t["model.embed_tokens.weight"])
    assert torch.equal(nl["lm_head.weight"], t["lm_head.weight"])


def test_every_from_pretrained_call_refuses_remote_code():
    """Mechanical: every ``*.from_pretrained(...)`` and ``HFLM(...)`` call in the package, tests, examples and
    benchmarks passes ``trust_remote_code=False``; the one exception is this file's positive control."""
    import ast

    root = Path(__file__).resolve().parents[2]
    missing = []
    for path in [p for d in ("normlab", "tests", "examples", "benchmarks") for p in (root / d).rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            if name not in ("from_pretrained", "HFLM"):
                continue
            kw = {k.arg: k.value for k in node.keywords}
            v = kw.get("trust_remote_code")
            if path == Path(__file__).resolve() and isinstance(v, ast.Constant) and v.value is True:
                continue  # the positive control (test_planted_auto_map_file_is_live_code), on a planted file
            if not (isinstance(v, ast.Constant) and v.value is False):
                missing.append(f"{path.relative_to(root)}:{node.lineno}")
    assert not missing, missing


def test_only_mapped_config_keys_reach_transformers_and_the_rest_is_noted(dirs, corpus, cache, tmp_path,
                                                                           monkeypatch):
    """Keys outside the allow-list are dropped before the config class sees them (a huge ``num_labels`` no longer
    allocates its label dict; a harmless ``attn_implementation`` is replaced by eager); unusual ones are named in
    one note line and in hf_import.json, HF bookkeeping is dropped silently."""
    import transformers

    seen: list[dict] = []
    real = transformers.GPT2Config.__init__

    def spy(self, **kw):
        seen.append(dict(kw))
        real(self, **kw)

    monkeypatch.setattr(transformers.GPT2Config, "__init__", spy)
    d = tmp_path / "hf"
    shutil.copytree(dirs["gpt2"], d)
    edit_config(d, num_labels=10**7, attn_implementation="sdpa", resid_pdrop=0.3, summary_type="mean",
                my_flag=True, **{"x\x1b[31m": 1})
    out = tmp_path / "out"
    proc = run_inproc("import", str(d), "--out", str(out), "--data", str(corpus), "--json", cache=cache, check=True)
    assert proc.stderr.strip() == ('note: config.json keys normlab does not map were ignored: "x\\u001b[31m", '
                                   "my_flag (hf_import.json lists them; the model is built from the keys "
                                   "docs/interop.md lists)")
    assert json.loads((out / "hf_import.json").read_text())["ignored_config_keys"] == ['"x\\u001b[31m"', "my_flag"]
    assert seen and all(kw["attn_implementation"] == "eager" for kw in seen)
    passed = set().union(*seen) - {"attn_implementation"}
    assert passed == {"vocab_size", "n_positions", "n_embd", "n_layer", "n_head", "n_inner", "activation_function",
                      "layer_norm_epsilon", "initializer_range", "scale_attn_weights",
                      "scale_attn_by_inverse_layer_idx", "bos_token_id", "eos_token_id", "tie_word_embeddings"}


@pytest.mark.parametrize("family", ["gpt2", "gpt_neox", "llama", "qwen3", "gemma2", "olmo2"])
def test_the_allow_list_drops_nothing_an_export_writes(family):
    """The config.json of a normlab export (transformers' ``to_dict`` of ``mapping.hf_config``) loses no key that
    changes the model: rebuilt from the allow-listed keys it equals the original except for dropout rates (zero in
    the export, inactive in eval mode) and ``pad_token_id`` (a padding index changes no forward), and no key is
    noted as ignored."""
    import transformers

    from normlab.interop.hf_files import CLASSES, MAPPED, hf_config_kwargs
    from normlab.interop.mapping import hf_config
    from normlab.model import ModelConfig

    kw = dict(vocab_size=256, context=32, width=32, depth=2, heads=4, norm="rmsnorm", positions="rope",
              activation="swiglu")
    kw.update({"gpt2": dict(norm="layernorm", positions="learned", activation="gelu", bias=True),
               "gpt_neox": dict(norm="layernorm", activation="gelu", bias=True),
               "qwen3": dict(qk_norm=True),
               "gemma2": dict(placement="peri", embed_scale="fixed", logit_softcap=30.0, attn_softcap=50.0),
               "olmo2": dict(placement="output", qk_norm=True, qk_norm_scope="width")}.get(family, {}))
    cls = getattr(transformers, CLASSES[family][0])
    original = json.loads(json.dumps(cls(**hf_config(ModelConfig(**kw).validate(), family)).to_dict()))
    args, ignored = hf_config_kwargs(family, original)
    rebuilt = json.loads(json.dumps(cls(**args).to_dict()))
    assert ignored == [] and set(args) - {"attn_implementation"} <= MAPPED[family]
    differs = {k for k in set(original) | set(rebuilt) if original.get(k) != rebuilt.get(k)}
    assert differs <= {"embd_pdrop", "attn_pdrop", "resid_pdrop", "pad_token_id"}, differs


SHADOW = 'open({marker!r}, "w").write("{name}.py from the current directory was imported")\n'


def test_python_m_normlab_ignores_the_current_directory_and_unread_files(dirs, corpus, cache, tmp_path):
    """``python -m normlab import .`` run inside a model directory holding ``yaml.py`` / ``transformers.py`` /
    ``typing.py`` / ``torch.py`` imports none of them (``-m`` puts the current directory first on ``sys.path``;
    ``normlab/__main__.py`` removes it), and the files normlab never reads (``generation_config.json``,
    ``tokenizer_config.json``, ...) are FIFOs here: opening one would hang the import."""
    d = tmp_path / "hf"
    shutil.copytree(dirs["gpt2"], d)
    markers = {name: tmp_path / f"marker-{name}" for name in ("yaml", "transformers", "typing", "torch")}
    for name, marker in markers.items():
        (d / f"{name}.py").write_text(SHADOW.format(marker=str(marker), name=name))
    for name in ("generation_config.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
                 "merges.txt"):
        _fifo(d / name)
    proc = subprocess.run([sys.executable, "-m", "normlab", "import", ".", "--out", str(tmp_path / "out"), "--data",
                           str(corpus), "--json"], cwd=d, capture_output=True, text=True, env=cli_env(cache),
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout)["arch"] == "gpt2"
    assert not [m for m in markers.values() if m.exists()]
    # positive control: the planted files are live code for a plain interpreter started in that directory
    subprocess.run([sys.executable, "-c", "import yaml"], cwd=d, env=cli_env(cache), timeout=120)
    assert markers["yaml"].exists()
