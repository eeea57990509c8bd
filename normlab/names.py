"""One name for bits per byte across normlab's outputs, and the old names still read.

``bpb`` is bits per byte, ``-sum(log p) / (bytes * ln 2)``, in every JSON output, the results store, the report and
TensorBoard; a qualifier says which one: ``val_bpb`` is a run's value on its validation split (``summary.json``,
``metrics.jsonl``, the store's ``runs.val_bpb`` column, ``normlab runs``), ``best_val_bpb`` the best one seen
during training, ``val_bpb_mean`` / ``val_bpb_ci95`` its mean and 95% interval over seeds (report), ``bpb`` the
value of one scored split (``normlab eval`` with its ``split``, ``extrapolate`` results), ``val/bpb`` the
TensorBoard tag. It is the name most of the code already used; the others were renamed.

Old names, written before the rename, are read wherever normlab reads them (``OLD_NAMES``): ``bits_per_byte``
(eval / extrapolation JSON), ``final_val_bpb`` (the store column), ``val/bits_per_byte`` (TensorBoard tag).
Torch-free: the store and the report import it.
"""

from __future__ import annotations

from typing import Any

BPB = "bpb"
VAL_BPB = "val_bpb"
TB_VAL_BPB = "val/bpb"
OLD_NAMES = {"bits_per_byte": BPB, "final_val_bpb": VAL_BPB, "val/bits_per_byte": TB_VAL_BPB}


def read_bpb(record: dict[str, Any], name: str = BPB) -> Any:
    """``record[name]``, or the value under the old name of ``name`` when only that is there (None if neither)."""
    if name in record:
        return record[name]
    for old, new in OLD_NAMES.items():
        if new == name and old in record:
            return record[old]
    return None


def renamed(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` with old bits/byte keys under their new names (a key already present under the new name wins)."""
    out = dict(record)
    for old, new in OLD_NAMES.items():
        if old in out:
            v = out.pop(old)
            out.setdefault(new, v)
    return out


SAMPLED_VAL_BPB = "sampled val bits/byte"
"""What a person reads for ``val_bpb`` (``normlab train``'s last line and progress, ``runs``, the report): the
validation bits/byte that training measures on a fixed sample of the validation split (``train.eval_batches``
windows, ``summary.json``'s ``val_sample_tokens`` targets). ``normlab eval`` scores a whole split and names its
number with :func:`split_bpb_label`; the two differ by sampling, and never share a name."""


def split_bpb_label(split: str, max_tokens: int | None = None) -> str:
    """What a person reads for ``normlab eval``'s ``bpb``: ``val bits/byte, whole split`` (or ``first N tokens``
    under ``--max-tokens``)."""
    return f"{split} bits/byte, " + (f"first {max_tokens:,} tokens" if max_tokens else "whole split")


def eval_scope(max_tokens: int | None = None) -> str:
    """``normlab eval``'s ``scope`` field: ``whole split`` or ``first N tokens``."""
    return f"first {max_tokens} tokens" if max_tokens else "whole split"


GRAD_NORM_PARTS = ("attn", "mlp", "norm")
"""The one definition of a block's gradient norm (Mix-LN, Li et al. 2024: the gradient norm of each layer's
parameters): ``sqrt(sum over parts of |g_part|^2)`` from the training-time keys ``diag/grad_norm/<part>/<l>``
(normlab.diagnostics.training): attention, MLP and norm-site parameters of block ``l``. The report's gradient
profile and the claims suite's Mix-LN measurement both use it."""
GRAD_NORM_PREFIXES = tuple(f"diag/grad_norm/{p}/" for p in GRAD_NORM_PARTS)


def block_grad_norms(record: dict[str, Any]) -> list[float]:
    """Per-block gradient norms ``[L]`` of one diagnostic record of ``metrics.jsonl`` (``GRAD_NORM_PARTS``; a part
    the record lacks counts 0), for blocks ``0, 1, ...`` while any part of the block is recorded."""
    out: list[float] = []
    while any(f"{p}{len(out)}" in record for p in GRAD_NORM_PREFIXES):
        out.append(sum(float(record.get(f"{p}{len(out)}", 0.0)) ** 2 for p in GRAD_NORM_PREFIXES) ** 0.5)
    return out
