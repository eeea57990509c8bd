"""normlab.decide.decisions on stored sweeps (no training): the primary family adjusted against statsmodels,
"did not learn" variants never ranked, collapse rates, verdict words only inside the declared family, a design
changed after results flagged, and seeds needed from the pooled SD."""

from __future__ import annotations

import html as htmllib
import math
import re

import pytest
from scipy.stats import ttest_rel
from statsmodels.stats.multitest import multipletests

from normlab.experiments.design import record_design, stored_design
from normlab.experiments.store import Store
from normlab.report import load, write_report
from normlab.report.analysis import primary_family
from normlab.experiments.lrgrid import DID_NOT_LEARN_MARGIN
from normlab.stats.exact import clopper_pearson
from normlab.stats.intervals import mean_ci
from normlab.stats.planning import pooled_sd, seeds_needed_range
from tests.report_fakes import INIT, UNIGRAM, fake_grid

LRS = [0.001, 0.01, 0.1]
SEEDS = [0, 1, 2, 3, 4]
# per-seed noise, fixed: seed s adds NOISE[s] at every learning rate of a variant (plus a small lr-specific part)
NOISE = [0.00, 0.05, -0.04, 0.02, -0.03]


def curve(shape: tuple[float, float, float], k: int):
    return lambda s, lr: shape[LRS.index(lr)] + NOISE[s] + 0.02 * ((s * 7 + LRS.index(lr) * 3 + k) % 5)


# Base and three others that learn; "Flat" learned only the unigram at every learning rate (its raw LR
# sensitivity is the smallest of all); "Wild" is outside the declared family with a large effect
SHAPES = {"Base": (4.40, 3.90, 4.30), "Close": (4.38, 3.91, 4.26), "Steep": (4.35, 3.70, 4.36),
          "Smooth": (4.10, 3.90, 4.00), "Flat": (4.71, 4.70, 4.72), "Wild": (4.50, 3.50, 4.50)}


def final(v: str, s: int, lr: float) -> float:
    return curve(SHAPES[v], sum(map(ord, v)))(s, lr)


FAMILY = ["Close", "Steep", "Smooth", "Flat"]


@pytest.fixture(scope="module")
def declared(tmp_path_factory):
    d = tmp_path_factory.mktemp("declared")
    fake_grid(d, list(SHAPES), SEEDS, LRS, final, primary="lr_sensitivity", baseline="Base", family=FAMILY)
    return d, write_report(d)


def _sens(v: str, s: int) -> float:
    """LR sensitivity by its formula: a run that collapsed (at or above the unigram level - 0.1) scores INIT."""
    losses = [INIT if final(v, s, lr) >= UNIGRAM - 0.1 else min(final(v, s, lr), INIT) for lr in LRS]
    return sum(x - min(losses) for x in losses) / len(losses)


def test_holm_over_the_declared_family_matches_statsmodels(declared):
    d, rep = declared
    fam = [r for r in rep["report"].grid.paired if r.role == "primary"]
    assert [r.variant for r in fam] == FAMILY and all(r.metric == "LR sensitivity" for r in fam)
    raw = {v: ttest_rel([_sens(v, s) for s in SEEDS], [_sens("Base", s) for s in SEEDS]).pvalue for v in FAMILY}
    for r in fam:
        assert r.diff.p == pytest.approx(raw[r.variant], rel=1e-9)
    # Flat did not learn: it stays in the family with p = 1 (so m = 4), and is never decided
    ps = [raw[v] if v != "Flat" else 1.0 for v in FAMILY]
    reject, adj, _, _ = multipletests(ps, alpha=0.05, method="holm")
    for r, q, rej in zip(fam, adj, reject):
        assert r.p_adjusted == pytest.approx(q, rel=1e-12)
        assert r.decided == (bool(rej) and r.variant != "Flat")
    by = {r.variant: r for r in fam}
    assert by["Flat"].verdict == "not decided: did not learn" and not by["Flat"].decided
    assert by["Steep"].verdict == "higher" and by["Smooth"].verdict == "lower"  # this data's decisions
    assert by["Close"].verdict == "undecided" and by["Close"].diff.p > 0.05
    # the function the sequential procedure calls returns the same family
    gr = primary_family(d)
    assert [(r.variant, r.p_adjusted, r.decided) for r in gr.paired if r.role == "primary"] == \
        [(r.variant, r.p_adjusted, r.decided) for r in fam]
    assert gr.exploratory is None and gr.question["primary"] == "lr_sensitivity"


