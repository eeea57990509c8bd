"""normlab.attention.softplus (LSSA / LSSAR, Gao, Spratling & Gionfrida 2025, arXiv:2501.13428) against closed
forms. The authors' code (github.com/iminfine/freeatten) could not be fetched here, so the reference is the paper's
formula: for a query with N visible keys, A = l1(softplus(log d log N cos(q, k))), then
A' = l1(relu(N A - o)^p), o = 0 in the first 3 rows and 1 after. The cases below are built so that the formula has
a closed form (cosines 0 or 1; rows whose above-uniform weights are known), including rows where evaluating the
formula literally in float32 overflows (N A - 1 ~ 2000, to the power 15)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from normlab.attention.softplus import REWEIGHT_PLAIN_ROWS, lssa_weights, lssar_reweight

D = 4  # head_dim: the scale is log(4) log(N)


def matched_qk(T: int, matched: set[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """``q [1, 1, T, D]`` all ``e1``; ``k_j = 3 e1`` for ``j`` in ``matched``, ``2 e2`` otherwise: cos 1 or 0."""
    q = torch.zeros(1, 1, T, D, dtype=torch.float64)
    q[..., 0] = 1.0
    k = torch.zeros(1, 1, T, D, dtype=torch.float64)
    for j in range(T):
        k[0, 0, j, 0 if j in matched else 1] = 3.0 if j in matched else 2.0
    return q, k


@pytest.mark.parametrize("p", [3.0, 15.0])
def test_lssa_and_lssar_closed_form_on_cosines_0_and_1(p):
    T, matched = 7, {0, 2, 5}
    q, k = matched_qk(T, matched)
    a = lssa_weights(q, k)[0, 0]
    w = lssar_reweight(a[None, None], 0, p)[0, 0]
    for i in range(T):
        N = i + 1
        sp = math.log1p(math.exp(math.log(D) * math.log(N)))  # softplus(log d log N), cos = 1
        m = len([j for j in matched if j <= i])
        Z = m * sp + (N - m) * math.log(2.0)  # softplus(0) = log 2
        want_a = [(sp if j in matched else math.log(2.0)) / Z if j <= i else 0.0 for j in range(T)]
        torch.testing.assert_close(a[i], torch.tensor(want_a, dtype=torch.float64), rtol=1e-12, atol=0)
        if N <= REWEIGHT_PLAIN_ROWS:  # offset 0: w proportional to A^p
            num = [x ** p for x in want_a]
            want_w = [x / sum(num) for x in num]
        else:  # offset 1: the matched weights are above 1/N and equal, the others below: 1/m each, 0 elsewhere
            assert all((N * x > 1) == (j in matched) for j, x in enumerate(want_a) if j <= i)
            want_w = [1.0 / m if (j in matched and j <= i) else 0.0 for j in range(T)]
        torch.testing.assert_close(w[i], torch.tensor(want_w, dtype=torch.float64), rtol=1e-12, atol=1e-300)


def test_the_first_three_rows_use_offset_zero():
    # N = 3, A = [.5, .3, .2]: offset 0 gives (3A)^p / sum = A^p / sum; offset 1 would give [1, 0, 0]
    a = torch.tensor([[0.5, 0.3, 0.2]], dtype=torch.float64)
    w = lssar_reweight(a, offset=2, power=3.0)[0]
    torch.testing.assert_close(w, a[0] ** 3 / (a[0] ** 3).sum(), rtol=1e-14, atol=0)
    # N = 4, A = [.4, .3, .2, .1]: offset 1 -> relu(4A - 1) = [.6, .2, 0, 0]
    a4 = torch.tensor([[0.4, 0.3, 0.2, 0.1]], dtype=torch.float64)
    r = torch.tensor([0.6, 0.2, 0.0, 0.0], dtype=torch.float64)
    torch.testing.assert_close(lssar_reweight(a4, offset=3, power=3.0)[0], r ** 3 / (r ** 3).sum(), rtol=1e-12,
                               atol=0)
    assert REWEIGHT_PLAIN_ROWS == 3


def test_lssar_at_long_context_where_the_literal_float32_formula_overflows():
    # one query at position 4095 (N = 4096): A_0 = .3, A_1 = .2, the rest share .5 (each below 1/N).
    # relu(N A - 1)^15 = 1227.8^15 ~ 2e46 overflows float32 (max 3.4e38): the literal formula gives inf / inf = nan
    N = 4096
    a = torch.full((1, N), 0.5 / (N - 2), dtype=torch.float32)
    a[0, 0], a[0, 1] = 0.3, 0.2
    literal = F.relu(N * a - 1) ** 15
    assert torch.isnan(literal / literal.sum()).any()
    w = lssar_reweight(a, offset=N - 1, power=15.0)[0]
    r0, r1 = N * 0.3 - 1, N * 0.2 - 1  # in float64: w0 = 1 / (1 + (r1 / r0)^15)
    w0 = 1.0 / (1.0 + (r1 / r0) ** 15)
    want = torch.zeros(N)
    want[0], want[1] = w0, 1.0 - w0
    torch.testing.assert_close(w, want, rtol=1e-5, atol=1e-7)  # float32 inputs: A_0, A_1 carry ~6e-8 relative error


def test_an_exactly_uniform_row_keeps_its_weights():
    # every N A_j - 1 is 0: the paper's formula is 0 / 0 here; normlab keeps the LSSA row (documented deviation)
    a = torch.full((1, 8), 1 / 8, dtype=torch.float64)
    torch.testing.assert_close(lssar_reweight(a, offset=7), a, rtol=0, atol=0)
