"""The one "did not learn" rule and the one "collapse" rule (docs/compare.md, "Did not learn"), used by the report,
the sequential looks, the replication decisions, the claims, ``train``, ``eval``, ``compare``, the API and the
example. Torch-free: numbers in, a flag out.

The unigram level ``H1`` of a corpus is the loss of the best context-free model (byte level: ``-sum_b p(b) log2
p(b)`` over the training split's bytes; a tokenized corpus: the token unigram entropy times tokens per byte;
normlab.data.unigram). A run whose final validation bits/byte is at or above ``H1 - DID_NOT_LEARN_MARGIN`` learned
only frequencies: it "did not learn", is flagged wherever its number is printed and is never ranked; a comparison
involving it is "not decided: did not learn" and counts as p = 1 in its family. A run "collapsed" when it diverged
(or did not finish) or did not learn: one threshold for both.
"""

from __future__ import annotations

import math

DID_NOT_LEARN_MARGIN = 0.1
"""bits/byte: a final loss ``>= H1 - DID_NOT_LEARN_MARGIN`` did not learn (one threshold for every path)."""

NOT_DECIDED_DNL = "not decided: did not learn"
NOT_DECIDED_BASE_DNL = "not decided: baseline did not learn"


def _finite(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def learn_threshold(unigram_bpb: float) -> float:
    """The loss a run must end below to have learned: ``H1 - DID_NOT_LEARN_MARGIN``."""
    return float(unigram_bpb) - DID_NOT_LEARN_MARGIN


def did_not_learn(bpb: float | None, unigram_bpb: float | None) -> bool | None:
    """True when a finished run's bits/byte ``bpb`` is at or above ``H1 - DID_NOT_LEARN_MARGIN`` (a NaN or infinite
    loss counts as not learned); None when either number is unknown."""
    if not _finite(unigram_bpb) or bpb is None or isinstance(bpb, bool):
        return None
    if not isinstance(bpb, (int, float)):
        return None
    if not math.isfinite(bpb):
        return True
    return bpb >= learn_threshold(unigram_bpb)


def collapsed(bpb: float | None, unigram_bpb: float | None, *, finished: bool = True) -> bool | None:
    """True when the run diverged or did not finish (``finished=False``, or no finite ``bpb``) or did not learn;
    None when it finished with a finite loss but the unigram level is unknown."""
    if not finished or not _finite(bpb):
        return True
    return did_not_learn(bpb, unigram_bpb)


def learning_note(bpb: float | None, unigram_bpb: float | None) -> str | None:
    """The flag printed beside a number that did not learn: ``"did not learn (unigram H1)"``, else None."""
    if did_not_learn(bpb, unigram_bpb):
        return f"did not learn (at or above the unigram {unigram_bpb:.3f} - {DID_NOT_LEARN_MARGIN:g} bits/byte)"
    return None


def learning_record(bpb: float | None, unigram_bpb: float | None) -> dict:
    """What ``eval`` and the API print beside a loss: ``unigram_bpb``, the unigram level as a byte perplexity
    (``2 ** H1``, beside ``byte_perplexity = 2 ** bpb``) and ``did_not_learn``; {} without a unigram level."""
    if not _finite(unigram_bpb):
        return {}
    return {"unigram_bpb": float(unigram_bpb), "unigram_byte_perplexity": 2.0 ** float(unigram_bpb),
            "did_not_learn": did_not_learn(bpb, unigram_bpb)}
