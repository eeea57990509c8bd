"""Data layer: corpora, tokenizers, deterministic splits and the token cache (docs/data.md).

>>> data = prepare_data("synthetic:markov?order=2&length=100000", "bytes")  # doctest: +SKIP
>>> data.train[:8], data.entropy_floor_bpb                                     # doctest: +SKIP
"""

from normlab.data.cache import PreparedData, default_cache_dir, prepare_data, split_docs
from normlab.data.sources import Corpus, content_hash, load_corpus
from normlab.data.tokenizer import BPETokenizer, BytesTokenizer, Tokenizer, load_tokenizer

__all__ = [
    "BPETokenizer",
    "BytesTokenizer",
    "Corpus",
    "PreparedData",
    "Tokenizer",
    "content_hash",
    "default_cache_dir",
    "load_corpus",
    "load_tokenizer",
    "prepare_data",
    "split_docs",
]
