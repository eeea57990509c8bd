"""Multiplicity adjustments over a declared family of m p-values (reference: statsmodels ``multipletests``).

- Holm (1979), step-down, controls the family-wise error rate: sort ``p_(1) <= ... <= p_(m)``;
  ``q_(i) = max_{j <= i} min(1, (m - j + 1) p_(j))``.
- Benjamini & Hochberg (1995), step-up, controls the false discovery rate: ``q_(i) = min_{j >= i} min(1, m p_(j) / j)``.

A comparison is decided where its adjusted ``q <= alpha``. A ``None`` entry (a member of the family whose test could
not be computed: too few seeds, a model that did not learn) counts as p = 1: it stays in ``m``, so a family never
shrinks by losing a member, and its adjusted value is ``None``. Leave out of the list what is not in the family.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def _clean(pvalues: Sequence[float | None]) -> list[tuple[int, float]]:
    """``(index, p)`` for every member, a missing p as 1.0 (it counts towards ``m``)."""
    out = []
    for i, p in enumerate(pvalues):
        if p is None:
            out.append((i, 1.0))
            continue
        p = float(p)
        if not (0.0 <= p <= 1.0) or math.isnan(p):
            raise ValueError(f"p-value {p!r} at position {i} is not in [0, 1]")
        out.append((i, p))
    return out


def holm(pvalues: Sequence[float | None]) -> list[float | None]:
    """Holm-adjusted p-values, in the input order."""
    items = sorted(_clean(pvalues), key=lambda ip: ip[1])
    m = len(items)
    out: list[float | None] = [None] * len(pvalues)
    running = 0.0
    for j, (i, p) in enumerate(items):  # j = 0-based rank: multiplier m - j
        running = max(running, min(1.0, (m - j) * p))
        out[i] = None if pvalues[i] is None else running
    return out


def benjamini_hochberg(pvalues: Sequence[float | None]) -> list[float | None]:
    """Benjamini–Hochberg-adjusted p-values, in the input order."""
    items = sorted(_clean(pvalues), key=lambda ip: ip[1])
    m = len(items)
    out: list[float | None] = [None] * len(pvalues)
    running = 1.0
    for j in range(m - 1, -1, -1):
        i, p = items[j]
        running = min(running, min(1.0, m * p / (j + 1)))
        out[i] = None if pvalues[i] is None else running
    return out


ADJUSTMENTS = {"holm": holm, "bh": benjamini_hochberg, "none": lambda ps: [None if p is None else float(p) for p in ps]}
"""Name -> adjustment (the sweep key ``correction:`` takes these names)."""


def adjust(pvalues: Sequence[float | None], method: str = "holm") -> list[float | None]:
    """Adjust ``pvalues`` with the named method (``holm``, ``bh`` or ``none``)."""
    try:
        fn = ADJUSTMENTS[method]
    except KeyError:
        raise ValueError(f"correction {method!r} is not one of {sorted(ADJUSTMENTS)}") from None
    return fn(pvalues)
