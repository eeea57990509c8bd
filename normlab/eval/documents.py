"""Harness-exact evaluation (``normlab eval --documents``): each document scored on its own, every token of it.

EleutherAI lm-evaluation-harness, ``loglikelihood_rolling`` (``lm_eval.utils.get_rolling_token_windows`` with
``context_len=1`` and ``make_disjoint_window``) on a perplexity task such as wikitext. For one document of tokens
``t[0..n-1]``, a document-start token ``p`` and a window length ``L``, with ``s = [p] + t``:

- the first window feeds ``s[0 : min(L, n)]`` and scores all of its ``min(L, n)`` predictions (``t[0]`` is
  conditioned on ``p`` alone);
- each later window predicts the next ``m = min(n - done, L)`` tokens and feeds the ``L`` tokens ending just
  before the last of them (``s[end - L : end]``, ``end = done + m``): disjoint predictions, the last window
  re-reading earlier tokens as context so it is always full length.

Totals are pooled over documents as the harness aggregates them (``weighted_perplexity``, ``bits_per_byte``)::

    bpb             = -sum(loglik) / (sum(bytes) * ln 2),  bytes = len(doc.encode("utf-8"))
    byte_perplexity = exp(-sum(loglik) / sum(bytes))
    word_perplexity = exp(-sum(loglik) / sum(words)),      words = len(re.split(r"\\s+", doc))   (per document)

Shapes: a document is a 1-D token array ``[n]``; windows are ``(begin, end, n_scored)`` over ``s`` in the format
of ``normlab.eval.lm.windows`` (input ``s[begin:end]``, targets ``s[begin+1:end+1]``, the last ``n_scored`` scored).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import torch

from normlab.data import load_corpus, split_docs
from normlab.errors import NormlabError
from normlab.eval.lm import lm_metrics, window_nll
from normlab.rundir.readers import read_data_info, run_data

_WS = re.compile(r"\s+")


def harness_words(text: str) -> int:
    """Words of one document as lm-evaluation-harness counts them: ``len(re.split(r"\\s+", text))``."""
    return len(_WS.split(text))


def doc_windows(n: int, context: int) -> list[tuple[int, int, int]]:
    """Windows over ``s = [prefix] + t`` (``len(t) == n``) scoring every token of ``t`` once (module docstring)."""
    if context < 1:
        raise NormlabError(f"--context must be >= 1, got {context}")
    if n < 1:
        return []
    first = min(context, n)
    out = [(0, first, first)]
    done = first
    while done < n:
        m = min(n - done, context)
        end = done + m
        out.append((end - context, end, m))
        done = end
    return out


@torch.no_grad()
def score_documents(model: torch.nn.Module, docs: list[np.ndarray], prefix: int, *, context: int,
                    batch_size: int = 16) -> list[float]:
    """Negative log-likelihood (nats, float64) of every token of each document, one total per document."""
    was_training = model.training
    model.eval()
    totals = []
    for t in docs:
        s = np.concatenate([np.array([prefix], dtype=np.int64), np.asarray(t, dtype=np.int64)])
        totals.append(sum(float(nll.sum()) for nll, _ in window_nll(model, s, doc_windows(len(t), context),
                                                                     batch_size)))
    model.train(was_training)
    return totals


def evaluate_documents(model: torch.nn.Module, docs: list[bytes], encode, prefix: int, *, context: int,
                       batch_size: int = 16) -> dict:
    """Harness-exact metrics over ``docs`` (raw bytes; ``encode(bytes) -> ids``), pooled over documents."""
    docs = [d for d in docs if d]
    if not docs:
        raise NormlabError("no non-empty documents to score")
    ids = [np.asarray(encode(d), dtype=np.int64) for d in docs]
    nll = score_documents(model, ids, prefix, context=context, batch_size=batch_size)
    n_bytes = sum(len(d) for d in docs)
    words = sum(harness_words(d.decode("utf-8", "replace")) for d in docs)
    m = lm_metrics(sum(nll), sum(len(i) for i in ids), n_bytes, words)
    m["documents"] = len(docs)
    return m


def split_documents(run_dir, cfg, data, split: str, source: str | None = None) -> list[bytes]:
    """The documents of ``split``, as the data layer splits them (``split_docs``), of the corpus ``data`` was
    prepared from: ``source`` (``--data``), else the run's recorded local path (``data.json``), else
    ``cfg.data.source``; checked against ``data``'s content hash. ``split="all"``: every document of the corpus, in
    corpus order."""
    if source is None:
        info = read_data_info(run_dir) or {}
        resolved = info.get("resolved_source")
        source = resolved if resolved and Path(resolved.partition("?")[0]).exists() else cfg.data.source
    corpus = load_corpus(source)
    if data.meta.get("content_hash") not in (None, corpus.meta["content_hash"]):
        raise NormlabError(f"corpus '{source}' is not the one the evaluation data was prepared from")
    if split == "all":
        return list(corpus.docs)
    return split_docs(corpus.docs, cfg.data.val_fraction, cfg.data.test_fraction)[split]


PROMPT_TOKENS = 32  # the default prompt's length, at most half the context


def validation_prompt(run_dir, cfg, seed: int = 0) -> tuple[bytes, dict]:
    """The default prompt of ``normlab generate`` / ``normlab.generate``: the beginning of a validation document of
    the run's own corpus (document ``seed mod n`` of the ``val`` split, ``split_documents``), its first
    ``min(32, context // 2)`` tokens; a corpus of fewer than 3 documents has one validation document, the slice of
    the text the split rule gives it. Returns ``(prompt bytes, {"split", "document", "documents", "tokens",
    "source"})`` (which document it was: the command says so)."""
    data = run_data(run_dir, cfg, need_window=())
    docs = [d for d in split_documents(run_dir, cfg, data, "val") if d]
    if not docs:
        raise NormlabError(f"the validation split of {run_dir} has no text to start from; give --prompt TEXT")
    i = seed % len(docs)
    ids = data.tokenizer.encode(docs[i])[: max(1, min(PROMPT_TOKENS, cfg.model.context // 2))]
    return data.tokenizer.decode_bytes(ids), {"split": "val", "document": i, "documents": len(docs),
                                              "tokens": len(ids), "source": cfg.data.source}
