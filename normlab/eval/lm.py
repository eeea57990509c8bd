"""Language-model evaluation: loss, bits-per-byte and perplexities (EleutherAI lm-evaluation-harness definitions).

    bpb              = -sum(loglik) / (num_bytes * ln 2)     (bits per byte; lm-eval calls it bits_per_byte)
    byte_perplexity  = 2 ** bpb
    token_perplexity = exp(-sum(loglik) / num_tokens)
    word_perplexity  = exp(-sum(loglik) / num_words),  words = re.split(r"\\s+", text)

pooled over the scored text. Windows: with ``stride == context`` (default) non-overlapping rolling windows, each
token scored once with the tokens before it in its window as context (the first token of the split has no context
and is not scored). With ``stride < context`` a strided sliding window: each token is still scored once, with up to
``context - stride`` extra tokens of context (the HF perplexity recipe).
"""

from __future__ import annotations

import contextlib
import math
import re
from typing import Callable, Iterator

import numpy as np
import torch
import torch.nn.functional as F

from normlab.errors import NormlabError


def windows(n: int, context: int, stride: int) -> list[tuple[int, int, int]]:
    """``(begin, end, n_scored)``: model input ``tokens[begin:end]``, targets ``tokens[begin+1:end+1]``, of which
    the last ``n_scored`` are scored. Every target position ``1..n-1`` is scored exactly once."""
    if not 1 <= stride <= context:
        raise NormlabError(f"--stride must be in [1, context={context}], got {stride}")
    out, prev_end, begin = [], 0, 0
    last = n - 1  # number of targets
    while prev_end < last:
        end = min(begin + context, last)
        out.append((begin, end, end - prev_end))
        prev_end = end
        begin += stride
    return out


def spread_windows(n: int, context: int, max_tokens: int) -> list[tuple[int, int, int]]:
    """``ceil(max_tokens / context)`` non-overlapping windows of ``context`` targets spread evenly over a split of
    ``n`` tokens (first at 0, last ending at the split's end), each scored in full: a fixed sample of the whole
    split rather than its first ``max_tokens`` tokens. Falls back to ``windows(n, context, context)`` when the
    split is not longer than the sample."""
    k = -(-max_tokens // context)
    if n - 1 <= k * context:
        return windows(n, context, context)
    starts = np.linspace(0, n - 1 - context, k).round().astype(np.int64)
    return [(int(b), int(b) + context, context) for b in starts]


def window_batches(tokens: np.ndarray, wins: list[tuple[int, int, int]], batch_size: int
                   ) -> Iterator[tuple[list[tuple[int, int, int]], torch.Tensor, torch.Tensor]]:
    """Group consecutive ``wins`` of equal input length into batches of at most ``batch_size``; yields
    ``(windows, x [b, L], y [b, L])`` with inputs ``tokens[begin:end]`` and targets shifted by one (int64)."""
    i = 0
    while i < len(wins):
        L = wins[i][1] - wins[i][0]
        j = i
        while j < len(wins) and j - i < batch_size and wins[j][1] - wins[j][0] == L:
            j += 1
        batch = wins[i:j]
        x = torch.from_numpy(np.stack([tokens[b:e].astype(np.int64) for b, e, _ in batch]))
        y = torch.from_numpy(np.stack([tokens[b + 1 : e + 1].astype(np.int64) for b, e, _ in batch]))
        yield batch, x, y
        i = j


@torch.no_grad()
def score_tokens(model: torch.nn.Module, tokens: np.ndarray, *, context: int, stride: int | None = None,
                 batch_size: int = 16, max_tokens: int | None = None, spread: bool = False,
                 progress: Callable[[int, int], None] | None = None, precision: str = "fp32"
                 ) -> tuple[float, np.ndarray]:
    """Sum of negative log-likelihoods (nats, float64) and the array of scored target ids.

    ``tokens``: 1-D ids ``[N]``; ``max_tokens`` truncates the split to its first ``max_tokens + 1`` tokens, or
    with ``spread`` samples that many targets in windows spread over the whole split (``spread_windows``).
    ``progress(done, total)``: called after each scored window with the targets scored so far and in all.
    """
    n = len(tokens)
    if n < 2:
        raise NormlabError(f"split has {n} token(s); at least 2 are needed to evaluate")
    stride = stride or context
    if max_tokens and spread:
        wins = spread_windows(n, context, max_tokens)
    else:
        if max_tokens:
            tokens = tokens[: max_tokens + 1]
            n = len(tokens)
        wins = windows(n, context, stride)
    was_training = model.training
    model.eval()
    sums: list[torch.Tensor] = []
    scored: list[np.ndarray] = []
    n_targets, done = sum(k for _, _, k in wins), 0
    for nll, y in window_nll(model, tokens, wins, batch_size, precision=precision):
        sums.append(nll.sum())  # on the device: every window's sum is read at the end, in one transfer
        scored.append(y.numpy())
        done += len(y)
        if progress is not None:
            progress(done, n_targets)
    model.train(was_training)
    total = 0.0
    for v in torch.stack(sums).tolist():  # the windows' float64 sums added on the host, in order
        total += v
    return total, np.concatenate(scored)


def window_nll(model: torch.nn.Module, tokens: np.ndarray, wins: list[tuple[int, int, int]],
               batch_size: int, precision: str = "fp32") -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """For each window ``(begin, end, k)`` of ``wins`` (format of ``windows``), in order: the float64 negative
    log-likelihoods ``[k]`` of its last ``k`` targets (on the model's device: the logits never leave it) and those
    target ids ``[k]`` (CPU). The caller sets eval mode and ``no_grad``; the model runs on the device of its
    parameters (a parameterless model on the CPU). ``precision`` ``bf16`` on a CUDA device: the forward under bf16
    autocast, as the run trained (the cross-entropy in fp32); elsewhere fp32, as always."""
    first = next(model.parameters(), None)
    dev = first.device if first is not None else torch.device("cpu")
    amp = (torch.autocast(device_type="cuda", dtype=torch.bfloat16) if dev.type == "cuda" and precision == "bf16"
           else contextlib.nullcontext())
    for batch, x, y in window_batches(tokens, wins, batch_size):
        L = x.shape[1]
        with amp:
            logits = model(x.to(dev))
        nll = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), y.to(dev).reshape(-1), reduction="none")
        nll = nll.view(len(batch), L).double()
        for r, (_, _, k) in enumerate(batch):
            yield nll[r, L - k :], y[r, L - k :]


