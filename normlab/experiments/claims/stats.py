"""Mean, Student-t confidence interval and the verdict of a claim.

The CI is ``mean ± t_{1-a/2, n-1} * sd / sqrt(n)`` over per-seed values (``sd`` with ``n - 1``). The t quantile is
computed without scipy by ``normlab.stats`` (incomplete-beta CDF inverted by bisection).

Verdicts (``direction``):

- ``greater`` / ``less``: the claim says the effect is above / below ``null``. CI entirely on the claimed side ->
  ``held``; entirely on the other side -> ``not held``; CI containing ``null`` (or fewer than 2 finite values)
  -> ``inconclusive``.
- ``within``: an equivalence claim ``|effect - null| < margin``. CI inside ``(null - margin, null + margin)`` ->
  ``held``; CI entirely outside it -> ``not held``; otherwise ``inconclusive``.
- ``exact``: a deterministic quantity (e.g. max |logit difference| of an exact conversion) that must be
  ``<= tolerance`` for every seed: all seeds within -> ``held``; any seed above (or non-finite) -> ``not held``.
  No CI is needed (one seed suffices); ``ci`` is ``[min, max]`` over seeds.
"""

from __future__ import annotations

import math
from typing import Sequence

from normlab.stats import mean_ci

HELD, NOT_HELD, INCONCLUSIVE = "held", "not held", "inconclusive"
DIRECTIONS = ("greater", "less", "within", "exact")


def finite(values: Sequence[float | None]) -> list[float]:
    return [float(v) for v in values if v is not None and math.isfinite(float(v))]


def verdict(values: Sequence[float | None], direction: str, *, null: float = 0.0, margin: float | None = None,
            tolerance: float | None = None, level: float = 0.95) -> dict:
    """``{measured, ci, n, verdict, reason}`` for per-seed ``values`` (see the module docstring)."""
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
    if direction == "exact":
        if tolerance is None:
            raise ValueError("direction 'exact' needs a tolerance")
        vals = [None if v is None else float(v) for v in values]
        if not vals:
            return {"measured": None, "ci": None, "n": 0, "verdict": INCONCLUSIVE, "reason": "no values"}
        xs = finite(vals)
        worst = max(xs) if len(xs) == len(vals) else float("inf")
        ok = worst <= tolerance
        return {"measured": worst, "ci": [min(xs), max(xs)] if xs else None, "n": len(vals),
                "verdict": HELD if ok else NOT_HELD,
                "reason": f"max over {len(vals)} seed(s) {'<=' if ok else '>'} tolerance {tolerance:g}"}
    xs = finite(values)
    c = mean_ci(xs, level) if xs else None
    n = len(xs)
    out = {"measured": c.mean if c else None, "ci": [c.low, c.high] if c and c.half is not None else None, "n": n}
    if out["ci"] is None:
        return {**out, "verdict": INCONCLUSIVE, "reason": f"{n} finite value(s): a CI needs at least 2"}
    lo, hi = out["ci"]
    if direction == "within":
        if margin is None:
            raise ValueError("direction 'within' needs a margin")
        if null - margin < lo and hi < null + margin:
            v, why = HELD, f"CI inside ±{margin:g}"
        elif hi <= null - margin or lo >= null + margin:
            v, why = NOT_HELD, f"CI entirely outside ±{margin:g}"
        else:
            v, why = INCONCLUSIVE, f"CI overlaps the ±{margin:g} boundary"
        return {**out, "verdict": v, "reason": why}
    claimed_side = lo > null if direction == "greater" else hi < null
    other_side = hi < null if direction == "greater" else lo > null
    if claimed_side:
        v, why = HELD, f"CI excludes {null:g} in the expected direction"
    elif other_side:
        v, why = NOT_HELD, f"CI excludes {null:g} in the opposite direction"
    else:
        v, why = INCONCLUSIVE, f"CI contains {null:g}"
    return {**out, "verdict": v, "reason": why}
