"""normlab.decide.question: one Question, whichever way it is declared. A sweep file and a claim that ask the
same thing give the same frozen Question, and the sweep's report, its fixed-design decisions (--replicate-on) and
the claims' judge give the same verdict from normlab.decide.verdicts, with the p-value scipy's paired t gives;
the stored design and the stored spec read back to the Question that was parsed."""

from __future__ import annotations

import pytest
import yaml
from scipy.stats import t as t_dist
from scipy.stats import ttest_rel

from normlab.errors import NormlabError
from normlab.experiments.claims.specs import get_claim
from normlab.decide.question import (
    Question,
    claim_question,
    parse_question,
    question_of,
    stored_question,
)
from normlab.experiments.sweep import SweepSpec, dump_spec, load_sweep, parse_sweep
from normlab.decide.verdicts import (
    CLAIMED,
    DECIDED,
    HELD,
    INCONCLUSIVE,
    NOT_HELD,
    UNDECIDED,
    WITHIN_MARGIN,
    judge_family,
)
from normlab.report.analysis import load
from normlab.report.sequential import fixed_decisions, learned_flags, primary_values
from tests.report_fakes import fake_grid

LRS = [0.001, 0.01, 0.1]
SEEDS = [0, 1, 2, 3, 4, 5]
# every final loss stays below the collapse line (the unigram 4.671 - 0.1): the three effects are graded, not collapses
BASE_SHAPE = (4.10, 3.60, 4.00)
SHAPES = {"higher": (4.32, 3.62, 4.28), "lower": (3.90, 3.61, 3.80), "null": BASE_SHAPE}


def _final(shape_of: dict[str, tuple[float, float, float]]):
    def final(v: str, s: int, lr: float) -> float:
        i = LRS.index(lr)
        return shape_of[v][i] + 0.03 * s + 0.015 * ((s * 7 + i * 3 + len(v)) % 5)
    return final


def test_a_sweep_file_and_a_claim_declare_the_same_question():
    claim = get_claim("peri-lr-sensitivity")  # per seed: sens(grid_pre) - sens(grid_peri), expected > 0
    variant, baseline = claim.args
    sweep = parse_sweep({"name": "peri", "base": "tiny", "lr_grid": LRS, "seeds": [0, 1, 2, 3],
                         "variants": [{"name": baseline, "set": {"model.placement": "peri"}},
                                      {"name": variant, "set": {"model.placement": "pre"}}],
                         "primary": "lr_sensitivity", "baseline": baseline, "family": [variant]})
    expected = Question("lr_sensitivity", baseline, (variant,), 0.05, "holm", True, True, None, (0, 1, 2, 3), "")
    assert sweep.question == expected == claim_question(claim, seeds=4)
    assert hash(sweep.question) == hash(expected)  # frozen: usable as a key
    # a claim measured otherwise (a slope) declares no sweep question
    assert claim_question(get_claim("cod-growth"), seeds=4) is None


@pytest.mark.parametrize("effect", ["higher", "lower", "null"])
def test_the_same_question_gets_the_same_verdict_on_every_path(tmp_path, effect):
    claim = get_claim("peri-lr-sensitivity")
    variant, baseline = claim.args
    fake_grid(tmp_path, [baseline, variant], SEEDS, LRS, _final({baseline: BASE_SHAPE, variant: SHAPES[effect]}),
              primary="lr_sensitivity", baseline=baseline, family=[variant])
    sweep = load_sweep(tmp_path / "sweep.yaml")
    assert sweep.question == claim_question(claim, seeds=len(SEEDS))

    grid = load(tmp_path).grid
    values = primary_values(grid, "lr_sensitivity")
    diffs = [values[variant][s] - values[baseline][s] for s in SEEDS]
    ref_p = ttest_rel([values[variant][s] for s in SEEDS], [values[baseline][s] for s in SEEDS]).pvalue

    # the report's primary family
    (row,) = [r for r in grid.paired if r.role == "primary"]
    # the fixed design's decisions (what --replicate-on compares)
    (fixed,) = fixed_decisions(values, stored_question(sweep.resolved, [g.name for g in grid.groups]),
                               learned_flags(grid))
    # the claim, judged as a family of one
    (judged,) = judge_family([{"values": diffs, "details": [{} for _ in SEEDS], "direction": claim.direction,
                               "null": claim.null, "margin": claim.margin, "tolerance": claim.tolerance,
                               "test": claim.test, "practical_margin": claim.practical_margin,
                               "observable": claim.observable, "args": list(claim.args), "must_learn": []}])
    assert row.diff.p == pytest.approx(ref_p, rel=1e-9) == judged["p"] == fixed["p"]
    assert row.p_adjusted == pytest.approx(judged["p_adj"], rel=1e-12) == fixed["p_holm"]
    assert row.verdict == fixed["decision"]
    word = row.verdict
    if effect == "null":
        assert word == UNDECIDED and judged["verdict"] == INCONCLUSIVE
    else:
        assert word == effect and word in DECIDED
        assert judged["verdict"] == (HELD if word == CLAIMED[claim.direction] else NOT_HELD)