def test_benjamini_hochberg_option(tmp_path):
    fake_grid(tmp_path, list(SHAPES), SEEDS, LRS, final, primary="best_loss", baseline="Base", correction="bh")
    fam = [r for r in load(tmp_path).grid.paired if r.role == "primary"]
    assert [r.variant for r in fam] == [v for v in SHAPES if v != "Base"] and fam[0].metric == "best loss"
    # Flat did not learn: the guard holds for every primary metric, so it enters the adjustment as p = 1
    assert [r.variant for r in fam if r.note] == ["Flat"]
    ps = [1.0 if r.note else r.diff.p for r in fam]
    reject, adj, _, _ = multipletests(ps, alpha=0.05, method="fdr_bh")
    assert [r.p_adjusted for r in fam] == pytest.approx(list(adj), rel=1e-12)
    assert [r.decided for r in fam] == [bool(x) and not r.note for x, r in zip(reject, fam)]


def test_a_variant_that_did_not_learn_is_never_ranked(declared):
    d, rep = declared
    gr = rep["report"].grid
    flat = next(g for g in gr.groups if g.name == "Flat")
    # its raw LR sensitivity is the smallest of all variants, yet it has no rank
    assert flat.sensitivity.mean == min(g.sensitivity.mean for g in gr.groups)
    assert flat.rank is None and flat.learned is False
    assert all(s.best >= UNIGRAM - DID_NOT_LEARN_MARGIN for s in flat.seeds)
    ranked = sorted((g for g in gr.groups if g.rank), key=lambda g: g.rank)
    assert [g.rank for g in ranked] == list(range(1, len(SHAPES)))
    assert [g.name for g in ranked] == sorted((v for v in SHAPES if v != "Flat"),
                                              key=lambda v: sum(_sens(v, s) for s in SEEDS))
    md = (d / "report.md").read_text()
    row = next(line for line in md.splitlines() if line.startswith("| – | Flat |"))
    worst = max(s.best for s in flat.seeds)
    assert f"did not learn (best {worst:.3f}, unigram {UNIGRAM:.3f})" in row
    assert any(s.startswith("Flat did not learn at its best learning rate in 5 of 5 seeds") for s in rep["summary"])
    js = rep["lr"]
    assert next(v for v in js["variants"] if v["variant"] == "Flat")["rank"] is None


def test_collapse_rate_per_learning_rate_when_seeds_split(tmp_path):
    """At lr 0.1 seeds 0 and 3 of "Split" end at the unigram (collapsed), the other three train: rate 2/5 with the
    exact interval, and the loss over the three that trained."""
    def f(v, s, lr):
        if v == "Split" and lr == 0.1 and s in (0, 3):
            return UNIGRAM + 0.02
        return final("Base", s, lr) - (0.1 if v == "Split" else 0.0)

    fake_grid(tmp_path, ["Base", "Split"], SEEDS, LRS, f, primary="lr_sensitivity")
    rep = write_report(tmp_path)
    g = next(g for g in rep["report"].grid.groups if g.name == "Split")
    row = next(c for c in g.collapse() if c.lr == 0.1)
    ref = clopper_pearson(2, 5)
    assert (row.rate.k, row.rate.n, row.rate.low, row.rate.high) == (2, 5, ref.low, ref.high)
    ok = mean_ci([f("Split", s, 0.1) for s in SEEDS if s not in (0, 3)])
    assert row.loss_ok.mean == pytest.approx(ok.mean) and row.loss_ok.half == pytest.approx(ok.half)
    assert g.learned is True and g.rank is not None  # every seed learned at its own best learning rate
    assert any(s.startswith("Split's seeds split") and "lr 0.1: 2/5 collapsed (40%" in s for s in rep["summary"])
    md = (tmp_path / "report.md").read_text()
    assert "## Collapse per learning rate" in md and f"| Split | 0.1 | 2/5 | 40% ({ref.low:.0%}–{ref.high:.0%}) |" in md


VERDICT = re.compile(r"\b(lower|higher)\b|beyond noise", re.IGNORECASE)


def _text_of_html(page: str) -> str:
    page = re.sub(r"<img [^>]*>", "", page)
    page = re.sub(r"<(br|/tr|/li|/p|/div|/h\d)[^>]*>", "\n", page)
    return htmllib.unescape(re.sub(r"<[^>]+>", " | ", page))


def _check_verdict_lines(text: str, family: list[str], primary_label: str) -> int:
    """Every line with a verdict word is a primary-family table row or the family's decision sentence and names
    only family members; returns how many such lines there are."""
    n = 0
    for line in text.splitlines():
        if not VERDICT.search(line):
            continue
        n += 1
        cells = [c.strip() for c in line.split("|") if c.strip()]
        if "primary" in cells:  # a table row of the family
            assert cells[0] in family and primary_label in cells, line
            continue
        m = re.match(rf"\W*{re.escape(primary_label)} (lower|higher) than Base beyond noise: (.*)$", line.strip(),
                     re.IGNORECASE)
        assert m, f"verdict word outside the declared family: {line!r}"
        named = re.findall(r"(?:^|; )([A-Za-z]+) \(", m.group(2))
        assert named and set(named) <= set(family), line
    return n


