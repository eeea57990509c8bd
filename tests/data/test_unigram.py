"""normlab.data.unigram: the unigram floor ("did not learn") against closed forms and scipy's entropy."""

from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pytest
from scipy.stats import entropy

from normlab.data import prepare_data
from normlab.data.unigram import unigram_bpb

P = {"a": 0.5, "b": 0.25, "c": 0.125, "d": 0.125}  # entropy 1.75 bits per symbol


def test_closed_form_on_exact_counts():
    ids = np.array([0] * 8 + [1] * 4 + [2] * 2 + [3] * 2, dtype=np.uint16)  # p = 1/2, 1/4, 1/8, 1/8
    assert unigram_bpb(ids, n_bytes=16) == pytest.approx(1.75, abs=1e-12)  # one byte per token
    assert unigram_bpb(ids, n_bytes=32, vocab_size=300) == pytest.approx(0.875, abs=1e-12)  # 2 bytes per token
    assert unigram_bpb(np.zeros(10, dtype=np.uint16), n_bytes=10) == 0.0  # one symbol: nothing to learn
    assert unigram_bpb(np.array([], dtype=np.uint16), n_bytes=0) is None


@pytest.fixture(scope="module")
def iid_corpus(tmp_path_factory):
    """200,000 bytes drawn i.i.d. from P (a text file corpus), so its unigram entropy is 1.75 bits/byte up to
    sampling error (sd about 0.003)."""
    d = tmp_path_factory.mktemp("iid")
    rng = random.Random(0)
    text = "".join(rng.choices(list(P), weights=list(P.values()), k=200_000))
    (d / "iid.txt").write_text(text)
    return d


def test_bytes_split_matches_scipy_and_the_known_distribution(iid_corpus):
    data = prepare_data(str(iid_corpus / "iid.txt"), "bytes", cache_dir=iid_corpus / "cache")
    train = np.asarray(data.train)
    counts = Counter(train.tolist())
    ref = entropy(list(counts.values()), base=2)  # bits per token = bits per byte for bytes
    assert data.unigram_bpb == pytest.approx(ref, rel=1e-12)
    assert data.unigram_bpb == pytest.approx(1.75, abs=0.01)
    assert data.split_bytes["train"] == train.size


def test_bpe_split_is_token_entropy_times_tokens_per_byte(iid_corpus):
    (iid_corpus / "short.txt").write_text((iid_corpus / "iid.txt").read_text()[:20_000])
    data = prepare_data(str(iid_corpus / "short.txt"), "bpe:264", cache_dir=iid_corpus / "cache")
    train = np.asarray(data.train)
    n_bytes = int(data.token_bytes[train].sum())
    assert n_bytes == data.split_bytes["train"] and train.size < n_bytes  # merges: fewer tokens than bytes
    ref = entropy(list(Counter(train.tolist()).values()), base=2) * train.size / n_bytes
    assert data.unigram_bpb == pytest.approx(ref, rel=1e-12)
    # a context-free model over tokens cannot beat the byte-level unigram entropy of an i.i.d. source
    assert data.unigram_bpb >= 1.75 - 0.03
