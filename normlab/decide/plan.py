"""A sweep's declared question and its sequential plan, read from the sweep file before anything runs.

    primary: lr_sensitivity        # the metric decided on (PRIMARY_METRICS); default lr_sensitivity with an
                                   # lr_grid, else final_loss
    baseline: Pre-LN               # every other variant is compared with it on the primary metric (the family)
    alpha: 0.05                    # family-wise error over the family (and over every look of a sequential plan)
    sequential:                    # seeds in rounds until every primary comparison is decided (docs/compare.md)
      max_seeds: 12                # the cap; looks after every round of len(seeds) seeds (the first round)
      round: 3                     # optional: seeds added per later round (default: the first round's size)
      # or: looks: [3, 6, 9, 12]   # the number of seeds at each look; the last is the cap
    replicate: english             # optional: run the same design on this data source too (docs/compare.md)

``sequential`` is resolved to ``{"looks": [...]}`` in the stored spec and the sweep's ``seeds`` are extended to
the cap with the next unused integers, so the plan (and the sweep's hash) is fixed before the first run and adding
seeds through it never changes the design. ``replicate`` is not part of the hash (it adds a second sweep directory
and changes no run of this one).

The question itself (``primary``, ``baseline``, ``family``, ``alpha``) is read by normlab.decide.question
(``parse_question`` for the sweep file, ``stored_question`` for the sequential and replication code).
"""

from __future__ import annotations

import itertools
from typing import Any

from normlab.errors import NormlabError, check_keys

PLAN_KEYS = ("max_seeds", "round", "looks")
MAX_LOOKS = 20
PLAN_META = "sequential_plan"  # store meta: the plan as stored before the first run (JSON)
LOOKS_META = "sequential"  # store meta: the looks so far and why the plan stopped (JSON; normlab.report.sequential)
DEFAULT_ROUNDS = 4  # --until-decided without --max-seeds: four rounds of the sweep's seeds


def resolve_plan(plan: Any, seeds: list[int], source: str) -> tuple[dict[str, Any], list[int]]:
    """``(stored plan {"looks": [...]}, the full seed list)`` from a ``sequential:`` mapping and the sweep's seeds
    (the first look's seeds unless ``looks`` says otherwise)."""
    if not isinstance(plan, dict) or not plan:
        raise NormlabError(f"{source}: sequential must be a mapping with max_seeds (and optionally round) or looks")
    check_keys(plan, PLAN_KEYS, f"{source}: sequential")

    def count(name: str, v: Any, low: int) -> int:
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise NormlabError(f"{source}: sequential: {name} must be an integer >= {low}, got {v!r}")
        return v

    if "looks" in plan:
        if "max_seeds" in plan or "round" in plan:
            raise NormlabError(f"{source}: sequential: give looks, or max_seeds (and round), not both")
        looks = plan["looks"]
        if not isinstance(looks, list) or not looks:
            raise NormlabError(f"{source}: sequential: looks must be a non-empty list of seed counts")
        looks = [count("each look", n, 2) for n in looks]
        if any(b <= a for a, b in itertools.pairwise(looks)):
            raise NormlabError(f"{source}: sequential: looks must increase strictly, got {looks}")
        if len(seeds) > looks[-1]:
            raise NormlabError(f"{source}: sequential: seeds lists {len(seeds)} seeds, more than the last look "
                               f"({looks[-1]})")
    else:
        if "max_seeds" not in plan:
            raise NormlabError(f"{source}: sequential: max_seeds is required (or give looks)")
        first = len(seeds)
        if first < 2:
            raise NormlabError(f"{source}: sequential: the first round needs at least 2 seeds (a paired test at the "
                               f"first look), seeds lists {first}")
        cap = count("max_seeds", plan["max_seeds"], first)
        step = count("round", plan.get("round", first), 1)
        looks = list(range(first, cap + 1, step))
        if looks[-1] != cap:
            looks.append(cap)
    if len(looks) > MAX_LOOKS:
        raise NormlabError(f"{source}: sequential: {len(looks)} looks, at most {MAX_LOOKS}; use a larger round")
    extra = [s for s in range(max(seeds) + 1, max(seeds) + 1 + looks[-1] - len(seeds))]
    return {"looks": looks}, [*seeds, *extra]


def default_plan(n_seeds: int, max_seeds: int | None) -> dict[str, Any]:
    """The ``sequential:`` mapping ``--until-decided [--max-seeds N]`` adds to a sweep that has none."""
    return {"max_seeds": max_seeds if max_seeds is not None else DEFAULT_ROUNDS * n_seeds}


def plan_looks(plan: Any) -> list[int] | None:
    """The seed counts at each look of a stored ``sequential:`` plan (``{"looks": [...]}``, as ``resolve_plan``
    writes it), or None without one (read by normlab.experiments.sweepspec.SweepSpec: ``spec.looks``)."""
    return list(plan["looks"]) if isinstance(plan, dict) and isinstance(plan.get("looks"), list) else None


def fractions(looks: list[int]) -> list[float]:
    """Information fractions: seeds at each look / the cap (paired differences: information is proportional to n)."""
    return [n / looks[-1] for n in looks]


def planned_rounds(spec: Any, stored_seeds: set[int] | list[int]) -> bool:
    """True when ``stored_seeds`` (the seeds a store holds runs of) are exactly the first ``looks[k]`` seeds of the
    sequential plan of ``spec`` (a typed sweep spec: ``.looks``, ``.seeds``) for some look ``k``: seeds added
    through the plan, not a design change after results (the report's design-change check asks this before flagging
    fewer stored seeds than the spec lists)."""
    if spec.looks is None:
        return False
    stored = set(stored_seeds)
    return any(stored == set(spec.seeds[:n]) for n in spec.looks)
