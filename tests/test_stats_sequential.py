"""normlab.stats.sequential: Lan–DeMets O'Brien–Fleming-type boundaries against published values, scipy's
multivariate normal and a direct Monte-Carlo; the whole sequential procedure (t transform, Holm over m comparisons at
every look) simulated under the global and a partial null (family-wise error <= alpha) and under an alternative
(power = the closed form)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import multivariate_normal, norm, ttest_1samp
from scipy.stats import t as student_t

from normlab.stats.sequential import (
    HolmLevels,
    crossing_probabilities,
    obf_spending,
    paired_z,
    sequential_holm,
    spending_boundaries,
    t_to_z,
)

FIVE = [0.2, 0.4, 0.6, 0.8, 1.0]


def test_boundaries_match_the_published_five_look_values():
    # Lan-DeMets O'Brien-Fleming-type spending, 5 equally spaced looks, two-sided alpha 0.05 (0.025 per side):
    # 4.877, 3.357, 2.680, 2.290, 2.031 (gsDesign sfLDOF / ldbounds; DeMets & Lan 1994, Stat Med 13)
    assert spending_boundaries(FIVE, 0.05) == pytest.approx([4.877, 3.357, 2.680, 2.290, 2.031], abs=6e-4)


def test_spending_function_closed_form():
    assert obf_spending(1.0, 0.05) == pytest.approx(0.05, rel=1e-12)
    assert obf_spending(0.0, 0.05) == 0.0
    # at t = 0.5 each side spends 2 - 2 Phi(z_{0.9875} / sqrt(0.5))
    assert obf_spending(0.5, 0.05) == pytest.approx(2 * (2 - 2 * norm.cdf(norm.ppf(1 - 0.0125) / math.sqrt(0.5))))
    # the first boundary spends exactly alpha(t_1): P(|Z| >= c_1) = alpha(t_1)
    c1 = spending_boundaries([0.3, 1.0], 0.1)[0]
    assert 2 * norm.sf(c1) == pytest.approx(obf_spending(0.3, 0.1), rel=1e-8)


@pytest.mark.parametrize("fractions,alpha", [(FIVE, 0.05), ([0.25, 0.5, 0.75, 1.0], 0.05 / 3), ([0.3, 0.7, 1.0], 0.1)])
def test_boundaries_spend_alpha_under_scipys_multivariate_normal(fractions, alpha):
    """Independent reference: P(no crossing by look k) = 1 - alpha(t_k) with corr(Z_i, Z_j) = sqrt(t_i / t_j)."""
    b = spending_boundaries(fractions, alpha)
    t = np.array(fractions)
    cov = np.sqrt(np.minimum.outer(t, t) / np.maximum.outer(t, t))
    for k in range(1, len(t) + 1):
        mvn = multivariate_normal(mean=np.zeros(k), cov=cov[:k, :k], abseps=1e-7, releps=1e-7, maxpts=200_000 * k)
        c = np.array(b[:k])
        stay = mvn.cdf(c, lower_limit=-c, rng=np.random.default_rng(0))
        assert 1 - stay == pytest.approx(obf_spending(t[k - 1], alpha), abs=2e-5)


def test_boundaries_hold_alpha_in_a_direct_monte_carlo_of_the_score_process():
    rng = np.random.default_rng(1)
    t = np.array(FIVE)
    b = np.array(spending_boundaries(FIVE, 0.05))
    s = np.cumsum(rng.standard_normal((400_000, 5)) * np.sqrt(np.diff(t, prepend=0.0)), axis=1)
    z = s / np.sqrt(t)
    crossed = (np.abs(z) >= b).any(axis=1).mean()
    assert abs(crossed - 0.05) < 3 * math.sqrt(0.05 * 0.95 / 400_000)


def test_power_closed_form_matches_a_monte_carlo_with_drift():
    rng = np.random.default_rng(2)
    t = np.array([0.25, 0.5, 0.75, 1.0])
    b = spending_boundaries(t, 0.05)
    drift = 2.8  # delta / sigma * sqrt(N)
    power = sum(crossing_probabilities(b, t, drift))
    dt = np.diff(t, prepend=0.0)
    s = np.cumsum(rng.standard_normal((200_000, 4)) * np.sqrt(dt) + drift * dt, axis=1)
    sim = (np.abs(s / np.sqrt(t)) >= np.array(b)).any(axis=1).mean()
    assert 0.6 < power < 0.9
    assert abs(sim - power) < 3 * math.sqrt(power * (1 - power) / 200_000)
    # the fixed-sample test at the same N has slightly more power (O'Brien-Fleming costs little)
    fixed = norm.sf(1.96 - drift) + norm.cdf(-1.96 - drift)
    assert power < fixed < power + 0.03


def test_a_look_that_spends_nothing_is_never_crossed_and_bad_fractions_are_refused():
    assert spending_boundaries([1e-4, 1.0], 0.05)[0] == 40.0
    for bad in ([0.5, 0.5], [0.0, 1.0], [0.5, 1.2], []):
        with pytest.raises(ValueError):
            spending_boundaries(bad, 0.05)


def test_t_to_z_has_the_same_tail_probability_as_student_t():
    ts = np.array([-30.0, -2.5, -0.3, 0.0, 0.7, 4.0, 60.0])
    z = t_to_z(ts, 3)
    assert np.allclose(norm.sf(np.abs(z)), student_t.sf(np.abs(ts), 3), rtol=1e-9)
    assert np.all(np.sign(z) == np.sign(ts))
    assert t_to_z(1e5, 3) > 7  # no cancellation in the upper tail (Phi^{-1}(F_t) would round F_t to 1)
    d = np.array([[1.0, 0.0], [2.0, 0.0], [4.0, 0.0]])
    assert paired_z(d)[0] == pytest.approx(t_to_z(ttest_1samp(d[:, 0], 0).statistic, 2))
    assert paired_z(d)[1] == 0.0


# -- the whole procedure, simulated ---------------------------------------------------------------------------------
def simulate(n_sweeps: int, looks: list[int], effects: list[float], rng: np.random.Generator,
             alpha: float = 0.05) -> np.ndarray:
    """``n_sweeps`` sweeps of a baseline and ``m = len(effects)`` variants: per seed a stand-in metric
    ``x_v ~ N(effect_v, 1)`` (the baseline's effect 0), each variant compared with the baseline by the paired
    differences of the first ``looks[k]`` seeds at look ``k``; returns the (S, m) looks of rejection (-1: none)."""
    m, n_max = len(effects), looks[-1]
    x = rng.standard_normal((n_sweeps, n_max, m + 1)) + np.array([0.0, *effects])
    diffs = x[:, :, 1:] - x[:, :, :1]
    z = np.stack([paired_z(diffs[:, :n, :]) for n in looks], axis=1)  # (S, K, m)
    return sequential_holm(z, HolmLevels.build([n / n_max for n in looks], alpha, m))


N_SIM = 4000


def test_familywise_error_under_the_global_null_is_at_most_alpha():
    rng = np.random.default_rng(3)
    rej = simulate(N_SIM, [3, 6, 9, 12], [0.0, 0.0, 0.0], rng)
    fwer = (rej >= 0).any(axis=1).mean()
    assert fwer <= 0.05 + 2.33 * math.sqrt(0.05 * 0.95 / N_SIM), fwer
    assert fwer > 0.02  # not trivially conservative either: the procedure spends its alpha


def test_familywise_error_under_a_partial_null_is_at_most_alpha():
    """One real effect (rejected early, so Holm raises the others' level) and two true nulls."""
    rng = np.random.default_rng(4)
    rej = simulate(N_SIM, [4, 8, 12, 16], [2.0, 0.0, 0.0], rng)
    assert (rej[:, 0] >= 0).mean() > 0.95
    fwer = (rej[:, 1:] >= 0).any(axis=1).mean()
    assert fwer <= 0.05 + 2.33 * math.sqrt(0.05 * 0.95 / N_SIM), fwer


def test_power_under_an_alternative_matches_the_closed_form():
    """One comparison, effect 0.5 SD of the paired difference: the t-based procedure's power equals the
    closed form (known-SD drift) within Monte-Carlo error plus the small loss of estimating the SD."""
    rng = np.random.default_rng(5)
    looks = [10, 20, 30, 40]
    delta_sd = 0.5
    n_max = looks[-1]
    # diffs of one variant: x_1 - x_0 has SD sqrt(2) for unit per-variant SD; choose effects to make delta/sd = 0.5
    rej = simulate(N_SIM, looks, [delta_sd * math.sqrt(2)], rng)
    sim = (rej[:, 0] >= 0).mean()
    t = [n / n_max for n in looks]
    closed = sum(crossing_probabilities(spending_boundaries(t, 0.05), t, drift=delta_sd * math.sqrt(n_max)))
    se = math.sqrt(closed * (1 - closed) / N_SIM)
    assert 0.75 < closed < 0.95
    assert closed - 0.03 - 3 * se <= sim <= closed + 3 * se, (sim, closed)


def test_sequential_holm_by_hand():
    levels = HolmLevels.build([0.5, 1.0], 0.05, 2)
    c1_two, c1_one = levels.bounds[2][0], levels.bounds[1][0]
    # look 1: the first passes alpha/2's boundary; the second passes only alpha/1's, so it is rejected after it
    z = np.array([[[c1_two + 0.01, c1_one + 0.01]]])
    assert sequential_holm(z, levels).tolist() == [[0, 0]]
    z = np.array([[[c1_two + 0.01, c1_one - 0.01]]])
    assert sequential_holm(z, levels).tolist() == [[0, -1]]
    # look 2: a NaN (not tested) never rejects; a rejection is kept
    z = np.array([[[c1_two + 0.01, np.nan], [0.0, levels.bounds[1][1] + 0.01]]])
    assert sequential_holm(z, levels).tolist() == [[0, 1]]
