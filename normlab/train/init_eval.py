"""The loss at initialisation and the eval-vs-train check of batch-statistic norms.

``loss_init`` is the validation loss of the freshly initialised model (before the first update). The learning-rate
sensitivity of Wortsman et al. 2023 (arXiv:2309.14322) scores every grid point as ``min(loss, loss_init)``, so a run
that diverged counts as ``loss_init`` rather than infinity. It is measured once per run, on the same spread
validation windows as the periodic validation (``train.eval_sample``) but at most ``INIT_EVAL_BATCHES`` batches
(near-uniform predictions: a larger sample changes the number by less than its rounding), and written as the
``step 0`` record ``{init_val_loss, init_val_bpb}`` of ``metrics.jsonl`` and into ``summary.json``.

Batch-statistic norms (BatchNorm, PowerNorm, Unified Normalization) train on batch statistics but evaluate with
running estimates; when those disagree the eval-mode loss is far above the training loss (measured: BatchNorm 7.66
bits/byte in eval against ~4.0 for LayerNorm on the same run length). :func:`eval_mode_gap` names it with both
numbers when the validation bits/byte exceed the training loss (converted to bits/byte with the validation
split's bits-per-nat ratio) by more than ``EVAL_GAP_BPB``.
"""

from __future__ import annotations

from typing import Any

INIT_EVAL_BATCHES = 8
EVAL_GAP_BPB = 0.5


def initial_eval(model: Any, data: Any, cfg: Any) -> dict[str, float]:
    """``{init_val_loss, init_val_bpb}`` of ``model`` before training (no RNG is consumed)."""
    from normlab.eval.lm import evaluate

    tc, mc = cfg.train, cfg.model
    n = min(tc.eval_batches, INIT_EVAL_BATCHES)
    val = evaluate(model, data.val, data.token_bytes, data.tokenizer.decode_bytes, context=mc.context,
                   batch_size=tc.batch_size, max_tokens=n * tc.batch_size * mc.context,
                   spread=tc.eval_sample == "spread")
    return {"init_val_loss": val["loss"], "init_val_bpb": val["bpb"]}


def is_batch_stat(norm: str) -> bool:
    from normlab.norms import get_norm_class
    from normlab.norms.batchstat import BatchStatNorm

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
