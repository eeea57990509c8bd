"""normlab.stats against independent references: statsmodels' multipletests, scipy's tests and binomtest, hand
enumeration of sign patterns, and the chi-square interval for a pooled SD."""

from __future__ import annotations

import itertools
import math
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats as sps

from normlab.stats.exact import clopper_pearson, min_permutation_p, min_sign_flip_p, permutation_p, sign_flip_p
from normlab.stats.intervals import paired_diff, t_cdf, t_ppf, two_sided_t_p, welch_diff
from normlab.stats.multiplicity import adjust, benjamini_hochberg, holm
from normlab.stats.planning import holm_first_level, paired_t_power, pooled_sd, seeds_needed_range

multipletests = pytest.importorskip("statsmodels.stats.multitest").multipletests

pvals = st.lists(st.floats(min_value=0.0, max_value=1.0, allow_nan=False), min_size=1, max_size=12)


def _statsmodels_adjusted(ps, method):
    """statsmodels' adjusted p-values. Its Holm branch runs ``gc.collect()`` on every call (0.1-0.4 s each with the
    whole suite's heap alive, 60 examples here); a no-op collection for the call changes no number."""
    with mock.patch("gc.collect", lambda *a: 0):
        return multipletests(ps, alpha=0.05, method=method)[1]


@settings(max_examples=60, deadline=None)
@given(pvals)
def test_holm_and_bh_match_statsmodels(ps):
    for name, method in (("holm", "holm"), ("bh", "fdr_bh")):
        ours = adjust(ps, name)
        ref = _statsmodels_adjusted(ps, method)
        assert ours == pytest.approx(list(ref), abs=1e-12)


def test_holm_hand_example():
    # m = 4: sorted 0.01, 0.03, 0.04, 0.2 -> 0.04, 0.09, max(0.09, 0.08) = 0.09, 0.2
    assert holm([0.01, 0.04, 0.03, 0.2]) == pytest.approx([0.04, 0.09, 0.09, 0.2])
    # a missing p-value is a member of the family counted as p = 1 (m stays 3), never dropped: statsmodels on
    # [0.02, 1, 0.5]; its own adjusted value stays None (not testable)
    ref = multipletests([0.02, 1.0, 0.5], method="holm")[1]
    assert holm([0.02, None, 0.5]) == [pytest.approx(ref[0]), None, pytest.approx(ref[2])]
    assert holm([0.02, None, 0.5])[0] == pytest.approx(0.06)
    ref = multipletests([0.02, 1.0, 0.5], method="fdr_bh")[1]
    assert benjamini_hochberg([0.02, None, 0.5]) == [pytest.approx(ref[0]), None, pytest.approx(ref[2])]
    with pytest.raises(ValueError):
        adjust([0.1], "bonferroni-ish")
    with pytest.raises(ValueError):
        holm([float("nan")])


def test_sign_flip_hand_example_and_floor():
    # n = 5, all positive: only the all-plus and all-minus patterns reach |T| -> 2 / 32
    assert sign_flip_p([0.3, 0.1, 0.2, 0.5, 0.4]) == pytest.approx(0.0625)
    assert min_sign_flip_p(5) == pytest.approx(0.0625)
    assert min_sign_flip_p(3) == pytest.approx(0.25)
    assert min_sign_flip_p(6) == pytest.approx(0.03125)
    d = [1.0, -0.5, 2.0, 0.25]
    t = abs(sum(d))
    hits = sum(abs(sum(s * v for s, v in zip(sg, d))) >= t - 1e-12 for sg in itertools.product((1, -1), repeat=4))
    assert sign_flip_p(d) == pytest.approx(hits / 16)
    assert sign_flip_p([0.0, 0.0]) == 1.0


@settings(max_examples=30, deadline=None)
@given(st.lists(st.floats(-5, 5, allow_nan=False), min_size=2, max_size=5),
       st.lists(st.floats(-5, 5, allow_nan=False), min_size=2, max_size=5))
