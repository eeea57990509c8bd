"""Softmax Collapse (Prieto et al. 2025, "Grokking at the Edge of Numerical Stability", ICLR 2025,
arXiv:2501.04697, Section 3): once one logit is far enough above the others, the float32 sum of exponentials
``sum_v exp(z_v - max z)`` rounds to exactly 1, the softmax is exactly one-hot, and a position whose target is that
logit has cross-entropy exactly 0 and gradient ``p_y - 1`` exactly 0: it stops contributing to learning. With
``exp`` this happens at a margin of about ``log(2^24) + log(V - 1)`` ~ 17 + log V nats; in float64 only at
~37 + log V.

Two fractions, recorded on diagnostic steps (``diag.every``) next to Wortsman et al.'s instability signals:

- ``diag/softmax_collapse``: the fraction of positions (non-ignored targets) in Softmax Collapse, counted by
  ``rule`` (``COLLAPSE_RULES``):

  - ``sum_exp`` (the default): the softmax is exactly one-hot, ``sum_v exp(z_v - max z) == 1`` in the dtype, as
    the authors' logger counts it (``MetricsLogger.compute_softmax_collapse`` in
    github.com/LucasPrietoAl/grokking-at-the-edge-of-numerical-stability; checked against it in
    tests/diagnostics/test_collapse.py). It does not look at the target: a confidently wrong position collapses too (its
    gradient is not 0, but the softmax carries no information beyond its argmax);
  - ``target_prob``: the target's probability is exactly 1, ``softmax(z)[y] == 1``, i.e. the gradient with
    respect to the target logit is exactly 0 (normlab's count before the authors' rule became the default);
    the positions it counts are the ``sum_exp`` positions whose argmax is the target.

- ``diag/logits_beyond_exp``: the fraction of logits ``z_v`` with ``exp(z_v - max z)`` == 0 in float32
  (``z_v - max z`` below ``log`` of the smallest float32 subnormal, -103.28): beyond the range of float32 ``exp``,
  so they receive an exactly-zero gradient.

For a model with ``model.output: stablemax`` the logits are ``log StableMax`` and the softmax reads the StableMax
probabilities, so both fractions are those of StableMax.
"""

from __future__ import annotations

import math

import torch

from normlab.errors import unknown

# log of the smallest positive float32 (subnormal 2^-149): exp of anything below it rounds to 0
FP32_EXP_FLOOR = math.log(2.0 ** -149)
COLLAPSE_RULES = ("sum_exp", "target_prob")
DEFAULT_COLLAPSE_RULE = "sum_exp"  # the authors' logger (Prieto et al. 2025)


def collapsed_rows(z: torch.Tensor, y: torch.Tensor, rule: str = DEFAULT_COLLAPSE_RULE) -> torch.Tensor:
    """Which rows of ``z [N, V]`` (already in the dtype to test) are in Softmax Collapse under ``rule``: bool ``[N]``.

    ``sum_exp``: ``sum_v exp(z_v - max z) == 1`` (the authors' count); ``target_prob``: ``softmax(z)[y] == 1``
    with ``y [N]`` (int64, valid class indices) the targets.
    """
    if rule == "sum_exp":
        return torch.exp(z - z.amax(dim=-1, keepdim=True)).sum(dim=-1) == 1
    if rule == "target_prob":
        return torch.softmax(z, dim=-1).gather(1, y[:, None]).squeeze(1) == 1
    raise unknown("softmax collapse rule", rule, COLLAPSE_RULES)


def softmax_collapse(logits: torch.Tensor, targets: torch.Tensor, *, dtype: torch.dtype = torch.float32,
                     ignore_index: int = -100, rule: str = DEFAULT_COLLAPSE_RULE
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Counts of Softmax Collapse in ``dtype``.

    ``logits [..., V]``, ``targets [...]`` (int64; ``ignore_index`` positions left out). Returns 0-dim int64
    tensors on the logits' device ``(collapsed positions, logits beyond exp range, positions, logits)``: the counts
    and what they are out of, with no host read (the ignored positions are masked out, not indexed away: a boolean
    index waits for the device). A position is collapsed by ``rule`` (``collapsed_rows``: ``sum_exp``, the authors'
    one-hot count, or ``target_prob``). A logit is beyond the exp range when ``exp(z_v - max z)`` underflows to
    exactly 0 in ``dtype``.
    """
    if rule not in COLLAPSE_RULES:
        raise unknown("softmax collapse rule", rule, COLLAPSE_RULES)
    V = logits.shape[-1]
    z = logits.detach().reshape(-1, V).to(dtype)
    y = targets.reshape(-1)
    keep = y != ignore_index
    collapsed = (collapsed_rows(z, torch.where(keep, y, 0), rule) & keep).sum()
    beyond = ((torch.exp(z - z.amax(dim=-1, keepdim=True)) == 0) & keep[:, None]).sum()
    n = keep.sum()
    return collapsed, beyond, n, n * V


def collapse_fractions(logits: torch.Tensor, targets: torch.Tensor, *, dtype: torch.dtype = torch.float32,
                       rule: str = DEFAULT_COLLAPSE_RULE) -> dict[str, float]:
    """``{"softmax_collapse": fraction of positions, "logits_beyond_exp": fraction of logits}`` in ``dtype``."""
    c, b, n, m = (int(v) for v in torch.stack(softmax_collapse(logits, targets, dtype=dtype, rule=rule)).tolist())
    return {"softmax_collapse": c / max(n, 1), "logits_beyond_exp": b / max(m, 1)}
