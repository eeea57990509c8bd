"""A sweep's declared question and design, and the record of it in the results store.

A sweep declares before it runs what its report decides (docs/compare.md, "Declared questions")::

    primary: lr_sensitivity      # the metric decided on: lr_sensitivity (needs lr_grid), best_loss, final_loss
    baseline: Pre-LN             # every comparison is variant - baseline (default: the first variant)
    family: [Peri-LN, Post-LN]   # the comparisons decided on (default: every other variant vs the baseline)
    alpha: 0.05                  # family-wise error (holm) or false discovery rate (bh)
    correction: holm             # holm (default) or bh (Benjamini-Hochberg), over the family
    paired: true                 # paired t over shared seeds (default); false: Welch, declared before the data

The *design* is the question plus what was planned to run (group labels, seeds, learning rates). ``record_design``
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

from normlab.errors import NormlabError, did_you_mean
from normlab.experiments.store import FINAL, Store

PRIMARY_METRICS = ("lr_sensitivity", "best_loss", "final_loss")
"""Sweep key ``primary:`` values: per-seed LR sensitivity and best-of-grid loss (a sweep with ``lr_grid``), or the
final validation bits/byte (a sweep at one learning rate, where it equals ``best_loss``)."""
METRIC_LABELS = {"lr_sensitivity": "LR sensitivity", "best_loss": "best loss", "final_loss": "final loss"}
CORRECTIONS = ("holm", "bh")
QUESTION_KEYS = ("primary", "family", "alpha", "correction", "paired")
"""Top-level sweep keys of the question; not part of the sweep hash (changing them after results is recorded and
reported instead of orphaning the sweep directory). ``baseline`` is older and stays in the hash."""
DEFAULT_ALPHA = 0.05


def parse_question(raw: dict[str, Any], names: list[str], *, grid: bool, source: str) -> dict[str, Any]:
    """Validate the question keys of sweep mapping ``raw`` against the group labels ``names`` (baseline first when
    not given); returns the resolved question ``{declared, primary, baseline, family, alpha, correction, paired}``.
    ``declared`` is False when ``primary:`` is absent: then the defaults below are used and the report treats every
    comparison as exploratory."""
    declared = raw.get("primary") is not None
    primary = raw.get("primary", "lr_sensitivity" if grid else "final_loss")
    if primary not in PRIMARY_METRICS:
        raise NormlabError(
            f"{source}: primary {primary!r} is not a metric{did_you_mean(str(primary), PRIMARY_METRICS)};"
            f" allowed: {', '.join(PRIMARY_METRICS)}"
        )
    if primary == "lr_sensitivity" and not grid:
        raise NormlabError(f"{source}: primary: lr_sensitivity needs an lr_grid (at one learning rate use final_loss)")
    if primary == "final_loss" and grid:
        raise NormlabError(f"{source}: primary: final_loss is for a sweep at one learning rate; with lr_grid use "
                           "lr_sensitivity or best_loss (the best final loss of the grid)")
    baseline = raw.get("baseline")
    if baseline is None:
        baseline = names[0] if names else None
    elif baseline not in names:
        raise NormlabError(f"{source}: baseline {baseline!r} is not a variant{did_you_mean(str(baseline), names)}; "
                           f"variants: {', '.join(names)}")
    others = [n for n in names if n != baseline]
    family = raw.get("family")
    if family is None:
        family = others
    else:
        if not isinstance(family, list) or not family or not all(isinstance(f, str) for f in family):
            raise NormlabError(f"{source}: family must be a non-empty list of variant names compared with the "
                               f"baseline; variants: {', '.join(others)}")
        for f in family:
            if f == baseline:
                raise NormlabError(f"{source}: family names the baseline {f!r}; list the variants compared with it")
            if f not in others:
                raise NormlabError(f"{source}: family member {f!r} is not a variant{did_you_mean(f, others)}; "
                                   f"variants: {', '.join(others)}")
        if len(set(family)) != len(family):
            raise NormlabError(f"{source}: family lists a variant twice: {family}")
    alpha = raw.get("alpha", DEFAULT_ALPHA)
    if (isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha)
            or not 0 < alpha <= 0.5):
        raise NormlabError(f"{source}: alpha must be a number in (0, 0.5], got {alpha!r}")
    correction = raw.get("correction", "holm")
    if correction not in CORRECTIONS:
        raise NormlabError(f"{source}: correction {correction!r} is not one of {', '.join(CORRECTIONS)} "
                           "(holm: family-wise error; bh: Benjamini-Hochberg false discovery rate)")
    paired = raw.get("paired", True)
    if not isinstance(paired, bool):
        raise NormlabError(
            f"{source}: paired must be true (paired t over shared seeds) or false (Welch), got {paired!r}"
        )
    return {"declared": declared, "primary": primary, "baseline": baseline, "family": list(family),
            "alpha": float(alpha), "correction": correction, "paired": paired}


def question_spec(raw: dict[str, Any]) -> dict[str, Any]:
    """The question keys as given in ``raw`` (for the stored, self-contained sweep spec)."""
    return {k: raw[k] for k in QUESTION_KEYS if raw.get(k) is not None}


def make_design(question: dict[str, Any], groups: list[str], seeds: list[int], lrs: list[float] | None
                ) -> dict[str, Any]:
    """The design recorded in the store: the question and what is planned to run."""
    return {**question, "groups": list(groups), "seeds": sorted(int(s) for s in seeds),
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
        d = json.loads(meta["design"])
    except (KeyError, TypeError, ValueError, RecursionError):
        return None
    return d if isinstance(d, dict) else None


def design_changes(meta: dict[str, str]) -> list[dict[str, Any]]:
    try:
        h = json.loads(meta.get("design_changes") or "[]")
    except (TypeError, ValueError, RecursionError):
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
