"""The tokenizer's user-facing interface: ``encode`` takes ``str`` or ``bytes`` and returns a list
of ints, ``decode`` returns ``str``, with the names a Hugging Face tokenizer has. References: Hugging Face
``tokenizers`` on the same tokenizer.json (ids and decoded text) and Python's own UTF-8 codec.

Document-separator tokenizers (``data.tokenizer: bytes+doc`` / ``bpe:N+doc``): the model sees where each
document starts, ``eval --documents`` conditions on that token, and the HF export carries it (issue 16 item 2).

References: the split's documents from the data layer (``split_docs``) joined by hand with the separator; a
direct per-document forward; transformers' own tokenizer on the exported files."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from normlab.data import load_corpus, prepare_data, split_docs
from normlab.data.tokenizer import BPETokenizer, BytesTokenizer, DocTokenizer, parse_tokenizer_spec
from normlab.errors import NormlabError
from normlab.eval.documents import evaluate_documents
from normlab.rundir.readers import load_run
from tests.helpers import assert_bad_input, run_inproc
from tests.test_interop import corpus, make_run  # noqa: F401 - corpus is a fixture

@pytest.fixture(scope="module")
def bpe():
    text = [("def f(x):\n    return x + 1  # héllo wörld\n" * 30 + f"line {i}\n").encode() for i in range(30)]
    return BPETokenizer.train(text, 320)


@pytest.fixture(scope="module")
def hf(bpe, tmp_path_factory):
    from tokenizers import Tokenizer

    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    bpe.save(path)
    return Tokenizer.from_file(str(path))


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=80))
def test_bpe_str_matches_hugging_face_tokenizers(bpe, hf, text):
    text = text.encode("utf-8", "replace").decode("utf-8")  # no lone surrogates (not valid text for either side)
    ids = bpe.encode(text)
    assert isinstance(ids, list) and all(type(i) is int for i in ids)
    assert ids == hf.encode(text, add_special_tokens=False).ids
    assert bpe.encode(text.encode("utf-8")) == ids  # bytes and str give the same ids
    assert bpe.decode(ids) == hf.decode(ids) == text
    assert bpe(text) == {"input_ids": ids}


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=64))
def test_decode_is_utf8_with_replacement_and_decode_bytes_is_lossless(bpe, data):
    for tok in (bpe, BytesTokenizer(), DocTokenizer(BytesTokenizer())):
        ids = tok.encode(data)
        assert tok.decode_bytes(ids) == data
        assert tok.decode(ids) == data.decode("utf-8", errors="replace")
        arr = tok.encode(data, return_array=True)
        assert isinstance(arr, np.ndarray) and arr.dtype == np.uint16 and arr.tolist() == ids


def test_bytes_tokenizer_and_hf_names():
    tok = BytesTokenizer()
    assert tok.encode("héllo") == list("héllo".encode()) and tok.decode([104, 195, 169]) == "hé"
    assert len(tok) == tok.vocab_size == 256
    assert tok.batch_decode([[97], [98, 99]]) == ["a", "bc"]
    doc = DocTokenizer(tok)
    assert doc.encode("ab") == [97, 98] and doc.encode_prompt("ab") == [256, 97, 98] and len(doc) == 257
    assert doc.decode([256, 97, 256, 98]) == "ab"  # the separator stands for no bytes
    with pytest.raises(NormlabError, match="str \\(UTF-8\\) or bytes, got int"):
        tok.encode(5)


# a path that is not a tokenizer file says what it is ('/dev/zero' was reported as not existing)
@pytest.mark.parametrize("kind", ["device", "fifo", "empty-dir", "missing"])
def test_tokenizer_path_that_is_not_a_file(kind, tmp_path, cache):
    path = {"device": "/dev/zero", "fifo": str(tmp_path / "fifo.json"), "empty-dir": str(tmp_path / "d"),
            "missing": str(tmp_path / "none.json")}[kind]
    if kind == "fifo":
        os.mkfifo(path)
    if kind == "empty-dir":
        os.mkdir(path)
    expected = {"device": "is not a regular file", "fifo": "is not a regular file",
                "empty-dir": "has no tokenizer.json", "missing": "does not exist"}[kind]
    out = tmp_path / "out"
    proc = run_inproc("train", "tiny", "--set", f"data.tokenizer={path}", "--out", str(out), cache=cache)
    assert_bad_input(proc, f"'{path}'", expected)
    assert not out.exists()


# ---------------------------------------------------------------- document-separator tokenizers (+doc)
SHAPE_DOC = dict(vocab_size=257)


def _joined(docs: list[bytes], sep: int, encode) -> list[int]:
    out: list[int] = []
    for d in docs:
        out += [sep, *map(int, encode(d))]
    return out


def test_bytes_doc_stream_is_the_split_documents_each_after_a_separator(corpus, tmp_path):  # noqa: F811
    data = prepare_data(str(corpus), "bytes+doc", cache_dir=tmp_path)
    plain = prepare_data(str(corpus), "bytes", cache_dir=tmp_path)
    docs = split_docs(load_corpus(str(corpus)).docs, 0.05, 0.05)
    assert data.vocab_size == 257 and data.tokenizer.doc_token == 256 and data.tokenizer.name == "bytes+doc"
    assert int(data.token_bytes[256]) == 0 and data.token_bytes[:256].tolist() == [1] * 256
    for s in ("train", "val", "test"):
        assert data.split(s).tolist() == _joined(docs[s], 256, lambda d: np.frombuffer(d, np.uint8)), s
        assert data.split_bytes[s] == plain.split_bytes[s] == sum(map(len, docs[s]))
        assert int(data.token_bytes[np.asarray(data.split(s))].sum()) == data.split_bytes[s]
        assert data.tokenizer.decode_bytes(data.split(s)) == b"".join(docs[s])
    assert data.tokenizer.encode(b"ab") == [97, 98]  # one string: no separator


def test_bpe_doc_separates_documents_and_keeps_the_base_encoding(corpus, tmp_path):  # noqa: F811
    data = prepare_data(str(corpus), "bpe:300+doc", cache_dir=tmp_path)
    tok = data.tokenizer
    assert isinstance(tok, DocTokenizer) and tok.vocab_size == 301 and tok.doc_token == 300
    docs = split_docs(load_corpus(str(corpus)).docs, 0.05, 0.05)["train"]
    assert data.train.tolist() == _joined(docs, 300, tok.base.encode)
    assert tok.decode_bytes(data.train) == b"".join(docs)
    again = prepare_data(str(corpus), "bpe:300+doc", cache_dir=tmp_path)  # reopened from the cache entry
    assert again.tokenizer.name == "bpe:300+doc" and again.train.tolist() == data.train.tolist()


@pytest.mark.parametrize("spec, fragment", [("bpe:65536+doc", "N <= 65535"), ("+doc", "unknown tokenizer"),
                                            ("words+doc", "unknown tokenizer")])
def test_bad_doc_specs_are_one_line_errors(spec, fragment):
    with pytest.raises(NormlabError) as e:
        parse_tokenizer_spec(spec)
    assert fragment in str(e.value) and "\n" not in str(e.value)


def test_eval_documents_conditions_on_the_trained_separator(corpus, cache, tmp_path):  # noqa: F811
    run = make_run(tmp_path, "run", corpus, tokenizer="bytes+doc", **SHAPE_DOC)
    d = json.loads(run_inproc("eval", str(run), "--documents", "--json", cache=cache, check=True).stdout)
    assert d["doc_start_token"] == 256 and "document token" in d["doc_start_source"]
    assert d["tokenizer"] == "bytes+doc"
    # independent: the same documents scored directly with prefix 256, and the newline prefix gives another number
    src = load_run(run)
    docs = split_docs(load_corpus(str(corpus)).docs, 0.05, 0.05)["val"]
    enc = lambda b: np.frombuffer(b, np.uint8)  # noqa: E731
    direct = evaluate_documents(src.model, docs, enc, 256, context=src.cfg.model.context)
    assert d["bpb"] == pytest.approx(direct["bpb"], rel=1e-9) and d["bytes"] == direct["bytes"]
    newline = evaluate_documents(src.model, docs, enc, 10, context=src.cfg.model.context)
    assert abs(newline["bpb"] - d["bpb"]) > 1e-6
    s = json.loads(run_inproc("eval", str(run), "--json", cache=cache, check=True).stdout)
    assert s["mode"] == "stream" and s["tokenizer"] == "bytes+doc"


def test_training_with_a_separator_records_it(corpus, cache, tmp_path):  # noqa: F811
    out = tmp_path / "r"
    run_inproc("train", "tiny", "--set", f"data.source={corpus}", "--set", "data.tokenizer=bytes+doc",
               "--set", "train.steps=2", "--set", "model.context=16", "--out", str(out), cache=cache, check=True)
    run = load_run(out)
    assert run.cfg.model.vocab_size == 257 and run.model.lm_head.weight.shape[0] == 257
    info = json.loads((out / "data.json").read_text())
    assert info["tokenizer"]["spec"] == "bytes+doc" and info["tokenizer"]["doc_token"] == 256


def test_export_carries_the_separator_as_a_special_token(corpus, cache, tmp_path):  # noqa: F811
    """The HF export writes the document token as the special <|doc|> (checked with transformers' own tokenizer
    and logits), and importing the export back gives a +doc run with the same logits."""
    pytest.importorskip("transformers")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run = make_run(tmp_path, "run", corpus, tokenizer="bytes+doc", norm="rmsnorm", positions="rope",
                   activation="swiglu", **SHAPE_DOC)
    out = tmp_path / "hf"
    r = json.loads(run_inproc("export", str(run), "--to", "hf", "--out", str(out), "--json", cache=cache,
                              check=True).stdout)
    assert r["doc_start_token"] == 256 and r["max_abs_logit_diff"] <= 1e-4
    tok = AutoTokenizer.from_pretrained(out, trust_remote_code=False)
    assert tok.encode("<|doc|>ab", add_special_tokens=False) == [256, 97, 98]
    assert tok.bos_token_id == 256
    hf = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, trust_remote_code=False).eval()
    x = torch.tensor([[256, 97, 98, 10, 256, 99]])
    with torch.no_grad():
        assert (load_run(run).model(x) - hf(input_ids=x).logits).abs().max() <= 1e-4
    # and back: the import recognises its own <|doc|> and gives the run its +doc tokenizer, same logits
    back = tmp_path / "back"
    run_inproc("import", str(out), "--out", str(back), "--data", str(corpus), cache=cache, check=True)
    b = load_run(back)
    assert b.cfg.data.tokenizer == "bytes+doc"
    with torch.no_grad():
        assert (load_run(run).model(x) - b.model(x)).abs().max() <= 1e-4
    d = json.loads(run_inproc("eval", str(back), "--documents", "--json", cache=cache, check=True).stdout)
    assert d["doc_start_token"] == 256


def test_generate_prompts_a_doc_run_after_the_document_token(corpus, cache, tmp_path):  # noqa: F811
    """A +doc model saw every document start after its document token, so a prompt (a document start) is fed after
    it: greedy ``generate`` equals an argmax loop over a direct forward from ``[256] + prompt bytes``, and differs
    from the loop without it; ``prompt_tokens`` counts the document token. The library's ``generate`` agrees."""
    import normlab

    run = make_run(tmp_path, "run", corpus, tokenizer="bytes+doc", **SHAPE_DOC)
    g = json.loads(run_inproc("generate", str(run), "--prompt", "def ", "--max-new-tokens", "12", "--temperature",
                              "0", "--json", cache=cache, check=True).stdout)
    src = load_run(run)

    def greedy(ids: list[int]) -> list[int]:
        out = []
        with torch.no_grad():
            for _ in range(12):
                x = torch.tensor([(ids + out)[-src.cfg.model.context:]])
                out.append(int(src.model(x)[0, -1].argmax()))
        return out

    prompt = list(b"def ")
    assert g["prompt_tokens"] == 5 and g["tokens"] == greedy([256, *prompt])
    assert g["tokens"] != greedy(prompt)
    assert normlab.generate(str(run), "def ", max_new_tokens=12, temperature=0) == g["text"]
