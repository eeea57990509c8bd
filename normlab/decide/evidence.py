"""How sure the stored evidence is about a claim, and at what scale: the rule ``normlab advise`` reports by.

A claim's record combines the claims suite's verdict on it (its confirmatory block: a definition revised after a
verdict on the same seeds, or measured under a definition revised since, decides nothing) with the replications of
it on other corpora and seed blocks (``replicated_on``: decided on the claim's side; ``contradicted_on``: decided
against it), by one declared rule (``record``):

- a decision *for* the claim is the suite's ``held`` or a replication on its side; *against*, the suite's ``not
  held`` or a replication against it; ``within margin`` (an equivalence) is decided without a side;
- decisions on both sides: **contested**;
- otherwise, the suite decided, or (suite undecided) at least one replication decided and none against:
  **decided** (``basis`` says which: the suite, or the replications alone);
- otherwise **undecided**; a suite verdict "not observable at this scale" with no decided replication:
  **not observable**; "present at initialisation" and "not decided: did not learn" decide nothing (undecided).

Scale: a decided claim measured more than ``FAR`` times away from the target (non-embedding parameters or training
tokens, either way) is **decided at <its scale>, untested at yours** (``scale_status``), never "decided" for the
target, in text and JSON alike.
"""

from __future__ import annotations

from typing import Any

from normlab.decide.vocab import (
    CONTESTED,
    HELD,
    NOT_HELD,
    NOT_OBSERVABLE_SHORT,
    NOT_OBSERVABLE,
    SURE_DECIDED,
    SURE_LEANING,
    SURE_UNKNOWN,
    UNDECIDED as UNDECIDED_WORD,
    UNTESTED_AT_SCALE,
    WITHIN_MARGIN,
)

FAR = 10.0
"""A factor in parameters or tokens beyond which a decision is not evidence at the target's scale."""
DECIDED, UNDECIDED, NOT_OBSERVABLE_STATUS = SURE_DECIDED, UNDECIDED_WORD, NOT_OBSERVABLE_SHORT
DECIDED_ELSEWHERE = "decided elsewhere"
"""The JSON status of a decision measured more than ``FAR`` away (text: "decided at <scale>, untested at yours")."""
STATUSES = (DECIDED, DECIDED_ELSEWHERE, UNDECIDED, NOT_OBSERVABLE_STATUS, CONTESTED)
RULE = ("decided for the claim: the suite's held or a replication on its side; against: not held or a replication "
        "against; both: contested; else decided where the suite or (suite undecided) a replication decided; "
        f"decided more than {FAR:g}x away in parameters or tokens: decided at that scale, untested at yours")


def suite_status(claim: dict[str, Any]) -> str:
    """The suite's own verdict as a status: ``decided`` (held, not held, within margin: each by its own rule, made
    by normlab.decide.verdicts), ``not observable``, else ``undecided``; a verdict revised after results on its own
    seeds (exploratory) or measured under a definition revised since decides nothing. Advise re-tests nothing."""
    verdict = str(claim.get("verdict") or "")
    if verdict == NOT_OBSERVABLE:
        return NOT_OBSERVABLE_STATUS
    if claim.get("exploratory") or claim.get("current_definition") is False:
        return UNDECIDED
    return DECIDED if verdict in (HELD, NOT_HELD, WITHIN_MARGIN) else UNDECIDED


def record(claim: dict[str, Any], replicated_on: list[str], contradicted_on: list[str]) -> dict[str, Any]:
    """The claim's status under the module's rule: ``{status, contested, basis}``."""
    st = suite_status(claim)
    verdict = str(claim.get("verdict") or "")
    suite_for = st == DECIDED and verdict == HELD
    suite_against = st == DECIDED and verdict == NOT_HELD
    pro, con = suite_for or bool(replicated_on), suite_against or bool(contradicted_on)
    if pro and con:
        return {"status": CONTESTED, "contested": True, "basis": "the suite and its replications disagree"}
    if st == DECIDED:
        return {"status": DECIDED, "contested": False,
                "basis": "the claims suite" + (" and its replications" if replicated_on or contradicted_on else "")}
    if replicated_on or contradicted_on:
        return {"status": DECIDED, "contested": False, "basis": "its replications (the suite did not decide)"}
    return {"status": st, "contested": False, "basis": "no decision"}


def scale_status(status: str, far: bool | None, scale: str | None) -> tuple[str, str]:
    """``(JSON status, text)`` of a claim's status for the target: a decision measured more than ``FAR`` away (or
    at an unknown distance) is ``decided elsewhere``, "decided at <scale>, untested at yours"."""
    if status != DECIDED:
        return status, status
    if far is None or far:
        return DECIDED_ELSEWHERE, f"decided at {scale or 'an unknown scale'}, {UNTESTED_AT_SCALE}"
    return DECIDED, DECIDED


def sureness(statuses: list[str]) -> str:
    """How sure a decision is for the target, from its claims' statuses: ``decided`` where some claim is decided
    within ``FAR`` and none contested; ``leaning`` where some is decided elsewhere; else ``unknown``."""
    if CONTESTED not in statuses and DECIDED in statuses:
        return SURE_DECIDED
    if DECIDED in statuses or DECIDED_ELSEWHERE in statuses:
        return SURE_LEANING
    return SURE_UNKNOWN
