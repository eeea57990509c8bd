"""normlab.decide as one layer: the same per-seed values give the same verdict on every path that prints one.

Each case is a two-variant learning-rate grid (Pre-LN baseline, Post-LN variant, two learning rates, the unigram
level 4.7 bits/byte) fed through the four paths: ``compare`` (normlab.experiments.lrgrid.analyze ->
normlab.decide.decisions, the report's primary family), ``--until-decided`` (normlab.decide.looks.look on the same
per-seed values), the claims suite (normlab.decide.verdicts.judge_family on the per-seed differences, with the
details the claims execution records: every model's best final loss and the unigram level) and ``advise``
(normlab.decide.evidence.record of the judged claim). The words differ by vocabulary only where the paths do (a
comparison says ``higher``, the claim "Post-LN is more sensitive" says ``held``; both say "not decided: did not
learn" for a model that did not learn), and the reference reading is computed independently from scipy.
"""

from __future__ import annotations

import math

import pytest
from scipy.stats import ttest_1samp

from normlab.decide.evidence import DECIDED, UNDECIDED, record
from normlab.decide.looks import look
from normlab.decide.question import Question
from normlab.decide.verdicts import judge_family
from normlab.decide.vocab import (HELD, HIGHER, INCONCLUSIVE, NOT_DECIDED_DNL, NOT_TESTABLE, PRESENT_AT_INIT,
                                  WITHDRAWN, WITHIN_MARGIN)
from normlab.decide.vocab import UNDECIDED as UNDECIDED_WORD
from normlab.experiments.looks import learned_flags, primary_values
from normlab.experiments.lrgrid import GridRun, analyze

UNIGRAM, INIT = 4.7, 8.0
LRS = (1e-3, 1e-2)
SEEDS = list(range(6))


def _runs(failed: set[int] = frozenset(), diverged: set[int] = frozenset()) -> list[GridRun]:
    """Pre-LN: 3.0 / 3.1 at the two learning rates; Post-LN: 3.0 / 3.5 + 0.02 seed (more LR-sensitive), except in
    the ``failed`` seeds (4.65 and 4.8: did not learn, near the unigram level) and the ``diverged`` ones."""
    runs = []
    for s in SEEDS:
        for lr, pre in zip(LRS, (3.0 + 0.01 * s, 3.1)):
            runs.append(GridRun("Pre-LN", lr, s, "completed", pre, INIT, f"pre{lr}{s}", unigram=UNIGRAM))
        for lr, post in zip(LRS, (3.0, 3.5 + 0.02 * s)):
            if s in failed:
                post = 4.65 if lr == LRS[0] else 4.8
            status = "diverged" if s in diverged else "completed"
            runs.append(GridRun("Post-LN", lr, s, status, None if s in diverged else post, INIT, f"post{lr}{s}",
                                unigram=UNIGRAM))
    return runs


Q = {"declared": True, "primary": "lr_sensitivity", "baseline": "Pre-LN", "family": ["Post-LN"], "alpha": 0.05,
     "correction": "holm", "paired": True}
QUESTION = Question("lr_sensitivity", "Pre-LN", ("Post-LN",))


def _paths(runs: list[GridRun], looks: list[int] | None = None, seeds: list[int] = SEEDS) -> dict[str, str]:
    grid = analyze(runs, question=Q)
    (row,) = [r for r in grid.paired if r.role == "primary"]
    values, learned = primary_values(grid, "lr_sensitivity"), learned_flags(grid)
    looks = looks or [3, 6]
    seq = look(QUESTION, values, learned, seeds, looks, len(looks) - 1)["comparisons"][0]
    # the claim "Post-LN is more LR-sensitive than Pre-LN", per seed: sensitivity(post) - sensitivity(pre), with
    # the details the claims execution records for the guard
    best = {g.name: {s.seed: s.best for s in g.seeds} for g in grid.groups}
    diffs = [values["Post-LN"][s] - values["Pre-LN"][s] for s in seeds]
    details = [{"learn_bpb": {"grid_post": best["Post-LN"][s], "grid_pre": best["Pre-LN"][s]}, "unigram_bpb": UNIGRAM}
               for s in seeds]
    (claim,) = judge_family([{"values": diffs, "details": details, "direction": "greater", "test": "t"}])
    rec = record({**claim, "current_definition": True, "exploratory": False}, [], [])
    return {"compare": row.decision, "until_decided": seq["decision"], "claim": claim["verdict"],
            "advise": rec["status"], "seq": seq, "diffs": diffs, "claim_p": claim["p"]}