def test_no_verdict_word_outside_the_declared_family(declared):
    d, rep = declared
    for text in ((d / "report.md").read_text(), _text_of_html((d / "report.html").read_text()),
                 "\n".join(rep["summary"])):
        assert _check_verdict_lines(text, FAMILY, "LR sensitivity") >= 2
    # Wild has the largest effect of all but is not in the family: exploratory everywhere, with its estimate
    wild = [r for r in rep["report"].grid.paired if r.variant == "Wild"]
    assert wild and all(r.role == "exploratory" and r.verdict == "exploratory" for r in wild)
    assert any(r.diff.p < 0.001 for r in wild)
    # best loss rows of family members are exploratory too
    assert all(r.role == "exploratory" for r in rep["report"].grid.paired if r.metric == "best loss")


def test_an_undeclared_sweep_decides_nothing(tmp_path):
    fake_grid(tmp_path, SMALL, SEEDS, LRS, final, baseline="Base")
    rep = write_report(tmp_path)
    assert all(r.role == "exploratory" for r in rep["report"].grid.paired)
    assert any(s.startswith("This sweep declared no question") for s in rep["summary"])
    for text in ((tmp_path / "report.md").read_text(), _text_of_html((tmp_path / "report.html").read_text())):
        assert _check_verdict_lines(text, [], "LR sensitivity") == 0


SMALL = ["Base", "Steep", "Smooth"]  # decided lower / higher when declared


def test_a_design_changed_after_results_is_flagged(tmp_path):
    from normlab.report.document import section_md
    from normlab.report.lrsection import rows_json, sections

    fake_grid(tmp_path, SMALL, SEEDS, LRS, final, primary="lr_sensitivity", baseline="Base")
    store = Store(tmp_path / "results.sqlite")
    design = stored_design(store.meta())
    assert {r.verdict for r in load(tmp_path).grid.paired if r.role == "primary"} == {"lower", "higher"}
    # two seeds added after all 45 runs finished, outside a sequential plan
    assert record_design(store, {**design, "seeds": SEEDS + [5, 6]}) == ["seeds"]
    rep = load(tmp_path)
    gr = rep.grid
    assert gr.exploratory and "after 45 run(s) had finished" in gr.exploratory and "seeds" in gr.exploratory
    assert all(r.role == "exploratory" for r in gr.paired)
    assert any(s.startswith("Every comparison below is exploratory") and "seeds changed" in s for s in rep.summary)
    md = [line for s in sections(gr, {}) for line in section_md(s)]
    assert _check_verdict_lines("\n".join(md + rep.summary), [], "LR sensitivity") == 0
    assert rows_json(gr)["exploratory_reason"] == gr.exploratory


def test_a_sequential_look_is_not_a_change_of_design(tmp_path):
    fake_grid(tmp_path, SMALL, SEEDS, LRS, final, primary="lr_sensitivity", baseline="Base")
    store = Store(tmp_path / "results.sqlite")
    record_design(store, {**stored_design(store.meta()), "seeds": SEEDS + [5]}, sequential=True)
    assert load(tmp_path).grid.exploratory is None


def test_a_baseline_chosen_when_reporting_is_exploratory(tmp_path):
    fake_grid(tmp_path, SMALL, SEEDS, LRS, final, primary="lr_sensitivity", baseline="Base")
    gr = load(tmp_path, baseline="Steep").grid
    assert gr.baseline == "Steep" and "--baseline" in gr.exploratory
    assert all(r.role == "exploratory" for r in gr.paired)


