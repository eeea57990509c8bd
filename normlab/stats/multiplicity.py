"""Multiplicity adjustments over a declared family of m p-values (reference: statsmodels ``multipletests``).

- Holm (1979), step-down, controls the family-wise error rate: sort ``p_(1) <= ... <= p_(m)``;
  ``q_(i) = max_{j <= i} min(1, (m - j + 1) p_(j))``.
- Benjamini & Hochberg (1995), step-up, controls the false discovery rate: ``q_(i) = min_{j >= i} min(1, m p_(j) / j)``.

A comparison is decided where its adjusted ``q <= alpha``. ``None`` entries (a test that could not be computed)
stay ``None`` and do not count towards ``m``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def _clean(pvalues: Sequence[float | None]) -> list[tuple[int, float]]:
    out = []
    for i, p in enumerate(pvalues):
        if p is None:
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
        out[i] = running
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
        out[i] = running
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
