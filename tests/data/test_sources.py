"""normlab.data.sources: the ``english`` corpus (English prose of Python's documentation)."""

from __future__ import annotations

import collections
import math
import platform
import re
from pathlib import Path

import pytest

from normlab.data.sources import english_text, load_corpus
from normlab.errors import NormlabError
import os
from tests.helpers import assert_bad_input, run_inproc

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_english_is_one_deterministic_document_of_prose():
    a, b = load_corpus("english"), load_corpus("english")
    assert a.meta["content_hash"] == b.meta["content_hash"] and len(a.docs) == 1
    assert a.meta["kind"] == "english" and a.meta["num_bytes"] > 200_000
    text = a.docs[0].decode("utf-8")
    assert text == english_text()
    assert not any(line.startswith((" ", "\t")) for line in text.splitlines())  # no code or grammar blocks
    words = collections.Counter(re.findall(r"[a-z]+", text.lower()))
    assert words.most_common(1)[0][0] == "the" and words["the"] > 0.04 * sum(words.values())
    letters = sum(ch.isalpha() or ch in " \n.,;:'\"()-" for ch in text)
    assert letters / len(text) > 0.9  # prose, not symbols


def test_english_takes_no_parameters_and_is_listed_in_errors():
    with pytest.raises(NormlabError, match="takes no parameters"):
        load_corpus("english?x=1")
    with pytest.raises(NormlabError, match="english"):
        load_corpus("englsh:foo")


def test_docs_state_the_measured_size_and_unigram_entropy():
    """docs/data.md states the corpus size and entropy of the Python it was measured on: exact on that Python;
    on any other supported Python (another ``pydoc_data.topics``) the stated version is not this one and the
    corpus is still English prose of about that size and entropy."""
    data = load_corpus("english").docs[0]
    n = len(data)
    h = -sum(c / n * math.log2(c / n) for c in collections.Counter(data).values())
    text = (DOCS / "data.md").read_text()
    m = re.search(r"\(Python (\d+\.\d+\.\d+)\): \d+ topics, ([\d,]+) bytes, byte unigram entropy ([\d.]+) "
                  r"bits/byte", text)
    assert m, "docs/data.md no longer states the english corpus's measured size and entropy"
    version, size, entropy = m.group(1), int(m.group(2).replace(",", "")), float(m.group(3))
    if version == platform.python_version():
        assert (size, entropy) == (n, round(h, 3))
    else:
        assert abs(n - size) < 0.3 * size and abs(h - entropy) < 0.2


pytestmark = pytest.mark.usefixtures("one_thread")


def test_fifo_and_device_sources_are_refused(tmp_path, cache):
    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    for src in (str(fifo), "/dev/zero"):
        out = tmp_path / "o"
        assert_bad_input(run_inproc("train", "tiny", "--set", f"data.source={src}", "--out", str(out), cache=cache),
                         "not a regular file or directory", src)
        assert not out.exists()
