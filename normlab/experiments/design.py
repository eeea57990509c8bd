"""A sweep's design and the record of it in the results store.

A sweep declares before it runs what its report decides: its question (normlab.decide.question, the one
parser of ``primary``, ``baseline``, ``family``, ``alpha``, ``correction`` and ``paired``). The *design* is the
question plus what was planned to run (group labels, seeds, learning rates). ``record_design``
writes it to the store's ``meta`` table (key ``design``) before the first run is registered. A later call with a
different design appends an entry to ``design_changes`` (``{at, finished_runs, changed, sequential}``); a change
made after any run had finished, outside a sequential plan (``sequential=True``, normlab's own seeds-until-decided
looks), makes every conclusion of the report exploratory (``changed_after_results``).
"""

from __future__ import annotations

import json
import math
import time
from typing import Any

from normlab.decide.question import Question
from normlab.errors import NormlabError
from normlab.experiments.store import FINAL, Store
from normlab.io import loads_json

def make_design(question: Question, groups: list[str], seeds: list[int], lrs: list[float] | None
                ) -> dict[str, Any]:
    """The design recorded in the store: the question and what is planned to run."""
    return {**question.as_dict(), "groups": list(groups), "seeds": sorted(int(s) for s in seeds),
            "learning_rates": sorted(float(x) for x in lrs) if lrs else None}


def _changed_keys(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    return sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))


def record_design(store: Store, design: dict[str, Any], *, sequential: bool = False) -> list[str]:
    """Write ``design`` to ``store`` (meta ``design``) and, if a different design was stored, append the change to
    ``design_changes`` with the number of runs finished at that moment. Returns the changed keys ([] if none).
    A store that already holds finished runs but no design (written before designs were recorded) gets its design
    recorded as a change (``changed: ["design"]``): its question was not declared before the data.
    ``sequential``: the change is a planned look of a group-sequential design (seeds added by normlab's
    seeds-until-decided), which does not make the report exploratory. Call before registering the new runs."""
    meta = store.meta()
    old = stored_design(meta)
    changed = ["design"] if old is None else _changed_keys(old, design)
    if old is not None and not changed:
        return []
    finished = sum(1 for r in store.runs() if r["status"] in FINAL)
    if old is not None or finished:  # a store from before designs were recorded, with results: declared late
        history = design_changes(meta)
        history.append({"at": round(time.time(), 3), "finished_runs": finished, "changed": changed,
                        "sequential": bool(sequential), "before": old})
        store.set_meta("design_changes", json.dumps(history, sort_keys=True))
    store.set_meta("design", json.dumps(design, sort_keys=True))
    return changed if (old is not None or finished) else []


def stored_design(meta: dict[str, str]) -> dict[str, Any] | None:
    """The design in a store's meta (None for a store written before designs were recorded, or a damaged one)."""
    try:
        d = loads_json(meta["design"], "the store's design")  # bounded: depth, digits
    except (KeyError, TypeError, NormlabError):
        return None
    return d if isinstance(d, dict) else None


def design_changes(meta: dict[str, str]) -> list[dict[str, Any]]:
    try:
        h = loads_json(meta.get("design_changes") or "[]", "the store's design changes")
    except (TypeError, NormlabError):
        return []
    return [x for x in h if isinstance(x, dict)] if isinstance(h, list) else []


def changed_after_results(meta: dict[str, str], rows: list[dict[str, Any]] | None = None) -> str | None:
    """Why the stored design no longer is the one declared before the data, or None: a recorded change made after
    runs had finished (outside a sequential plan), or stored runs the design does not cover."""
    for ch in design_changes(meta):
        if ch.get("finished_runs", 0) and not ch.get("sequential"):
            return (f"the design changed after {ch['finished_runs']} run(s) had finished "
                    f"({', '.join(ch.get('changed') or ['?'])} changed)")
    design = stored_design(meta)
    if design is None or rows is None:
        return None
    groups, seeds = set(design.get("groups") or []), set(design.get("seeds") or [])
    lrs = design.get("learning_rates")
    extra = []
    for r in rows:
        g = (r.get("axes") or {}).get("grid_group") or r["variant"]
        lr = ((r.get("config") or {}).get("train") or {}).get("lr")
        if r["status"] not in FINAL:
            continue
        if g not in groups:
            extra.append(f"variant {g!r}")
        elif int(r["seed"]) not in seeds:
            extra.append(f"seed {r['seed']}")
        elif lrs and not any(math.isclose(float(lr), x, rel_tol=1e-9) for x in lrs):
            extra.append(f"lr {lr:g}")
    if extra:
        return f"the store holds results outside the declared design ({', '.join(sorted(set(extra))[:4])})"
    return None
