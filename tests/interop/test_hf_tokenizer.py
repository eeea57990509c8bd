"""normlab.interop.hf_tokenizer: an export's tokenizer carries an end-of-text token at the id normlab starts documents
after, so lm-evaluation-harness's own ``HFLM.loglikelihood_rolling`` (what ``lm_eval --tasks wikitext`` runs)
scores an export with no ``prefix_token_id`` and agrees with ``normlab eval --documents``; encoding text is
unchanged (its UTF-8 bytes) and the export imports back as the byte tokenizer."""

from __future__ import annotations

import json

import pytest

from normlab.eval.documents import split_documents
from normlab.interop.hf_tokenizer import normlab_tokenizer
from normlab.rundir.readers import load_run, run_data
from tests.helpers import run_inproc
from tests.test_interop import corpus, make_run  # noqa: F401 (corpus: the module's fixture, used by name)


@pytest.mark.parametrize("tokenizer", ["bytes", "bytes+doc"])
def test_lm_eval_scores_an_export_without_prefix_token_id_as_eval_documents(tokenizer, corpus, cache, tmp_path,  # noqa: F811
                                                                            monkeypatch):
    pytest.importorskip("lm_eval")
    from transformers import AutoTokenizer

    from normlab.interop.harness import harness_document_metrics

    monkeypatch.setenv("NORMLAB_CACHE_DIR", str(cache))
    vocab = 257 if tokenizer.endswith("+doc") else 256
    run = make_run(tmp_path, "run", corpus, tokenizer=tokenizer, norm="rmsnorm", activation="swiglu",
                   vocab_size=vocab)
    out = tmp_path / "hf"
    run_inproc("export", str(run), "--to", "hf", "--out", str(out), cache=cache, check=True)
    want_start = vocab - 1 if tokenizer.endswith("+doc") else 10  # the separator; else the newline byte
    assert json.loads((out / "normlab_export.json").read_text())["doc_start_token"] == want_start
    hf = AutoTokenizer.from_pretrained(out, trust_remote_code=False)
    assert hf.eos_token_id == want_start and (hf.bos_token_id or hf.eos_token_id) == want_start
    text = (corpus / "d0.txt").read_text(encoding="utf-8")[:400] + "\n\ncafé — ok\r\n"
    assert hf.encode(text, add_special_tokens=False) == list(text.encode("utf-8"))  # bytes, newlines included
    assert hf.decode(list(text.encode("utf-8"))) == text
    assert normlab_tokenizer(out, tmp_path / "copy" / "tokenizer.json") == tokenizer  # imports back as it was

    cli = json.loads(run_inproc("eval", str(run), "--split", "test", "--batch-size", "16", "--documents", "--json",
                                cache=cache, check=True).stdout)
    assert cli["doc_start_token"] == want_start
    loaded = load_run(run)
    docs = split_documents(run, loaded.cfg, run_data(run, loaded.cfg), "test")  # the documents eval scored
    theirs = harness_document_metrics(out, [d.decode("utf-8") for d in docs], prefix_token_id=None, max_length=None)
    assert theirs["documents"] == cli["documents"] >= 1 and theirs["bytes"] == cli["bytes"]
    assert theirs["words"] == cli["words"]
    for k, ours in (("bits_per_byte", "bpb"), ("byte_perplexity", "byte_perplexity"),
                    ("word_perplexity", "word_perplexity")):
        assert theirs[k] == pytest.approx(cli[ours], rel=1e-3), k