def test_the_stored_design_and_spec_read_back_to_the_parsed_question():
    raw = {"name": "rt", "base": "tiny", "lr_grid": LRS, "seeds": [3, 4],
           "variants": [{"name": n, "set": {"model.width": w}} for n, w in (("A", 32), ("B", 40), ("C", 48))],
           "primary": "best_loss", "baseline": "B", "family": ["A", "C"], "alpha": 0.01, "correction": "bh"}
    sweep = parse_sweep(raw)
    q = sweep.question
    assert (q.primary, q.baseline, q.family, q.alpha, q.correction, q.declared) == (
        "best_loss", "B", ("A", "C"), 0.01, "bh", True)
    assert question_of(sweep.design(), baseline=None, grid=True) == q  # the store's design meta
    stored = SweepSpec.from_mapping(yaml.safe_load(dump_spec(sweep)))  # the stored sweep.yaml, read back typed
    assert stored == sweep.resolved
    assert stored_question(stored, ["A", "B", "C"]) == q
    assert stored_question(stored, ["A", "B"]).family == ("A",)  # only the members that ran
    # undeclared: the defaults, written once
    plain = parse_question({}, ["A", "B"], grid=False, source="s")
    assert plain == Question("final_loss", "A", ("B",), 0.05, "holm", True, False)
    assert question_of(None, baseline="A", grid=True) == Question("lr_sensitivity", "A", None, declared=False)


def test_a_declared_margin_is_the_same_within_margin_on_every_path(tmp_path):
    """mixln-lr-best declares a practical margin; the sweep file that asks its question declares the same margin,
    and a difference whose TOST interval lies inside it is "within margin" in the report, in the fixed design's
    decisions and in the claims' judge alike."""
    claim = get_claim("mixln-lr-best")  # per seed: best(grid_pre) - best(grid_mix), margin 0.01
    variant, baseline = claim.args

    def final(v: str, s: int, lr: float) -> float:
        i = LRS.index(lr)
        own = 2 * (v == variant)
        return BASE_SHAPE[i] + 0.03 * s + (0.002 if v == variant else 0.0) + 0.001 * ((s * 5 + i + own) % 4)

    fake_grid(tmp_path, [baseline, variant], SEEDS, LRS, final, primary="best_loss", baseline=baseline,
              family=[variant], margin=claim.practical_margin)
    sweep = load_sweep(tmp_path / "sweep.yaml")
    assert sweep.question == claim_question(claim, seeds=len(SEEDS)) and sweep.question.margin == 0.01
    grid = load(tmp_path).grid
    values = primary_values(grid, "best_loss")
    diffs = [values[variant][s] - values[baseline][s] for s in SEEDS]
    (row,) = [r for r in grid.paired if r.role == "primary"]
    (fixed,) = fixed_decisions(values, stored_question(sweep.resolved, [g.name for g in grid.groups]),
                               learned_flags(grid))
    (judged,) = judge_family([{"values": diffs, "details": [{} for _ in SEEDS], "direction": claim.direction,
                               "test": claim.test, "practical_margin": claim.practical_margin, "must_learn": []}])
    assert row.verdict == fixed["decision"] == judged["verdict"] == WITHIN_MARGIN
    # the interval: mean ± t_{0.95, n-1} s / sqrt(n), inside ±0.01 (an independent computation)
    m, sd = sum(diffs) / len(diffs), (sum((d - sum(diffs) / len(diffs)) ** 2 for d in diffs) / (len(diffs) - 1)) ** .5
    half = t_dist.ppf(0.95, len(diffs) - 1) * sd / len(diffs) ** 0.5
    assert row.tost["ci"] == pytest.approx([m - half, m + half], rel=1e-9) == judged["tost"]["ci"]
    assert -0.01 < m - half and m + half < 0.01


@pytest.mark.parametrize("extra, fragment", [
    ({"margin": -0.1}, "margin must be a number > 0"),
    ({"margin": True}, "margin must be a number > 0"),
    ({"margin": 0.01, "paired": False}, "margin is tested on the per-seed differences (TOST): it needs paired: true"),
    ({"margin": 0.01, "sequential": {"max_seeds": 6}}, "a sequential plan's boundaries test a difference"),
])
def test_a_bad_margin_is_one_line(extra, fragment):
    raw = {"name": "m", "base": "tiny", "lr_grid": LRS, "seeds": [0, 1, 2],
           "variants": [{"name": "A", "set": {"model.width": 32}}, {"name": "B", "set": {"model.width": 40}}],
           "primary": "best_loss", **extra}
    with pytest.raises(NormlabError) as e:
        parse_sweep(raw, source="m.yaml")
    assert fragment in str(e.value) and "\n" not in str(e.value)