def test_seeds_needed_from_the_comparisons_own_differences(declared):
    """A paired comparison plans from the SD of its own per-seed differences (with its chi-square interval), not
    from an SD pooled over every variant: a comparison whose seeds share their noise needs fewer seeds than the
    pooled figure says, one whose differences scatter more needs more."""
    from statistics import stdev

    _, rep = declared
    gr = rep["report"].grid
    learned = [v for v in SHAPES if v != "Flat"]
    pooled = pooled_sd([[_sens(v, s) for s in SEEDS] for v in learned])
    close = next(r for r in gr.paired if r.variant == "Close" and r.role == "primary")
    diffs = [_sens("Close", s) - _sens("Base", s) for s in SEEDS]
    own = pooled_sd([diffs])
    assert own.sd == pytest.approx(stdev(diffs)) and own.df == len(SEEDS) - 1
    # a member of the declared family of m = len(FAMILY): at Holm's first level alpha / m, the level it must reach
    ref = seeds_needed_range(close.diff.mean, own, paired_factor=1.0, level=1 - 0.05 / len(FAMILY))
    assert (close.seeds.n, close.seeds.low, close.seeds.high) == (ref.n, ref.low, ref.high)
    assert close.seeds.sd.sd == pytest.approx(stdev(diffs))
    at_alpha = seeds_needed_range(close.diff.mean, own, paired_factor=1.0)
    assert at_alpha.n is None or ref.n is None or at_alpha.n < ref.n  # ignoring Holm would promise too few seeds
    pooled_ref = seeds_needed_range(close.diff.mean, pooled, paired_factor=math.sqrt(2), level=1 - 0.05 / 4)
    assert (pooled_ref.n, pooled_ref.low, pooled_ref.high) != (ref.n, ref.low, ref.high)  # the two rules differ here
    js = next(p for p in rep["lr"]["paired"] if p["variant"] == "Close" and p["metric"] == "LR sensitivity")
    assert js["seeds_needed"] == ref.n and js["seeds_needed_range"] == [ref.low, ref.high]


def test_sensitivity_checks_beside_the_paired_test(declared):
    """Per-seed correlation, Welch, exact sign-flip p from n = 5 and the smallest p n can reach (2 / 2^5)."""
    from scipy.stats import pearsonr, ttest_ind

    _, rep = declared
    r = next(r for r in rep["report"].grid.paired if r.variant == "Steep" and r.metric == "LR sensitivity")
    a, b = [_sens("Steep", s) for s in SEEDS], [_sens("Base", s) for s in SEEDS]
    assert r.correlation == pytest.approx(pearsonr(a, b).statistic, rel=1e-9)
    assert r.welch.p == pytest.approx(ttest_ind(a, b, equal_var=False).pvalue, rel=1e-9)
    assert r.min_exact_p == 0.0625
    d = [x - y for x, y in zip(a, b)]
    flips = [sum(x * (1 if m >> i & 1 else -1) for i, x in enumerate(d)) for m in range(32)]
    assert r.exact_p == pytest.approx(sum(abs(f) >= abs(sum(d)) - 1e-12 for f in flips) / 32)
    js = next(p for p in rep["lr"]["paired"] if p["variant"] == "Steep" and p["metric"] == "LR sensitivity")
    assert js["min_exact_p"] == 0.0625 and js["role"] == "primary" and js["reading"] == "higher"


def test_a_family_member_without_finished_runs_still_counts_in_m():
    """Holm over the declared family of 3 when one member has no finished run: m = 3 (its p counts as 1), not 2."""
    from normlab.experiments.lrgrid import GridRun, analyze

    base = [3.0, 3.1, 2.9, 3.05, 2.95]
    runs = [GridRun("B", 1e-3, s, "completed", f, 8.0, f"b{s}") for s, f in enumerate(base)]
    runs += [GridRun("X", 1e-3, s, "completed", f - 0.2 + 0.01 * s, 8.0, f"x{s}") for s, f in enumerate(base)]
    runs += [GridRun("Gone", 1e-3, s, "failed", None, 8.0, f"g{s}") for s in range(5)]
    q = {"declared": True, "primary": "final_loss", "baseline": "B", "family": ["X", "Gone"], "alpha": 0.05,
         "correction": "holm", "paired": True}
    gr = analyze(runs, question=q)
    x, = [r for r in gr.paired if r.role == "primary"]
    assert x.p_adjusted == pytest.approx(multipletests([x.diff.p, 1.0], method="holm")[1][0], rel=1e-12)


def test_a_baseline_that_did_not_learn_blocks_lr_sensitivity_decisions():
    from normlab.experiments.lrgrid import GridRun, analyze

    def runs(name, shape):
        return [GridRun(name, lr, s, "completed", shape[i] + 0.01 * s * (i + 1), INIT, f"{name}{s}{i}",
                        unigram=UNIGRAM) for s in range(3) for i, lr in enumerate(LRS)]

    q = {"declared": True, "primary": "lr_sensitivity", "baseline": "Flat", "family": ["Good"], "alpha": 0.05,
         "correction": "holm", "paired": True}
    gr = analyze(runs("Flat", SHAPES["Flat"]) + runs("Good", SHAPES["Smooth"]), question=q)
    good, = [r for r in gr.paired if r.role == "primary"]
    assert good.verdict == "not decided: baseline did not learn" and not good.decided and good.p_adjusted == 1.0
