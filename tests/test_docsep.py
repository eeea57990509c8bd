"""Document-separator tokenizers (``data.tokenizer: bytes+doc`` / ``bpe:N+doc``): the model sees where each
document starts, ``eval --documents`` conditions on that token, and the HF export carries it (issue 16 item 2).

References: the split's documents from the data layer (``split_docs``) joined by hand with the separator; a
direct per-document forward; transformers' own tokenizer on the exported files.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from normlab.data import load_corpus, prepare_data, split_docs
from normlab.data.tokenizer import DocTokenizer, parse_tokenizer_spec
from normlab.errors import NormlabError
from normlab.eval.documents import evaluate_documents
from normlab.run.rundir import load_run
from tests.helpers import run_inproc
from tests.test_interop import corpus, make_run  # noqa: F401  (module fixture and run builder)

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
