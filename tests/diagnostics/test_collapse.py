"""normlab.diagnostics.collapse against the authors' logger (Prieto et al. 2025, "Grokking at the Edge of Numerical
Stability"): tests/fixtures/prieto_softmax_collapse.json holds the logits and what their
``MetricsLogger.compute_softmax_collapse`` counted on them (written by tests/fixtures/make_prieto_collapse.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from normlab.diagnostics.collapse import (COLLAPSE_RULES, DEFAULT_COLLAPSE_RULE, collapse_fractions, collapsed_rows,
                                          softmax_collapse)
from normlab.errors import NormlabError

REF = json.loads((Path(__file__).resolve().parents[1] / "fixtures" / "prieto_softmax_collapse.json").read_text())
LOGITS = torch.tensor(REF["logits"])  # [36, 16] float32
TARGETS = torch.tensor(REF["targets"])
DTYPES = {"16": torch.float16, "32": torch.float32, "64": torch.float64}


@pytest.mark.parametrize("bits", sorted(DTYPES))
def test_default_rule_counts_what_the_authors_logger_counts(bits):
    # A row is counted by an exact equality (sum of exponentials == 1) of the same float ops in the same dtype, so
    # the per-row flags must agree exactly; the authors' fraction is a float32 mean (abs 1e-7).
    ref = REF["softmax_collapse"][bits]
    flags = collapsed_rows(LOGITS.to(DTYPES[bits]), TARGETS)
    assert flags.int().tolist() == ref["per_row"]
    got = collapse_fractions(LOGITS, TARGETS, dtype=DTYPES[bits])["softmax_collapse"]
    assert got == pytest.approx(ref["fraction"], abs=1e-7)
    assert DEFAULT_COLLAPSE_RULE == "sum_exp"


def test_the_fixture_crosses_the_boundary_and_has_confident_wrong_rows():
    # the check above could not fail on a fixture of all-0 or all-1 rows, nor tell the two rules apart
    flags = torch.tensor(REF["softmax_collapse"]["32"]["per_row"], dtype=torch.bool)
    wrong = LOGITS.argmax(-1) != TARGETS
    assert 0 < int(flags.sum()) < len(flags) and bool((flags & wrong).any()) and bool((flags & ~wrong).any())


@pytest.mark.parametrize("bits", sorted(DTYPES))
def test_target_prob_rule_is_the_authors_rows_whose_argmax_is_the_target(bits):
    # p_y == 1 exactly means the softmax is one-hot on y: the authors' rows restricted to a correct argmax
    ref = torch.tensor(REF["softmax_collapse"][bits]["per_row"], dtype=torch.bool)
    want = ref & (LOGITS.argmax(-1) == TARGETS)
    got = collapsed_rows(LOGITS.to(DTYPES[bits]), TARGETS, rule="target_prob")
    assert got.tolist() == want.tolist()
    c, _, n, _ = softmax_collapse(LOGITS, TARGETS, dtype=DTYPES[bits], rule="target_prob")
    assert (int(c), int(n)) == (int(want.sum()), len(TARGETS))


def test_ignored_positions_are_left_out_and_an_unknown_rule_is_one_line():
    y = TARGETS.clone()
    y[::2] = -100
    c, _, n, _ = softmax_collapse(LOGITS, y)
    want = torch.tensor(REF["softmax_collapse"]["32"]["per_row"])[1::2]
    assert (int(c), int(n)) == (int(want.sum()), len(want))
    assert COLLAPSE_RULES == ("sum_exp", "target_prob")
    with pytest.raises(NormlabError, match=r"unknown softmax collapse rule 'loss'.*allowed: sum_exp, target_prob"):
        softmax_collapse(LOGITS, TARGETS, rule="loss")
