"""The unigram floor: the loss of the best context-free model of a training split, in bits per byte.

Byte-level: ``H1 = -sum_b p(b) log2 p(b)`` over the training split's bytes, ``p(b)`` the byte frequencies. A
tokenized split: the token unigram entropy times tokens per byte, ``H1_tok * n_tokens / n_bytes`` (tokens with
no bytes, such as a document separator, count as tokens). A model whose loss is at this floor learned only
frequencies ("did not learn", docs/compare.md). Shapes: ``ids [n_tokens]`` integer token ids.
"""

from __future__ import annotations

import numpy as np


def unigram_bpb(ids: np.ndarray, n_bytes: int, vocab_size: int | None = None) -> float | None:
    """Exact unigram entropy of ``ids`` in bits per byte of the ``n_bytes`` bytes they encode (None if empty)."""
    ids = np.asarray(ids)
    if ids.size == 0 or n_bytes <= 0:
        return None
    counts = np.bincount(ids.astype(np.int64, copy=False), minlength=vocab_size or 0).astype(np.float64)
    p = counts[counts > 0] / ids.size
    h_token = float(-(p * np.log2(p)).sum())
    return h_token * ids.size / n_bytes
