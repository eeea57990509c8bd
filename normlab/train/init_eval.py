"""The loss at initialisation and the eval-vs-train check of batch-statistic norms.

``loss_init`` is the validation loss of the freshly initialised model (before the first update). The learning-rate
sensitivity of Wortsman et al. 2023 (arXiv:2309.14322) scores every grid point as ``min(loss, loss_init)``, so a run
that diverged counts as ``loss_init`` rather than infinity. It is measured once per run, on the same spread
validation windows as the periodic validation (``train.eval_sample``) but at most ``INIT_EVAL_BATCHES`` batches
(near-uniform predictions: a larger sample changes the number by less than its rounding), and written as the
``step 0`` record ``{init_val_loss, init_val_bpb}`` of ``metrics.jsonl`` and into ``summary.json``.

Batch-statistic norms (BatchNorm, PowerNorm, Unified Normalization) train on batch statistics but evaluate with
running estimates; when those disagree the eval-mode loss is far above the training loss.
:func:`eval_mode_gap` names it with both
numbers when the validation bits/byte exceed the training loss (converted to bits/byte with the validation
split's bits-per-nat ratio) by more than ``EVAL_GAP_BPB``.

A run whose final validation bits/byte is at or above the corpus's unigram level (the training split's unigram
entropy per byte, ``PreparedData.unigram_bpb``, normlab.data.unigram: what the best predictor that ignores context
learns from it; the summary line and the report use the same level) minus ``DID_NOT_LEARN_MARGIN`` did not learn
(the one rule of normlab.stats.learning, which the report, compare and the claims apply too; a run far worse than the
unigram level is caught as well as one just at it): :func:`near_chance_warning` says so, naming the learning rate,
and for a batch-statistic norm that this is the known
failure at a learning rate tuned for LayerNorm (the measured example: docs/cli.md, ``normlab train``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from normlab.eval.lm import evaluate
from normlab.norms import get_norm_class
from normlab.norms.batchstat import BatchStatNorm
from normlab.stats.learning import DID_NOT_LEARN_MARGIN, did_not_learn

INIT_EVAL_BATCHES = 8
EVAL_GAP_BPB = 0.5


def initial_eval(model: Any, data: Any, cfg: Any) -> dict[str, float]:
    """``{init_val_loss, init_val_bpb}`` of ``model`` before training (no RNG is consumed)."""
    tc, mc = cfg.train, cfg.model
    n = min(tc.eval_batches, INIT_EVAL_BATCHES)
    val = evaluate(model, data.val, data.token_bytes, data.tokenizer.decode_bytes, context=mc.context,
                   batch_size=tc.batch_size, max_tokens=n * tc.batch_size * mc.context,
                   spread=tc.eval_sample == "spread")
    return {"init_val_loss": val["loss"], "init_val_bpb": val["bpb"]}


def is_batch_stat(norm: str) -> bool:
    try:
        return issubclass(get_norm_class(norm), BatchStatNorm)
    except Exception:  # noqa: BLE001 - an unknown norm is not a batch-statistic one
        return False


def eval_mode_gap(norm: str, train_loss: float | None, val_loss: float | None,
                  val_bpb: float | None) -> dict[str, Any] | None:
    """For a batch-statistic ``norm``: ``{train_bpb, val_bpb, gap_bpb, message}`` when the eval-mode validation
    bits/byte exceed the training loss in bits/byte by more than ``EVAL_GAP_BPB``; else None.

    ``train_loss`` (nats/token, recent training batches) is converted with the validation ratio
    ``val_bpb / val_loss`` (bits per byte per nat per token of the same tokenizer and corpus)."""
    if not is_batch_stat(norm) or None in (train_loss, val_loss, val_bpb) or not val_loss:
        return None
    train_bpb = train_loss * val_bpb / val_loss
    gap = val_bpb - train_bpb
    if gap <= EVAL_GAP_BPB:
        return None
    msg = (f"{norm} scores {val_bpb:.2f} bits/byte in eval mode (running statistics) but its training loss is "
           f"{train_bpb:.2f} bits/byte (batch statistics): the eval-mode number understates what it learned")
    return {"train_bpb": train_bpb, "val_bpb": val_bpb, "gap_bpb": gap, "message": msg}


def unigram_bpb(tokens: Any, vocab_size: int, n_bytes: int) -> float | None:
    """Unigram entropy of ``tokens [N]`` in bits per byte: ``-sum_v p_v log2 p_v * N / n_bytes`` with ``p`` the
    split's own token frequencies (so no context-free predictor does better on these tokens); None when empty."""
    n = len(tokens)
    if n == 0 or n_bytes <= 0:
        return None
    counts = np.bincount(np.asarray(tokens, dtype=np.int64), minlength=vocab_size)
    p = counts[counts > 0] / n
    return float(-(p * np.log2(p)).sum() * n / n_bytes)


def near_chance_warning(norm: str, lr: float, val_bpb: float | None, init_bpb: float | None,
                        unigram: float | None) -> dict[str, Any] | None:
    """``{val_bpb, init_val_bpb, unigram_bpb, message}`` when the final validation bits/byte did not learn: at or
    above the split's unigram entropy ``unigram`` (what ignoring context already gives) minus
    ``DID_NOT_LEARN_MARGIN`` (normlab.stats.learning.did_not_learn); else None."""
    if val_bpb is None or not math.isfinite(val_bpb) or not did_not_learn(val_bpb, unigram):
        return None
    hint = (f"; batch-statistic norms such as {norm} often fail to train at a learning rate that suits LayerNorm: "
            "try a lower train.lr or a learning-rate grid (normlab compare, lr_grid)") if is_batch_stat(norm) else (
            "; try another train.lr (normlab compare, lr_grid) or more train.steps")
    init = f" ({init_bpb:.2f} at initialisation)" if init_bpb is not None else ""
    msg = (f"the run did not learn: validation {val_bpb:.3f} bits/byte{init} is not below the corpus's unigram "
           f"level (the training split's byte frequencies, no context at all) {unigram:.3f} minus "
           f"{DID_NOT_LEARN_MARGIN:g}, at train.lr {lr:g}"
           f"{hint}")
    return {"val_bpb": val_bpb, "init_val_bpb": init_bpb, "unigram_bpb": unigram, "message": msg}
