"""Tests for normlab.data: Markov entropy against closed forms, splits, tokenizers, the cache, bad inputs."""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import re
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from normlab.data import (
    BPETokenizer,
    Corpus,
    PreparedData,
    load_corpus,
    load_tokenizer,
    markov,
    prepare_data,
    split_docs,
)
from normlab.data import cache as cache_mod
from normlab.data.sources import STDLIB_EXCLUDED_DIRS, stdlib_files
from normlab.errors import NormlabError

SPLITS = ("train", "val", "test")


def h2(p: float) -> float:
    """Binary entropy in bits."""
    return 0.0 if p in (0.0, 1.0) else -p * math.log2(p) - (1 - p) * math.log2(1 - p)


def dense_transition(P: np.ndarray, order: int, alphabet: int) -> np.ndarray:
    """Reference context-to-context matrix built from the digits of each context (independent of _step)."""
    n = alphabet**order
    T = np.zeros((n, n))
    for c in range(n):
        digits = [(c // alphabet ** (order - 1 - i)) % alphabet for i in range(order)]
        for s in range(alphabet):
            nxt = digits[1:] + [s] if order else []
            c2 = sum(d * alphabet ** (order - 1 - i) for i, d in enumerate(nxt))
            T[c, c2] += P[c, s]
    return T


def write_files(root: Path, files: dict[str, bytes]) -> Path:
    for name, data in files.items():
        p = root / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    return root


def split_bytes_of(d: PreparedData, s: str) -> bytes:
    return d.tokenizer.decode_bytes(np.asarray(d.split(s)))


# ---------------------------------------------------------------- Markov entropy rate


@pytest.mark.parametrize("p,q", [(0.1, 0.3), (0.5, 0.5), (0.9, 0.05), (0.01, 0.99), (1e-4, 0.2)])
def test_two_state_chain_closed_form(p, q):
    P = np.array([[1 - p, p], [q, 1 - q]])
    pi = markov.stationary_distribution(P, 2)
    np.testing.assert_allclose(pi, [q / (p + q), p / (p + q)], rtol=0, atol=1e-12)
    expected = q / (p + q) * h2(p) + p / (p + q) * h2(q)
    assert markov.entropy_rate(P, 2) == pytest.approx(expected, abs=1e-12)


def test_order0_is_shannon_entropy():
    probs = np.array([0.5, 0.25, 0.125, 0.125])
    assert markov.entropy_rate(probs[None, :], 4) == pytest.approx(1.75, abs=1e-12)
    P = np.random.default_rng(3).dirichlet(np.ones(7), size=1)
    assert markov.entropy_rate(P, 7) == pytest.approx(float(-(P * np.log2(P)).sum()), abs=1e-12)


def test_zero_probabilities_and_deterministic_chain():
    # Deterministic alternation a->b->a: entropy rate 0, pi uniform (a periodic chain).
    P = np.array([[0.0, 1.0], [1.0, 0.0]])
    np.testing.assert_allclose(markov.stationary_distribution(P, 2), [0.5, 0.5], atol=1e-12)
    assert markov.entropy_rate(P, 2) == 0.0


@pytest.mark.parametrize("order,alphabet", [(2, 3), (3, 2)])
def test_higher_order_stationary_matches_eigenvector(order, alphabet):
    P = np.random.default_rng(order).dirichlet(np.full(alphabet, 0.7), size=alphabet**order)
    T = dense_transition(P, order, alphabet)
    w, v = np.linalg.eig(T.T)
    ref = np.real(v[:, np.argmin(np.abs(w - 1))])
    ref /= ref.sum()
    pi = markov.stationary_distribution(P, alphabet)
    np.testing.assert_allclose(pi, ref, atol=1e-10)
    ent = -(P * np.log2(P)).sum(axis=1)
    assert markov.entropy_rate(P, alphabet) == pytest.approx(float(ref @ ent), abs=1e-10)


def test_power_iteration_path_agrees_with_direct_solve(monkeypatch):
    P = np.random.default_rng(5).dirichlet(np.full(4, 0.5), size=4**3)
    direct = markov.stationary_distribution(P, 4)
    monkeypatch.setattr(markov, "_DIRECT_SOLVE_MAX", 0)
    power = markov.stationary_distribution(P, 4)
    np.testing.assert_allclose(power, direct, atol=1e-12)
    T = dense_transition(P, 3, 4)
    np.testing.assert_allclose(power @ T, power, atol=1e-12)


def test_power_iteration_handles_periodic_chain_and_gives_up_cleanly(monkeypatch):
    monkeypatch.setattr(markov, "_DIRECT_SOLVE_MAX", 0)
    periodic = np.array([[0.0, 1.0], [1.0, 0.0]])  # undamped iteration from (1, 0) would oscillate forever
    np.testing.assert_allclose(markov.stationary_distribution(periodic, 2), [0.5, 0.5], atol=1e-12)
    slow = np.array([[0.999, 0.001], [0.002, 0.998]])
    monkeypatch.setattr(markov, "_MAX_ITER", 3)
    with pytest.raises(NormlabError, match="did not reach its stationary distribution"):
        markov.stationary_distribution(slow, 2)


def test_sample_starts_from_stationary_distribution():
    P = np.array([[0.2, 0.8], [0.2, 0.8]])  # pi = (0.2, 0.8)
    rng = np.random.default_rng(0)
    first = [markov.sample(P, 1, 2, 1, rng)[0] for _ in range(4000)]
    assert np.mean(first) == pytest.approx(0.8, abs=0.03)  # 4.7 sigma


def test_empirical_conditional_entropy_matches_exact_rate():
    corpus = load_corpus("synthetic:markov?order=2&alphabet=4&length=300000&seed=7")
    (data,) = corpus.docs
    assert set(data) <= set(b"abcd")
    x = np.frombuffer(data, dtype=np.uint8) - ord("a")
    ctx = x[:-2] * 4 + x[1:-1]
    counts = np.zeros((16, 4))
    np.add.at(counts, (ctx, x[2:]), 1)
    row = counts.sum(axis=1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        plug_in = -np.nansum(counts / row.sum() * np.log2(counts / row))
    assert plug_in == pytest.approx(corpus.meta["entropy_rate_bpb"], abs=0.01)
    assert 0 < corpus.meta["entropy_rate_bpb"] < 2.0


def test_synthetic_determinism_and_meta():
    a = load_corpus("synthetic:markov?length=5000&seed=1")
    b = load_corpus("synthetic:markov?length=5000&seed=1")
    c = load_corpus("synthetic:markov?length=5000&seed=2")
    assert a.docs == b.docs and a.meta == b.meta
    assert a.docs != c.docs and a.meta["content_hash"] != c.meta["content_hash"]
    assert a.meta["entropy_rate_bpb"] != c.meta["entropy_rate_bpb"]
    assert len(a.docs[0]) == 5000 and set(a.docs[0]) <= set(markov.SYMBOLS[:16])
    assert a.meta["kind"] == "synthetic" and a.meta["order"] == 2 and a.meta["alphabet"] == 16
    json.dumps(a.meta)
    # defaults are what the docs say
    assert (a.meta["concentration"], a.meta["seed"]) == (0.5, 1)
    assert load_corpus("synthetic:markov?length=3&order=5&alphabet=2").meta["num_bytes"] == 3


def test_synthetic_generation_is_deterministic_at_length():
    # speed is a benchmark's job, not a timed unit test's: here only the length and the seed's determinism
    a = load_corpus("synthetic:markov?length=2000000")
    b = load_corpus("synthetic:markov?length=2000000")
    assert len(a.docs[0]) == 2_000_000 and a.docs[0] == b.docs[0]


# ---------------------------------------------------------------- bad inputs


@pytest.mark.parametrize(
    "source,needle",
    [
        ("synthetic:markov?ordr=2", "allowed: order, alphabet, length, concentration, seed"),
        ("synthetic:markov?order=two", "must be an integer"),
        ("synthetic:markov?concentration=abc", "must be a number"),
        ("synthetic:markov?concentration=nan", "finite"),
        ("synthetic:markov?alphabet=100", "alphabet"),
        ("synthetic:markov?alphabet=1", "alphabet"),
        ("synthetic:markov?concentration=0", "concentration"),
        ("synthetic:markov?length=0", "length"),
        ("synthetic:markov?order=-1", "order"),
        ("synthetic:markov?order=8&alphabet=64", "too large"),
        ("synthetic:markov?order=4&alphabet=32", "2**20 transition probabilities"),
        ("synthetic:markov?order=1&order=2", "twice"),
        ("synthetic:markov?order", "malformed"),
        ("synthetic:makrov", "unknown synthetic kind 'makrov' (did you mean 'markov'?)"),
        ("webtext:foo", "unknown source kind 'webtext'"),
        ("/definitely/not/here.txt", "does not exist"),
        ("pystdlib?x=1", "takes no parameters"),
        ("hf:", "names no dataset"),
        ("", "non-empty"),
    ],
)
def test_bad_sources_raise_one_line_errors(source, needle):
    with pytest.raises(NormlabError) as e:
        load_corpus(source)
    assert "\n" not in str(e.value)
    assert needle in str(e.value)


def test_bad_local_inputs(tmp_path):
    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / "emptydir").mkdir()
    (tmp_path / "bad.jsonl").write_text('{"text": "ok"}\n{not json}\n')
    (tmp_path / "nofield.jsonl").write_text('{"body": "x"}\n')
    (tmp_path / "nonstr.jsonl").write_text('{"text": 3}\n')
    (tmp_path / "ok.txt").write_text("hello")
    cases = [
        (str(tmp_path / "empty.txt"), "is empty"),
        (str(tmp_path / "emptydir"), "is empty"),
        (str(tmp_path / "bad.jsonl"), "line 2 is truncated or corrupted (invalid JSON"),
        (str(tmp_path / "nofield.jsonl"), "no field 'text' (has: body)"),
        (str(tmp_path / "nonstr.jsonl"), "must be a string"),
        (str(tmp_path / "ok.txt") + "?glob=*.py", "takes no parameters"),
        (str(tmp_path / "bad.jsonl") + "?fild=x", "allowed: field"),
        (str(tmp_path / "emptydir") + "?glb=*", "allowed: glob"),
    ]
    for source, needle in cases:
        with pytest.raises(NormlabError) as e:
            load_corpus(source)
        assert "\n" not in str(e.value) and needle in str(e.value), (source, str(e.value))


@pytest.mark.parametrize(
    "kwargs,needle",
    [
        ({"tokenizer": "wordpiece"}, "unknown tokenizer 'wordpiece'; allowed: bytes, bpe:N"),
        ({"tokenizer": "bpe:100"}, "[256, 65536]"),
        ({"tokenizer": "bpe:x"}, "[256, 65536]"),
        ({"tokenizer": "bpe:70000"}, "[256, 65536]"),
        ({"val_fraction": 0}, "val_fraction must be a number in (0, 1)"),
        ({"test_fraction": True}, "test_fraction"),
        ({"val_fraction": 0.6, "test_fraction": 0.5}, "must be < 1"),
    ],
)
def test_bad_prepare_arguments(tmp_path, kwargs, needle):
    with pytest.raises(NormlabError) as e:
        prepare_data("synthetic:markov?length=1000", cache_dir=tmp_path, **kwargs)
    assert "\n" not in str(e.value) and needle in str(e.value)
    assert not list(tmp_path.iterdir())  # nothing was written


def test_tiny_corpus_cannot_be_split(tmp_path):
    (tmp_path / "t.txt").write_bytes(b"ab")
    with pytest.raises(NormlabError, match="at least 3"):
        prepare_data(str(tmp_path / "t.txt"), cache_dir=tmp_path / "c")


def test_tiny_corpus_prepared_whole_for_scoring_only(tmp_path):
    """``whole_ok`` (eval --split all): a corpus too short to split is train = every byte, val/test empty, in an
    entry keyed apart, so preparing it for training after that still refuses it with the split message; a
    corpus that can be split gets the very same entry either way; one token is refused."""
    f = tmp_path / "t.txt"
    f.write_bytes(b"ab")
    d = prepare_data(str(f), cache_dir=tmp_path / "c", whole_ok=True)
    assert d.train.tolist() == [97, 98] and d.val.size == d.test.size == 0
    assert d.split("all").tolist() == [97, 98] and d.bytes_of("all") == 2
    assert prepare_data(str(f), cache_dir=tmp_path / "c", whole_ok=True).split("all").tolist() == [97, 98]  # cached
    with pytest.raises(NormlabError, match="^corpus has 2 bytes; at least 3 are needed for train/val/test splits$"):
        prepare_data(str(f), cache_dir=tmp_path / "c")
    f.write_bytes(b"a")
    with pytest.raises(NormlabError, match="^corpus '.*' has 1 token \\(1 byte\\); at least 2 tokens are needed"):
        prepare_data(str(f), cache_dir=tmp_path / "c", whole_ok=True)
    f.write_bytes(b"abc")
    split, whole = (prepare_data(str(f), cache_dir=tmp_path / "c", whole_ok=w) for w in (False, True))
    assert split.meta["cache_dir"] == whole.meta["cache_dir"] and whole.val.tolist() == [98]


def test_hf_without_datasets_says_install_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # makes `import datasets` raise ImportError
    with pytest.raises(NormlabError) as e:
        load_corpus("hf:wikitext:wikitext-2-raw-v1")
    assert "\n" not in str(e.value) and "hf extra" in str(e.value)


def test_hf_local_directory(tmp_path):
    pytest.importorskip("datasets")
    rows = [{"text": f"row {i} text"} for i in range(5)] + [{"text": ""}]
    (tmp_path / "train.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    corpus = load_corpus(f"hf:{tmp_path}")
    assert corpus.docs == [f"row {i} text".encode() for i in range(5)]
    assert corpus.meta["kind"] == "hf" and corpus.meta["num_rows"] == 6
    with pytest.raises(NormlabError, match="no field 'body'"):
        load_corpus(f"hf:{tmp_path}?field=body")
    with pytest.raises(NormlabError) as e:
        load_corpus(f"hf:{tmp_path}?split=nosuchsplit")
    assert "\n" not in str(e.value)


# ---------------------------------------------------------------- local sources and pystdlib


def test_text_file_is_one_document(tmp_path):
    data = "héllo wörld\n".encode() * 50 + b"\xff\xfe tail"
    (tmp_path / "a.txt").write_bytes(data)
    corpus = load_corpus(str(tmp_path / "a.txt"))
    assert corpus.docs == [data] and corpus.meta["kind"] == "text"
    assert corpus.meta["content_hash"] == hashlib.sha256(len(data).to_bytes(8, "little") + data).hexdigest()


def test_directory_source_sorted_recursive_with_glob(tmp_path):
    write_files(tmp_path, {"b.py": b"B", "a/z.py": b"AZ", "a/b.txt": b"AB", "c.py": b"", ".hidden/x.py": b"H",
                           "bin.py": b"\x00\x01binary", "__pycache__/m.py": b"P"})
    everything = load_corpus(str(tmp_path))
    assert everything.docs == [b"AB", b"AZ", b"B"]  # sorted relative paths; empty, hidden, binary skipped
    assert everything.meta["skipped_binary"] == 1
    only_py = load_corpus(f"{tmp_path}?glob=*.py")
    assert only_py.docs == [b"AZ", b"B"] and only_py.meta["glob"] == "*.py"


def test_jsonl_source_with_field(tmp_path):
    lines = [{"text": "one", "content": "uno"}, {"text": "two", "content": "dos"}, {"text": "", "content": "tres"}]
    (tmp_path / "d.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    assert load_corpus(str(tmp_path / "d.jsonl")).docs == [b"one", b"two"]
    assert load_corpus(f"{tmp_path / 'd.jsonl'}?field=content").docs == [b"uno", b"dos", b"tres"]


@pytest.fixture(scope="module")
def stdlib_corpus() -> Corpus:
    return load_corpus("pystdlib")


def test_pystdlib_meta_and_exclusions(stdlib_corpus):
    meta = stdlib_corpus.meta
    assert meta["kind"] == "pystdlib" and meta["python_version"] == platform.python_version()
    assert meta["num_bytes"] > 1_000_000 and meta["num_docs"] == meta["num_files"] > 100
    root, files = stdlib_files()
    rel = [p.relative_to(root).as_posix() for p in files]
    assert rel == sorted(rel) and "json/__init__.py" in rel and "os.py" in rel
    assert not any(set(r.split("/")[:-1]) & STDLIB_EXCLUDED_DIRS for r in rel)
    nonempty = [p.read_bytes() for p in files if p.stat().st_size > 0]
    assert meta["num_files"] == len(nonempty) and stdlib_corpus.docs == nonempty


# ---------------------------------------------------------------- splits


def test_single_document_split_is_contiguous(tmp_path):
    d = prepare_data("synthetic:markov?length=20000&seed=3", cache_dir=tmp_path, val_fraction=0.1,
                     test_fraction=0.05)
    doc = load_corpus("synthetic:markov?length=20000&seed=3").docs[0]
    parts = [split_bytes_of(d, s) for s in SPLITS]
    assert b"".join(parts) == doc
    assert [len(p) for p in parts] == [17000, 2000, 1000]
    assert d.split_bytes == {"train": 17000, "val": 2000, "test": 1000}
    assert d.entropy_floor_bpb == pytest.approx(d.meta["entropy_rate_bpb"]) and d.entropy_floor_bpb > 0


def reference_split(docs, val_fraction, test_fraction):
    """Independent restatement of the documented hash rule (no fallback needed for the corpus used)."""
    out = {s: [] for s in SPLITS}
    for doc in docs:
        u = int(hashlib.sha256(doc).hexdigest()[:16], 16) / 2**64
        out["test" if u < test_fraction else "val" if u < test_fraction + val_fraction else "train"].append(doc)
    return out


def test_multi_document_split_by_content_hash(tmp_path):
    files = {f"f{i:03d}.txt": f"document {i}\n".encode() * (1 + i % 7) for i in range(200)}
    write_files(tmp_path / "corpus", files)
    d = prepare_data(str(tmp_path / "corpus"), cache_dir=tmp_path / "cache", val_fraction=0.1, test_fraction=0.1)
    docs = [files[k] for k in sorted(files)]
    ref = reference_split(docs, 0.1, 0.1)
    assert all(ref[s] for s in SPLITS)
    for s in SPLITS:
        assert split_bytes_of(d, s) == b"".join(ref[s])
        assert d.meta["split_docs"][s] == len(ref[s])
    # disjoint and covering: the splits' documents are a partition of the corpus
    assert Counter(doc for s in SPLITS for doc in ref[s]) == Counter(docs)
    assert sum(d.split_bytes.values()) == sum(len(x) for x in docs)


def test_split_is_stable_when_documents_are_added():
    docs = [f"doc {i}".encode() for i in range(100)]
    before = split_docs(docs, 0.1, 0.1)
    after = split_docs(docs + [f"new {i}".encode() for i in range(50)], 0.1, 0.1)
    for s in SPLITS:
        assert set(before[s]) <= set(after[s])


def test_split_fallback_makes_every_split_nonempty():
    docs = [b"x", b"yy", b"zzz"]
    parts = split_docs(docs, 1e-9, 1e-9)  # the hash rule puts everything in train
    assert {s: len(v) for s, v in parts.items()} == {"train": 1, "val": 1, "test": 1}
    assert parts["test"] == [b"zzz"] and parts["val"] == [b"yy"]  # taken from the end
    many = split_docs([bytes([i]) * 3 for i in range(50)], 1e-9, 1e-9)
    assert all(many[s] for s in SPLITS) and sum(len(v) for v in many.values()) == 50


def test_two_documents_are_split_as_one_stream():
    parts = split_docs([b"a" * 50, b"b" * 50], 0.1, 0.1)
    assert parts == {"train": [b"a" * 50 + b"b" * 30], "val": [b"b" * 10], "test": [b"b" * 10]}


def test_split_words_uses_lm_eval_definition(tmp_path):
    texts = ["a b  c", " lead space", "tab\tand\nnewline ", "x" * 20]
    (tmp_path / "w.jsonl").write_text("\n".join(json.dumps({"text": t}) for t in texts * 30))
    d = prepare_data(str(tmp_path / "w.jsonl"), cache_dir=tmp_path / "c", val_fraction=0.2, test_fraction=0.2)
    corpus_docs = [t.encode() for t in texts * 30]
    total = sum(len(re.split(r"\s+", t)) for t in texts * 30)
    assert sum(d.split_words.values()) == total
    assert sum(d.split_bytes.values()) == sum(len(x) for x in corpus_docs)


# ---------------------------------------------------------------- tokenizers


@pytest.fixture(scope="module")
def bpe() -> BPETokenizer:
    rng = np.random.default_rng(0)
    syllables = ["ka", "lo", "mi", "ne", "ru", "sé", "to", "vu", "ß", "ing", "th"]
    words = ["".join(rng.choice(syllables, size=rng.integers(1, 4))) for _ in range(3000)]
    text = [("def f(x):\n    return x + 1  # héllo\n" * 20 + " ".join(words[i::40]) + "\n").encode()
            for i in range(40)]
    return BPETokenizer.train(text, 400)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_bpe_round_trips_arbitrary_bytes(bpe, data):
    ids = bpe.encode(data)
    assert bpe.decode_bytes(ids) == data
    assert int(bpe.token_bytes()[ids].sum()) == len(data)


def test_bpe_edge_cases(bpe):
    samples = [b"", b"\xff", b"\xc3", b"ok\xe2\x82", b"\xed\xb2\x80", b"\x00\x01", "日本語 ☃\r\n".encode(),
               b"\x80" * 5 + "héllo".encode() + b"\xf0\x9f\x98", bytes(range(256)) * 3]
    for s in samples:
        ids = bpe.encode(s)
        assert bpe.decode_bytes(ids) == s and int(bpe.token_bytes()[ids].sum()) == len(s)
    merged = bpe.encode(b"def f(x):\n    return x + 1\n")
    assert len(merged) < 20  # merges are used on text like the training data
    assert bpe.vocab_size == 400 and bpe.name == "bpe:400"
    assert all(bpe.token_bytes() >= 1)


def test_bpe_long_document_in_pieces(bpe):
    from normlab.data import tokenizer as tok_mod

    data = ("é" * 700_000 + "\n" + "ab" * 300_000).encode() + b"\xff"
    ids = bpe.encode(data)
    assert bpe.decode_bytes(ids) == data and len(list(tok_mod._pieces(data))) >= 2
    assert int(bpe.token_bytes()[ids].sum()) == len(data)


def test_bytes_tokenizer():
    tok = load_tokenizer("bytes")
    data = bytes(range(256)) + b"abc"
    ids = tok.encode(data, return_array=True)
    assert ids.dtype == np.uint16 and list(ids[:256]) == list(range(256))
    assert tok.decode_bytes(ids) == data and tok.vocab_size == 256
    assert (tok.token_bytes() == 1).all() and tok.token_bytes().shape == (256,)
    with pytest.raises(NormlabError, match=r"\[0, 256\)"):
        tok.decode([300])


def test_load_tokenizer_errors_and_saved_bpe(tmp_path, bpe):
    bpe.save(tmp_path / "tokenizer.json")
    loaded = load_tokenizer(str(tmp_path / "tokenizer.json"))
    data = b"def g(y):\n    return y\n"
    assert list(loaded.encode(data)) == list(bpe.encode(data)) and loaded.vocab_size == 400
    assert load_tokenizer(tmp_path).vocab_size == 400  # a directory holding tokenizer.json
    from tokenizers import Tokenizer as HF
    from tokenizers import models

    HF(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]")).save(str(tmp_path / "wl.json"))
    (tmp_path / "junk.json").write_text("{not json")
    for arg, needle in [("bpe:512", "must be trained"), (str(tmp_path / "missing.json"), "does not exist"),
                        (str(tmp_path / "wl.json"), "not a lossless byte-level BPE"),
                        (str(tmp_path / "junk.json"), "is truncated or corrupted (invalid JSON"),
                        ("sentencepiece", "unknown tokenizer")]:
        with pytest.raises(NormlabError) as e:
            load_tokenizer(arg)
        assert "\n" not in str(e.value) and needle in str(e.value), (arg, str(e.value))


# ---------------------------------------------------------------- prepare_data and the cache


@pytest.mark.parametrize("tok", ["bytes", "bpe:300"])
def test_token_bytes_sum_equals_split_bytes(tmp_path, tok):
    files = {f"{i}.txt": f"ünïcode line {i}\n".encode() * 30 + bytes([0x80 + i]) for i in range(30)}
    write_files(tmp_path / "c", files)
    for source in [str(tmp_path / "c"), "synthetic:markov?length=30000&seed=4"]:
        d = prepare_data(source, tok, cache_dir=tmp_path / "cache")
        assert d.vocab_size == len(d.token_bytes) == d.tokenizer.vocab_size
        for s in SPLITS:
            arr = d.split(s)
            assert isinstance(arr, np.memmap) and arr.dtype == np.uint16 and arr.ndim == 1 and arr.size > 0
            assert int(d.token_bytes[arr].sum()) == d.split_bytes[s] == len(split_bytes_of(d, s))
        assert sum(d.split_bytes.values()) == load_corpus(source).meta["num_bytes"]
        json.dumps(d.meta)
        assert d.meta["tokenizer"] == tok and Path(d.meta["cache_dir"]).is_dir()


def test_bpe_is_trained_on_train_split_only(tmp_path):
    train = ("the cat sat on the mat. " * 400).encode()
    secret = ("qzxv" * 2000).encode()  # only in the val/test bytes at the end
    (tmp_path / "t.txt").write_bytes(train + secret)
    d = prepare_data(str(tmp_path / "t.txt"), "bpe:320", cache_dir=tmp_path / "c", val_fraction=0.3,
                     test_fraction=0.3)
    assert d.split_bytes["train"] < len(train)
    vocab = [d.tokenizer.decode_bytes([i]) for i in range(d.vocab_size)]
    assert not any(b"qz" in v or b"zx" in v or b"xv" in v for v in vocab)
    assert any(b"cat" in v for v in vocab)
    assert (Path(d.meta["cache_dir"]) / "tokenizer.json").is_file()


def test_cache_reuse_does_not_retokenize(tmp_path, monkeypatch):
    first = prepare_data("synthetic:markov?length=20000", "bpe:300", cache_dir=tmp_path)
    entry = Path(first.meta["cache_dir"])
    mtimes = {p.name: p.stat().st_mtime_ns for p in entry.iterdir()}

    def boom(*a, **k):
        raise AssertionError("cache entry was rebuilt")

    monkeypatch.setattr(cache_mod, "_build_entry", boom)
    second = prepare_data("synthetic:markov?length=20000", "bpe:300", cache_dir=tmp_path)
    assert {p.name: p.stat().st_mtime_ns for p in entry.iterdir()} == mtimes
    for s in SPLITS:
        np.testing.assert_array_equal(first.split(s), second.split(s))
    assert second.meta == first.meta and second.tokenizer.name == "bpe:300"
    with pytest.raises(ValueError):
        second.train[0] = 1  # read-only memmap
    assert [p.name for p in tmp_path.iterdir()] == [entry.name]  # no temp dirs left behind


def test_prepare_with_a_saved_tokenizer_reuses_it(tmp_path):
    a = prepare_data("synthetic:markov?length=20000&seed=1", "bpe:300", cache_dir=tmp_path)
    saved = Path(a.meta["cache_dir"]) / "tokenizer.json"
    b = prepare_data("synthetic:markov?length=20000&seed=2", str(saved), cache_dir=tmp_path)
    assert b.meta["tokenizer_spec"].startswith("bpe-file:") and b.vocab_size == a.vocab_size
    data = load_corpus("synthetic:markov?length=20000&seed=2").docs[0]
    assert np.array_equal(np.asarray(b.train), a.tokenizer.encode(data[: b.split_bytes["train"]], return_array=True))
    again = prepare_data("synthetic:markov?length=20000&seed=2", Path(saved).parent, cache_dir=tmp_path)
    assert again.meta["cache_dir"] == b.meta["cache_dir"]


def test_jsonl_lone_surrogate_is_a_clean_error(tmp_path):
    (tmp_path / "s.jsonl").write_text('{"text": "bad \\ud800 text"}\n')
    with pytest.raises(NormlabError, match="line 1: text is not valid Unicode"):
        load_corpus(str(tmp_path / "s.jsonl"))


def test_cache_key_depends_on_tokenizer_fractions_and_content(tmp_path):
    a = prepare_data("synthetic:markov?length=5000", cache_dir=tmp_path)
    b = prepare_data("synthetic:markov?length=5000", cache_dir=tmp_path, val_fraction=0.1)
    c = prepare_data("synthetic:markov?length=5000&seed=9", cache_dir=tmp_path)
    d = prepare_data("synthetic:markov?length=5000", "bpe:256", cache_dir=tmp_path)
    assert len({x.meta["cache_dir"] for x in (a, b, c, d)}) == 4
    assert d.vocab_size == 256 and d.train.size == a.train.size  # bpe:256 has no merges: one token per byte
    assert d.tokenizer.decode_bytes(d.train) == a.tokenizer.decode_bytes(a.train)


@pytest.mark.parametrize("damage", ["truncate_val", "delete_meta", "delete_tokenizer", "garble_meta",
                                    "garble_tokenizer", "deep_meta", "huge_int_meta", "list_meta"])
def test_corrupt_cache_entry_is_rebuilt(tmp_path, damage, monkeypatch):
    good = prepare_data("synthetic:markov?length=8000", "bpe:280", cache_dir=tmp_path)
    entry = Path(good.meta["cache_dir"])
    expected = {s: np.array(good.split(s)) for s in SPLITS}
    del good
    if damage == "truncate_val":
        with open(entry / "val.bin", "r+b") as f:
            f.truncate(10)
    elif damage == "delete_meta":
        (entry / "meta.json").unlink()
    elif damage == "delete_tokenizer":
        (entry / "tokenizer.json").unlink()
    elif damage == "garble_meta":
        (entry / "meta.json").write_text("{")
    elif damage == "deep_meta":  # read through the bounded reader (was json.loads: RecursionError past the cache)
        (entry / "meta.json").write_text("[" * 100_000 + "]" * 100_000)
    elif damage == "huge_int_meta":
        (entry / "meta.json").write_text('{"cache_version": ' + "1" * 5001 + "}")
    elif damage == "list_meta":
        (entry / "meta.json").write_text("[1]")
    else:
        (entry / "tokenizer.json").write_text('{"model": ')
    calls = []
    real = cache_mod._build_entry
    monkeypatch.setattr(cache_mod, "_build_entry", lambda *a, **k: calls.append(1) or real(*a, **k))
    again = prepare_data("synthetic:markov?length=8000", "bpe:280", cache_dir=tmp_path)
    assert calls == [1] and again.meta["cache_dir"] == str(entry)
    for s in SPLITS:
        np.testing.assert_array_equal(again.split(s), expected[s])
    assert sorted(p.name for p in tmp_path.iterdir()) == [entry.name]


def test_default_cache_dir_from_env(tmp_path, monkeypatch):
    monkeypatch.setenv("NORMLAB_CACHE_DIR", str(tmp_path / "envcache"))
    d = prepare_data("synthetic:markov?length=2000")
    assert Path(d.meta["cache_dir"]).parent == tmp_path / "envcache"
    meta = json.loads((Path(d.meta["cache_dir"]) / "meta.json").read_text())
    assert meta["split_tokens"] == {s: int(d.split(s).size) for s in SPLITS}
    assert os.path.getsize(Path(d.meta["cache_dir"]) / "train.bin") == 2 * d.train.size


_CHILD = """
import hashlib, sys
import numpy as np
from normlab.data import prepare_data
d = prepare_data("synthetic:markov?length=100000&seed=11", "bpe:300", cache_dir=sys.argv[1])
print(hashlib.sha256(np.asarray(d.train).tobytes()).hexdigest())
"""


def test_concurrent_builders_agree(tmp_path):
    import subprocess

    import normlab

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(normlab.__file__).parents[1]),
                                                         os.environ.get("PYTHONPATH", "")])}
    procs = [subprocess.Popen([sys.executable, "-c", _CHILD, str(tmp_path)], stdout=subprocess.PIPE, env=env,
                              text=True) for _ in range(2)]
    digests = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert all(p.returncode == 0 for p in procs) and len(digests[0]) == 64
    assert digests[0] == digests[1]
    assert len(list(tmp_path.iterdir())) == 1  # one entry, no temp or trash dirs left
    d = prepare_data("synthetic:markov?length=100000&seed=11", "bpe:300", cache_dir=tmp_path)
    assert hashlib.sha256(np.asarray(d.train).tobytes()).hexdigest() == digests[0]


def test_losing_a_build_race_uses_the_winners_entry(tmp_path, monkeypatch):
    real = cache_mod._build_entry
    winner = {}

    def build_then_lose(tmp, corpus, tok_spec, tok_arg, key, *fractions):
        real(tmp, corpus, tok_spec, tok_arg, key, *fractions)
        other = tmp_path / "other"
        other.mkdir()
        real(other, corpus, tok_spec, tok_arg, key, *fractions)
        entry = tmp_path / cache_mod._entry_name(corpus, tok_spec, key)
        os.replace(other, entry)  # another process finished first
        winner["ino"] = (entry / "train.bin").stat().st_ino

    monkeypatch.setattr(cache_mod, "_build_entry", build_then_lose)
    d = prepare_data("synthetic:markov?length=5000", cache_dir=tmp_path)
    assert (Path(d.meta["cache_dir"]) / "train.bin").stat().st_ino == winner["ino"]
    assert len(list(tmp_path.iterdir())) == 1
