"""Every verdict word normlab prints, defined once (the decision layer's vocabulary; docs/compare.md, "Verdicts").

Comparisons of a declared question: ``lower`` / ``higher`` (rejected, by the sign of ``variant - baseline``),
``undecided``, ``not testable``, ``within margin`` (TOST inside the practical margin, adjusted with the family),
``not decided: did not learn`` / ``not decided: baseline did not learn`` (the one guard, normlab.decide.guard), and
``exploratory`` (outside the declared family). Replications: ``replicated``, ``contradicted``, ``not replicated``,
``underpowered``, ``no conclusion to replicate``. Claims: ``held``, ``not held``, ``inconclusive``, ``within
margin``, ``not observable at this scale``, ``present at initialisation`` (a state the model has at step 0, not a
training effect). Scale (advise): ``decided`` / ``leaning`` / ``unknown`` and "decided at <scale>, untested at
yours". Other modules import these names; a literal elsewhere is a second rule (tests/decide/test_vocab.py).
"""

from __future__ import annotations

from normlab.stats.learning import NOT_DECIDED_BASE_DNL, NOT_DECIDED_DNL

# comparisons of a declared question
LOWER, HIGHER, UNDECIDED, NOT_TESTABLE, EXPLORATORY = "lower", "higher", "undecided", "not testable", "exploratory"
DECIDED = (LOWER, HIGHER)
NOT_DECIDED = (NOT_DECIDED_DNL, NOT_DECIDED_BASE_DNL)
WITHDRAWN = "withdrawn"
"""Prefix of the reason a decision made at an earlier look is withdrawn at a later one (the guard failed there)."""

# replications
REPLICATED, NOT_REPLICATED, CONTRADICTED = "replicated", "not replicated", "contradicted"
NO_CONCLUSION, UNDERPOWERED = "no conclusion to replicate", "underpowered"
REPLICATION_VERDICTS = (REPLICATED, NOT_REPLICATED, CONTRADICTED, NO_CONCLUSION, UNDERPOWERED)

# claims
HELD, NOT_HELD, INCONCLUSIVE = "held", "not held", "inconclusive"
WITHIN_MARGIN, NOT_OBSERVABLE = "within margin", "not observable at this scale"
PRESENT_AT_INIT = "present at initialisation"
NOT_OBSERVABLE_SHORT = "not observable"
"""advise's status of a claim whose suite verdict is ``not observable at this scale``."""
CLAIM_VERDICTS = (HELD, NOT_HELD, INCONCLUSIVE, WITHIN_MARGIN, NOT_OBSERVABLE, PRESENT_AT_INIT)
DECIDED_CLAIMS = (HELD, NOT_HELD, WITHIN_MARGIN)
"""The claim verdicts that decide something about training (advise lists only these as decided evidence)."""

# how sure advise is, and where it was measured
SURE_DECIDED, SURE_LEANING, SURE_UNKNOWN = "decided", "leaning", "unknown"
CONTESTED = "contested"
UNTESTED_AT_SCALE = "untested at yours"


def colour(verdict: str) -> str:
    """The terminal colour of a claim verdict (rich markup name)."""
    return {HELD: "green", NOT_HELD: "red", INCONCLUSIVE: "yellow", WITHIN_MARGIN: "cyan",
            NOT_OBSERVABLE: "magenta", PRESENT_AT_INIT: "magenta"}.get(verdict, "white")
