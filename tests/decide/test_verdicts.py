"""normlab.decide.verdicts, the one module that makes verdicts: the family's adjustment against statsmodels
with guarded, untestable and missing members counted as p = 1, the did-not-learn guard, the decision words, the
replication verdicts, and no verdict word spelled by the modules that only compute and render."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from statsmodels.stats.multitest import multipletests

from normlab.decide import verdicts as V
from normlab.decide.question import Question

ROOT = Path(__file__).resolve().parents[2] / "normlab"


@pytest.mark.parametrize("correction, method", [("holm", "holm"), ("bh", "fdr_bh")])
def test_family_adjusted_counts_guarded_untestable_and_missing_members_as_p_1(correction, method):
    ps = [0.001, 0.004, None, 0.02, 0.03]
    notes = [None, V.NOT_DECIDED_DNL, None, None, None]
    q = Question("final_loss", "A", ("B", "C", "D", "E", "F", "G"), 0.05, correction)
    got = V.family_adjusted(ps, notes, q, missing=1)
    ref = multipletests([0.001, 1.0, 1.0, 0.02, 0.03, 1.0], method=method)[1]
    assert got == pytest.approx(list(ref[:5]), rel=1e-12)
    # without the guard the member with p 0.004 would be rejected; with it, never
    assert not V.rejects(got[1], q.alpha, notes[1]) and V.rejects(got[0], q.alpha)


def test_the_guard_and_the_decision_words():
    assert V.learning_guard([True, None], [True]) is None  # None: no unigram level, nothing to check
    assert V.learning_guard([True, False], [False]) == V.NOT_DECIDED_DNL  # the variant's note first
    assert V.learning_guard([True], [True, False]) == V.NOT_DECIDED_BASE_DNL
    assert V.decision(-0.2, rejected=True) == V.LOWER and V.decision(0.3, rejected=True) == V.HIGHER
    assert V.decision(-0.2, rejected=False, note=V.NOT_DECIDED_DNL) == V.NOT_DECIDED_DNL
    assert V.decision(-0.2, rejected=False) == V.UNDECIDED
    assert V.decision(None, rejected=False, testable=False) == V.NOT_TESTABLE
    assert not V.rejects(0.05, 0.05, V.NOT_DECIDED_DNL) and V.rejects(0.05, 0.05) and not V.rejects(None, 0.05)


def test_replication_verdicts():
    verdict = V.replication
    assert verdict("lower", "lower") == "replicated"
    assert verdict("lower", "undecided", power=0.9) == "not replicated"
    assert verdict("lower", "undecided", power=0.17) == "underpowered"
    assert verdict("lower", "undecided") == "underpowered"  # power unknown: never "not replicated"
    assert verdict("higher", "lower") == "contradicted"
    assert verdict("undecided", "lower") == "no conclusion to replicate"
    assert verdict("not decided: did not learn", "lower") == "no conclusion to replicate"
    assert verdict("lower", "not decided: did not learn", power=0.99) == "not decided: did not learn"


def test_a_claim_about_a_model_that_did_not_learn_is_never_held():
    """The claims' path of the one guard: a strong "less" effect whose model did not learn in a seed."""
    level = 4.671
    details = [{"best_a": 3.9, "best_b": 4.0}, {"best_a": 3.8, "best_b": level}, {"best_a": 3.9, "best_b": 4.1},
               {"best_a": 3.85, "best_b": 4.05}]
    entry = {"values": [-0.5, -0.6, -0.55, -0.52], "details": details, "direction": "less", "test": "t",
             "must_learn": ["best_a", "best_b"], "unigram_bpb": level}
    (got,) = V.judge_family([entry])
    assert got["raw_verdict"] == V.HELD and got["verdict"] == V.NOT_DECIDED_DNL and got["p_adj"] == 1.0
    # the guard is not opt-in: without must_learn it finds the models' losses in the details all the same
    (undeclared,) = V.judge_family([{**entry, "must_learn": []}])
    assert undeclared["verdict"] == V.NOT_DECIDED_DNL and undeclared["did_not_learn"]["best_b"]["k"] == 1


WORDS = {V.LOWER, V.HIGHER, V.UNDECIDED, V.NOT_TESTABLE, V.NOT_DECIDED_DNL, V.NOT_DECIDED_BASE_DNL, V.HELD,
         V.NOT_HELD, V.INCONCLUSIVE, V.WITHIN_MARGIN, V.NOT_OBSERVABLE, *V.REPLICATION_VERDICTS}
DECIDING = ["decide/decisions.py", "experiments/lrgrid.py", "experiments/sequential.py",
            "experiments/claims/execution.py", "report/sequential.py", "report/equal_flops.py"]


@pytest.mark.parametrize("path", DECIDING)
def test_the_modules_that_compute_and_render_spell_no_verdict(path):
    """Verdicts are made in one module: the others take its words (a literal "lower" elsewhere is a second rule)."""
    tree = ast.parse((ROOT / path).read_text(encoding="utf-8"))
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef)) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    found = [(n.lineno, n.value) for n in ast.walk(tree)
             if isinstance(n, ast.Constant) and n.value in WORDS and id(n) not in docs]
    assert not found, f"{path} spells verdicts itself: {found}"