def test_a_learner_is_decided_the_same_way_on_every_path():
    got = _paths(_runs())
    assert ttest_1samp(got["diffs"], 0).pvalue < 0.01 and min(got["diffs"]) > 0  # the independent reading
    assert (got["compare"], got["until_decided"], got["claim"], got["advise"]) == (HIGHER, HIGHER, HELD, DECIDED)


def test_two_seeds_are_not_testable_on_any_path():
    """The minimum-seed rule (normlab.decide.verdicts.MIN_SEEDS = 3), made in one place: the same clean effect on 2
    seeds, which a t-test with 1 degree of freedom calls significant (scipy, independently), is decided on no path;
    on 3 seeds it is."""
    two = [r for r in _runs() if r.seed in (0, 1)]
    got = _paths(two, looks=[2], seeds=[0, 1])
    assert ttest_1samp(got["diffs"], 0).pvalue < 0.05  # what a 2-seed t would have decided
    assert (got["compare"], got["until_decided"], got["claim"], got["advise"]) == (
        NOT_TESTABLE, UNDECIDED_WORD, INCONCLUSIVE, UNDECIDED)
    assert got["claim_p"] is None
    three = _paths([r for r in _runs() if r.seed in (0, 1, 2)], looks=[3], seeds=[0, 1, 2])
    assert ttest_1samp(three["diffs"], 0).pvalue < 0.05
    assert (three["compare"], three["until_decided"], three["claim"]) == (HIGHER, HIGHER, HELD)


@pytest.mark.parametrize("kind", ["did not learn", "diverged"])
def test_a_model_that_did_not_learn_or_diverged_is_not_decided_on_any_path(kind):
    """One seed of six where Post-LN collapsed to the unigram level at every learning rate, or diverged: its LR
    sensitivity is then *small* (every run scores L_init), but no path decides on it."""
    runs = _runs(failed={4}) if kind == "did not learn" else _runs(diverged={4})
    got = _paths(runs)
    assert (got["compare"], got["until_decided"], got["claim"]) == (NOT_DECIDED_DNL,) * 3
    assert got["advise"] == UNDECIDED


def test_a_decision_at_an_early_look_is_withdrawn_when_the_variant_stops_learning_later():
    """Decided at look 1 on seeds 0-2; Post-LN did not learn in seeds 3-5 of look 2: the look withdraws it, with
    the reason, and says what a fixed design on the same six seeds says."""
    runs = _runs(failed={3, 4, 5})
    first = look(QUESTION, *_values(runs), SEEDS, [3, 6], 0)["comparisons"][0]
    got = _paths(runs)
    seq = got["seq"]
    assert seq["decision"] == got["compare"] == got["claim"] == NOT_DECIDED_DNL and seq["decided_at_look"] is None
    # withdrawn, with the reason, exactly where look 1 had decided (the t boundary with 3 seeds is steep)
    assert ("withdrawn" in seq) == (first["decision"] == HIGHER)
    assert "withdrawn" not in seq or seq["withdrawn"].startswith(f"{WITHDRAWN}: {HIGHER} at look 1, but at look 2")