def test_permutation_matches_scipy_exact(a, b):
    if len(set(a + b)) < 2:
        return
    # enumerate the splits by hand (an independent reference for scipy-backed code)
    pooled, na = a + b, len(a)
    obs = abs(sum(a) / na - sum(b) / len(b))
    vals = []
    for idx in itertools.combinations(range(len(pooled)), na):
        x = [pooled[i] for i in idx]
        y = [pooled[i] for i in range(len(pooled)) if i not in idx]
        vals.append(abs(sum(x) / na - sum(y) / len(y)))
    ref = sum(v >= obs * (1 - 1e-9) for v in vals) / len(vals)
    if any(0.0 < abs(v - obs) < 1e-6 * max(1.0, obs) for v in vals):
        return  # a near-tie (within 1e-6 but not equal): the two tie tolerances may count it differently
    assert permutation_p(a, b) == pytest.approx(ref, abs=1e-9)


@pytest.mark.parametrize("k,n", [(0, 5), (1, 5), (3, 7), (5, 5), (12, 40)])
def test_clopper_pearson_matches_binomtest(k, n):
    ci = sps.binomtest(k, n).proportion_ci(confidence_level=0.95, method="exact")
    ours = clopper_pearson(k, n)
    assert (ours.low, ours.high) == pytest.approx((ci.low, ci.high), abs=1e-10)
    assert ours.rate == k / n


def test_pooled_sd_and_its_interval():
    groups = [[1.0, 2.0, 4.0], [3.0, 3.5], [7.0]]
    v1, v2 = sps.tvar(groups[0]), sps.tvar(groups[1])
    sp = math.sqrt((2 * v1 + 1 * v2) / 3)
    p = pooled_sd(groups)
    assert p.df == 3 and p.sd == pytest.approx(sp)
    assert p.low == pytest.approx(sp * math.sqrt(3 / sps.chi2.ppf(0.975, 3)))
    assert p.high == pytest.approx(sp * math.sqrt(3 / sps.chi2.ppf(0.025, 3)))
    r = seeds_needed_range(0.5, p)
    assert r.low is not None and r.n is not None and r.low <= r.n
    assert r.high is None or r.high >= r.n
    assert pooled_sd([[1.0]]) is None


def test_t_functions_and_paired_diff_match_scipy():
    assert t_ppf(0.975, 4) == pytest.approx(sps.t.ppf(0.975, 4))
    assert t_cdf(-1.3, 2.5) == pytest.approx(sps.t.cdf(-1.3, 2.5))
    a, b = [3.1, 2.9, 3.6, 3.3], [2.8, 2.95, 3.0, 3.05]
    d = paired_diff(a, b)
    assert d.p == pytest.approx(sps.ttest_rel(a, b).pvalue)
    w = welch_diff(a, b)
    assert w.p == pytest.approx(sps.ttest_ind(a, b, equal_var=False).pvalue)
    assert two_sided_t_p(40.0, 3) == pytest.approx(2 * sps.t.sf(40.0, 3), rel=1e-9)


@pytest.mark.parametrize("na, nb", [(3, 3), (5, 5), (3, 4), (2, 5)])
def test_min_permutation_p_is_reached_by_separated_groups(na, nb):

    a, b = [float(i) for i in range(na)], [100.0 + i for i in range(nb)]
    assert permutation_p(a, b) == pytest.approx(min_permutation_p(na, nb))
    assert min_permutation_p(na, nb) == (2 if na == nb else 1) / math.comb(na + nb, na)


@pytest.mark.parametrize("delta, sd, n, alpha", [(0.279, 0.39, 4, 0.05 / 3), (0.5, 1.0, 10, 0.05),
                                                 (-1.2, 0.8, 3, 0.025), (0.0, 1.0, 6, 0.05)])