MAX_WORD_NLL = 700.0
"""Nats per word above which ``exp`` leaves float64 (``exp(709.8)`` overflows): word perplexity is then null."""


def word_perplexity(sum_nll: float, n_words: int, n_bytes: int) -> tuple[float | None, str | None]:
    """``(exp(sum_nll / n_words), None)``, or ``(None, reason)`` when the number would mean nothing: a text with
    no whitespace has one "word" per document (the harness rule ``len(re.split(r"\\s+", text))``), so its "word"
    perplexity is the exponential of the whole text's NLL (1e304 on a synthetic corpus, where the old clamp
    stopped it), as is any text with more than 700 nats per word."""
    per_word = sum_nll / n_words if n_words else math.inf
    if n_words < 2 or per_word > MAX_WORD_NLL:
        return None, (f"{n_words} whitespace-separated word{'s' if n_words != 1 else ''} in {n_bytes} bytes "
                      f"({per_word:.3g} nats per word): the text has (almost) no whitespace, so perplexity per word "
                      "is not a meaningful number")
    return math.exp(per_word), None


def lm_metrics(sum_nll: float, n_tokens: int, n_bytes: int, n_words: int) -> dict[str, float | None]:
    """The harness metrics from pooled totals (``word_perplexity`` null with ``word_perplexity_null`` giving the
    reason when it would be meaningless: :func:`word_perplexity`)."""
    loss = sum_nll / n_tokens
    bpb = sum_nll / (n_bytes * math.log(2))
    wppl, why = word_perplexity(sum_nll, n_words, n_bytes)
    out: dict[str, float | None] = {
        "loss": loss,
        "bpb": bpb,
        "token_perplexity": math.exp(min(loss, 700.0)),
        "byte_perplexity": 2.0 ** min(bpb, 1000.0),
        "word_perplexity": wppl,
        "tokens": n_tokens,
        "bytes": n_bytes,
        "words": n_words,
    }
    if why:
        out["word_perplexity_null"] = why
    return out


def count_words(text: bytes) -> int:
    """Words as the harness counts them: ``len(re.split(r"\\s+", text))``."""
    return len(re.split(r"\s+", text.decode("utf-8", errors="replace")))


def evaluate(model: torch.nn.Module, tokens: np.ndarray, token_bytes: np.ndarray,
             decode: Callable[[np.ndarray], bytes], *, context: int, stride: int | None = None,
             batch_size: int = 16, max_tokens: int | None = None, spread: bool = False,
             progress: Callable[[int, int], None] | None = None, precision: str = "fp32") -> dict[str, float]:
    """Score ``tokens`` and return loss (nats/token), bpb (bits/byte), token/byte/word perplexity and counts
    (``progress``: as ``score_tokens``). ``precision``: the training run's (``bf16`` evaluates under bf16 autocast
    on CUDA; :func:`window_nll`)."""
    total, targets = score_tokens(model, tokens, context=context, stride=stride, batch_size=batch_size,
                                  max_tokens=max_tokens, spread=spread, progress=progress, precision=precision)
    n_bytes = int(token_bytes[targets].sum())
    return lm_metrics(total, len(targets), n_bytes, count_words(decode(targets)))
