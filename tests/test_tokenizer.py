"""The tokenizer's user-facing interface: ``encode`` takes ``str`` or ``bytes`` and returns a list
of ints, ``decode`` returns ``str``, with the names a Hugging Face tokenizer has. References: Hugging Face
``tokenizers`` on the same tokenizer.json (ids and decoded text) and Python's own UTF-8 codec."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from normlab.data.tokenizer import BPETokenizer, BytesTokenizer, DocTokenizer
from normlab.errors import NormlabError
from tests.helpers import assert_bad_input, run_inproc


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