def test_paired_t_power_matches_the_noncentral_t_and_a_simulation_of_ttest_rel(delta, sd, n, alpha):
    """Power of the two-sided paired t-test: scipy's noncentral t by hand, and the rejection rate of
    scipy.stats.ttest_rel over simulated samples (an independent reference)."""
    import numpy as np

    got = paired_t_power(delta, sd, n, alpha)
    c = sps.t.ppf(1 - alpha / 2, n - 1)
    nc = delta * math.sqrt(n) / sd
    assert got == pytest.approx(sps.nct.sf(c, n - 1, nc) + sps.nct.cdf(-c, n - 1, nc), rel=1e-12)
    rng = np.random.default_rng(7)
    s = 40_000
    b = rng.standard_normal((s, n))
    a = b + delta + sd * rng.standard_normal((s, n))
    rate = (sps.ttest_rel(a, b, axis=1).pvalue <= alpha).mean()
    assert rate == pytest.approx(got, abs=4 * math.sqrt(got * (1 - got) / s) + 1e-3)
    if delta == 0.0:
        assert got == pytest.approx(alpha, rel=1e-9)  # under the null the power is the level


def test_paired_t_power_far_in_the_noncentral_tail_is_a_number():
    """Where scipy's noncentral t gives nan for the far tail (nc ~ 9 at 3 df: an effect 0.688 with SD 0.151 over 4
    seeds, as a replication reported 'nan' power), the power is the upper tail plus the lower tail integrated by
    quadrature, equal to the rejection rate of scipy.stats.ttest_rel over simulated samples."""
    import numpy as np

    delta, sd, n, alpha = 0.688, 0.1514, 4, 0.05
    nc = delta * math.sqrt(n) / sd
    assert math.isnan(sps.nct.cdf(-sps.t.ppf(1 - alpha / 2, n - 1), n - 1, nc))  # the case scipy cannot compute
    got = paired_t_power(delta, sd, n, alpha)
    assert got == pytest.approx(sps.nct.sf(sps.t.ppf(1 - alpha / 2, n - 1), n - 1, nc), abs=1e-15)
    rng = np.random.default_rng(7)
    s = 200_000
    b = rng.standard_normal((s, n))
    rate = (sps.ttest_rel(b + delta + sd * rng.standard_normal((s, n)), b, axis=1).pvalue <= alpha).mean()
    assert rate == pytest.approx(got, abs=4 * math.sqrt(got * (1 - got) / s) + 2e-5)


def test_holm_first_level_and_power_edge_cases():
    assert holm_first_level(0.05, 3) == pytest.approx(0.05 / 3) and holm_first_level(0.05, 0) == 0.05
    assert paired_t_power(0.3, None, 5, 0.05) is None and paired_t_power(0.3, 1.0, 1, 0.05) is None
    assert paired_t_power(0.3, 0.0, 5, 0.05) == 1.0
    # the QK-norm replication of the issue: effect -0.281, replication SD 0.390 * sqrt(4) / t_{0.975,3} over 4 seeds
    sd = 0.390 * 2 / sps.t.ppf(0.975, 3)
    assert paired_t_power(-0.281, sd, 4, 0.05 / 3) < 0.8


def test_the_one_did_not_learn_and_collapse_rules():
    from normlab.stats.learning import DID_NOT_LEARN_MARGIN, collapsed, did_not_learn, learning_note

    assert DID_NOT_LEARN_MARGIN == 0.1
    assert did_not_learn(3.9, 4.0) is True and did_not_learn(3.95, 4.0) is True  # at or above 4.0 - 0.1
    assert did_not_learn(3.8999, 4.0) is False and did_not_learn(5.49, 4.0) is True  # far worse than unigram: too
    assert did_not_learn(3.0, None) is None and did_not_learn(None, 4.0) is None
    assert did_not_learn(float("nan"), 4.0) is True
    assert collapsed(3.0, 4.0) is False and collapsed(3.0, 4.0, finished=False) is True
    assert collapsed(None, 4.0) is True and collapsed(3.0, None) is None and collapsed(3.95, 4.0) is True
    assert learning_note(3.0, 4.0) is None and "did not learn" in learning_note(4.2, 4.0)
