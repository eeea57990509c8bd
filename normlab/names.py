"""One name for bits per byte across normlab's outputs (issue 12 item 9), and the old names still read.

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
