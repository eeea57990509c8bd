"""Grid axes of a sweep: a log-spaced ``{min, max, points}`` range or an explicit list, expanded to values.

The learning-rate grid (``lr_grid:`` in a sweep file, Wortsman et al. 2023, "Small-scale proxies for large-scale
Transformer training instabilities", arXiv:2309.14322) is the first user; any positive, log-scaled quantity (a model
width for a size sweep) can reuse :func:`expand_grid` with ``integer=True``.

Log spacing: ``points`` values ``min * (max / min) ** (i / (points - 1))`` for ``i = 0 .. points - 1`` (one point:
``[min]``, and then ``max`` must equal ``min``), rounded to ``digits`` significant digits so labels and config hashes
are stable (``1e-3 .. 1e-1`` in 5 points: 0.001, 0.00316, 0.01, 0.0316, 0.1). ``integer=True`` rounds to the
nearest integer instead and drops duplicates. A list is taken as given (checked: numbers, > 0, no duplicates).
"""

from __future__ import annotations

import math
import re
from typing import Any

from normlab.errors import NormlabError, check_keys

GRID_KEYS = ("min", "max", "points")


MAX_POINTS = 1000
"""The most values a ``{min, max, points}`` grid may expand to (a sweep's total is limited too: ``sweep.MAX_RUNS``)."""
_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")  # as normlab.config: YAML 1.1 reads 1e-3 as text


def _positive(v: Any, what: str) -> float:
    if isinstance(v, str) and _NUMBER.fullmatch(v.strip()):  # what a user writes: {min: 1e-3} (docs/compare.md)
        v = float(v)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        raise NormlabError(f"{what} must be a number > 0, got {v!r}")
    return float(v)


def round_sig(x: float, digits: int = 3) -> float:
    """``x`` rounded to ``digits`` significant digits (``0.0031622 -> 0.00316``)."""
    if x == 0:
        return 0.0
    return round(x, digits - 1 - math.floor(math.log10(abs(x))))


def log_grid(lo: float, hi: float, points: int, *, digits: int = 3) -> list[float]:
    """``points`` log-spaced values from ``lo`` to ``hi`` (both included), ``digits`` significant digits."""
    if points == 1:
        return [round_sig(lo, digits)]
    r = math.log(hi / lo)
    return [round_sig(lo * math.exp(r * i / (points - 1)), digits) for i in range(points)]


def expand_grid(raw: Any, *, name: str = "lr_grid", integer: bool = False, digits: int = 3) -> list[float]:
    """Values of a grid spec ``raw`` as written: ``{min, max, points}`` (log-spaced) or a non-empty list of numbers > 0.

    Bad specs are one-line ``NormlabError``s naming ``name`` and what is allowed."""
    if isinstance(raw, dict):
        check_keys(raw, GRID_KEYS, name)
        missing = [k for k in GRID_KEYS if k not in raw]
        if missing:
            raise NormlabError(f"{name} needs min, max and points (log-spaced), or a list of values; missing "
                               f"{', '.join(missing)}")
        lo, hi = _positive(raw["min"], f"{name}.min"), _positive(raw["max"], f"{name}.max")
        pts = raw["points"]
        if isinstance(pts, bool) or not isinstance(pts, int) or not 1 <= pts <= MAX_POINTS:
            raise NormlabError(f"{name}.points must be an integer in [1, {MAX_POINTS}], got {pts!r}")
        if hi < lo:
            raise NormlabError(f"{name}: max ({hi:g}) must be >= min ({lo:g})")
        if pts == 1 and hi != lo:
            raise NormlabError(f"{name}: one point needs min == max (got {lo:g} and {hi:g}); use points >= 2")
        if pts > 1 and hi == lo:
            raise NormlabError(f"{name}: min == max ({lo:g}) gives one value; set points: 1 or widen the range")
        values = log_grid(lo, hi, pts, digits=digits)
    elif isinstance(raw, list):
        if not raw:
            raise NormlabError(f"{name} is empty; give {{min, max, points}} or a list of values")
        if len(raw) > MAX_POINTS:
            raise NormlabError(f"{name} has {len(raw)} values; at most {MAX_POINTS}")
        values = [_positive(v, f"{name} value") for v in raw]
    else:
        raise NormlabError(f"{name} must be {{min: ..., max: ..., points: ...}} (log-spaced) or a list of values, "
                           f"got {type(raw).__name__}")
    if integer:
        values = [float(max(1, round(v))) for v in values]
        values = [v for i, v in enumerate(values) if v not in values[:i]]
        return [int(v) for v in values]  # type: ignore[misc]
    if len(set(values)) != len(values):
        raise NormlabError(f"{name} has duplicate values {values}; widen the range or give fewer points")
    return values
