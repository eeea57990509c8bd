"""The one guard every decision path applies: both sides of a comparison learned, in every seed it uses.

A model's state in one seed comes from its final validation bits/byte and the unigram level ``H1`` of its training
split (normlab.stats.learning): ``learned`` below ``H1 - DID_NOT_LEARN_MARGIN``; ``did not learn`` at or above it;
``diverged`` without a finite loss (or a run that did not finish). A model trained over a learning-rate grid is
judged at its best learning rate (the one its best-of-grid loss comes from). A comparison, a sequential look, a
replication or a claim that involves a model in a state other than ``learned`` in some seed it uses is "not
decided: did not learn" (normlab.decide.vocab), counts as p = 1 in its family, and is never ranked. The guard is
not opt-in: for a claim, every model its measure reads is checked (``model_losses`` finds their losses in the
per-seed details); only a split-outcome claim (whose measured outcome *is* the collapse: test ``collapse``) and an
exact conversion (a deterministic check, test ``exact``) are judged without it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from normlab.stats.learning import DID_NOT_LEARN_MARGIN, NOT_DECIDED_BASE_DNL, NOT_DECIDED_DNL, did_not_learn

LEARNED, DID_NOT_LEARN, DIVERGED = "learned", "did not learn", "diverged"
STATES = (LEARNED, DID_NOT_LEARN, DIVERGED)
LEARN_KEY = "learn_bpb"
"""Per-seed details key the claims execution writes for every claim: ``{model: final bits/byte}`` (a grid model:
its best learning rate's), beside ``unigram_bpb``."""
UNGUARDED_TESTS = ("collapse", "exact")
"""Claim tests judged without the guard: a split outcome counts collapses as its outcome; an exact check is not
about training."""


def seed_state(bpb: float | None, unigram_bpb: float | None, *, finished: bool = True) -> str | None:
    """A model's state in one seed (module docstring); None when the unigram level is unknown (nothing to check)."""
    if not finished or bpb is None or isinstance(bpb, bool) or not isinstance(bpb, (int, float)) \
            or not math.isfinite(bpb):
        return DIVERGED
    dnl = did_not_learn(bpb, unigram_bpb)
    if dnl is None:
        return None
    return DID_NOT_LEARN if dnl else LEARNED


def learning_guard(variant: Iterable[bool | None], baseline: Iterable[bool | None]) -> str | None:
    """The guard on learned flags: ``NOT_DECIDED_DNL`` when the variant did not learn in one of the seeds a
    comparison uses (a flag False), the baseline's note when the baseline did not, else None (a flag None: no
    unigram level, nothing to check)."""
    if any(f is False for f in variant):
        return NOT_DECIDED_DNL
    if any(f is False for f in baseline):
        return NOT_DECIDED_BASE_DNL
    return None


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def model_losses(detail: Mapping[str, Any], declared: Sequence[str] = (), declared_scale: float = 1.0
                 ) -> dict[str, float | None]:
    """The final bits/byte of every model one seed of a claim is about, from its details: the execution's
    ``learn_bpb`` record where present (every variant the claim trains); else what stored details hold — per
    learning rate ``bpb_<model>@<lr>`` (the model's best over the grid), the ``declared`` keys (a claim's
    ``must_learn``: its models' final losses), ``best_<model>`` best-of-grid losses. {} when none is recorded."""
    rec = detail.get(LEARN_KEY)
    if isinstance(rec, Mapping):
        return {str(k): (float(v) if _num(v) else None) for k, v in rec.items()}
    out: dict[str, float | None] = {}
    grid: dict[str, list[float | None]] = {}
    for k, v in detail.items():
        if k.startswith("bpb_") and "@" in k:
            grid.setdefault(k[4:].split("@")[0], []).append(float(v) if _num(v) and math.isfinite(v) else None)
    for m, xs in grid.items():
        ok = [x for x in xs if x is not None]
        out[m] = min(ok) if ok else None
    for k in declared:
        if k in detail:
            v = detail[k]
            out[k] = float(v) * declared_scale if _num(v) else None
    if not out:
        for k, v in detail.items():
            if k.startswith("best_") and not k.startswith("best_lr_"):
                out[k] = float(v) if _num(v) else None
    return out


def claim_guard(details: Sequence[Any], *, test: str, declared_scale: float = 1.0, declared: Sequence[str] = (),
                unigram: float | None = None) -> tuple[dict | None, str | None]:
    """The guard over a claim's per-seed ``details``: ``({model: {k, n, missing, states}}, note)``; the note (None
    when every model learned in every seed) says which model did not learn in how many seeds. ``declared``: the
    claim's ``must_learn`` keys, in bits/byte times ``declared_scale``. ``(None, None)`` for an unguarded test or
    where no loss or unigram level is recorded (the record then says the check was not made)."""
    if test in UNGUARDED_TESTS:
        return None, None
    dicts = [d for d in details if isinstance(d, Mapping)]
    record: dict[str, dict] = {}
    notes = []
    for d in dicts:
        level = d.get("unigram_bpb", unigram)
        if not _num(level):
            continue
        for m, x in model_losses(d, declared, declared_scale).items():
            s = seed_state(x, float(level))
            r = record.setdefault(m, {"k": 0, "n": 0, "states": []})
            r["n"] += 1
            r["states"].append(s)
            r["k"] += s in (DID_NOT_LEARN, DIVERGED)
    if not record:
        return None, None
    level = next((d.get("unigram_bpb") for d in dicts if _num(d.get("unigram_bpb"))), unigram)
    for m, r in record.items():
        if r["k"]:
            notes.append(f"{m} did not learn in {r['k']} of {r['n']} seeds")
    if not notes:
        return record, None
    return record, (f"{NOT_DECIDED_DNL}: {'; '.join(notes)} (final bits/byte at or above the unigram "
                    f"{float(level):.3g} - {DID_NOT_LEARN_MARGIN:g}, or diverged; counted as p = 1 in the family)")
