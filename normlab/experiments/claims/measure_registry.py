"""The claims' measures by name: ``register_measure("name")`` on a function ``m(ctx, runs, *args) -> (value | None,
details)`` makes it the measure a claim definition names (``measure: {name: ..., args: [...]}``; the name is part
of the claim's spec hash, so a measure that computes something else is registered under a new name). The measures
live in measures.py, measures_lr.py, measures_surgery.py and measures_literature.py; importing
``normlab.experiments.claims.measures`` registers them all.
"""

from __future__ import annotations

from typing import Any, Callable

from normlab.errors import NormlabError, did_you_mean

Measure = Callable[..., "tuple[float | None, dict[str, Any]]"]
MEASURES: dict[str, Measure] = {}


def register_measure(name: str) -> Callable[[Measure], Measure]:
    """Decorator: register ``fn`` as the measure ``name`` (a name registered twice is an error)."""
    def deco(fn: Measure) -> Measure:
        if name in MEASURES and MEASURES[name] is not fn:
            raise ValueError(f"measure '{name}' is registered twice ({MEASURES[name].__qualname__}, "
                             f"{fn.__qualname__})")
        MEASURES[name] = fn
        return fn
    return deco


def get_measure(name: str) -> Measure:
    """The measure registered as ``name`` (one-line error with did-you-mean)."""
    if name not in MEASURES:
        raise NormlabError(f"unknown measure '{name}'{did_you_mean(name, list(MEASURES))}; allowed: "
                           f"{', '.join(sorted(MEASURES))}")
    return MEASURES[name]