def test_the_withdrawal_rule_on_a_decision_that_crossed_its_boundary():
    """Huge effect, tiny noise: decided at look 1 of [3, 6]; the variant then did not learn in seed 4."""
    values = {"Pre-LN": {s: 0.1 + 1e-3 * s for s in SEEDS}, "Post-LN": {s: 2.0 + 2e-3 * (s % 2) for s in SEEDS}}
    learned = {"Pre-LN": {s: True for s in SEEDS}, "Post-LN": {s: s != 4 for s in SEEDS}}
    assert look(QUESTION, values, learned, SEEDS, [3, 6], 0)["comparisons"][0]["decision"] == HIGHER
    late = look(QUESTION, values, learned, SEEDS, [3, 6], 1)["comparisons"][0]
    assert late["decision"] == NOT_DECIDED_DNL and late["withdrawn"].startswith(f"{WITHDRAWN}: {HIGHER} at look 1")


def _values(runs):
    grid = analyze(runs, question=Q)
    return primary_values(grid, "lr_sensitivity"), learned_flags(grid)


def test_an_effect_present_at_initialisation_is_not_a_training_effect():
    """A state claim whose end value equals its value at step 0 plus noise: the end value alone is decided (raw
    held), the claim is 'present at initialisation' and advise does not count it as decided."""
    init = [0.045, 0.047, 0.044, 0.046, 0.045]
    end = [x + d for x, d in zip(init, (0.004, -0.003, 0.002, -0.001, 0.001))]
    assert ttest_1samp(end, 0).pvalue < 1e-4 and ttest_1samp([e - i for e, i in zip(end, init)], 0).pvalue > 0.05
    (c,) = judge_family([{"values": end, "details": [{"v_init": x} for x in init], "direction": "greater",
                          "test": "t", "at_init": "v_init"}])
    assert c["verdict"] == PRESENT_AT_INIT and c["at_init"]["init"][0] == pytest.approx(sum(init) / 5)
    assert record({**c, "current_definition": True, "exploratory": False}, [], [])["status"] == UNDECIDED


def test_an_equivalence_is_adjusted_with_its_family_on_both_paths():
    """Per-seed differences inside a 0.01 margin whose TOST p is below 0.05 alone but not after Holm with two other
    members of the family (whose tests are null): not 'within margin' through compare's fixed design or the
    claims suite."""
    from statsmodels.stats.multitest import multipletests

    from normlab.decide.looks import fixed_decisions
    from normlab.decide.verdicts import tost

    d = [0.005, -0.006, 0.008, -0.004, 0.003]
    eq = tost(d, 0.0, 0.01)
    assert eq["p"] < 0.05
    nulls = [[0.3, -0.2, 0.5, -0.4, 0.1], [-0.3, 0.25, -0.1, 0.2, 0.05]]
    members = ["A", "B", "C"]
    values = {"base": {s: 0.0 for s in range(5)}, "A": dict(enumerate(d)), "B": dict(enumerate(nulls[0])),
              "C": dict(enumerate(nulls[1]))}
    q = Question("final_loss", "base", tuple(members), margin=0.01)
    rows = fixed_decisions(values, q)
    ps = [ttest_1samp(x, 0).pvalue for x in (d, *nulls)] + [tost(x, 0.0, 0.01)["p"] for x in (d, *nulls)]
    want = multipletests(ps, method="holm")[1][3]  # A's TOST, adjusted with the family's six tests
    assert rows[0]["tost"]["p_adj"] == pytest.approx(want, rel=1e-9) and want > 0.05
    assert rows[0]["decision"] != WITHIN_MARGIN
    claims = judge_family([{"values": x, "details": [], "direction": "greater", "test": "t", "practical_margin": 0.01}
                           for x in (d, *nulls)])
    assert claims[0]["tost"]["p_adj"] == pytest.approx(want, rel=1e-9) and claims[0]["verdict"] != WITHIN_MARGIN
    assert math.isclose(claims[0]["tost"]["p"], eq["p"])
