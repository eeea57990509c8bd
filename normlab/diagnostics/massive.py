"""Massive activations: a few hidden-state entries orders of magnitude larger than the rest.

Sun, Chen, Kolter & Liu 2024, "Massive Activations in Large Language Models" (arXiv:2402.17762; repo
locuslab/massive-activations, ``main_llm.py --exp2``: per layer output, the top-3 of ``|h|`` flattened over
tokens and channels and the median of ``|h|``). The paper's criterion: an activation is massive when
``|h| > 100`` and ``|h| > 1000 x median(|h|)`` of its layer's output. Small CPU models rarely reach 100 in
absolute value, so the ratio ``top1 / median`` is reported regardless of the flag.

Here the statistics pool the whole sample ``[N, T, d]`` of one block output: the top-3 entries with their
(sequence, token position, channel), the median of ``|h|`` over all entries, and ``ratio = top1 / median``.
"""

from __future__ import annotations

import torch

ABS_MIN = 100.0
RATIO_MIN = 1000.0


def massive_activations(h: torch.Tensor, k: int = 3) -> dict:
    """``h [N, T, d]`` -> ``{top: [{value, seq, pos, channel}] (k largest |h|), median, ratio, flagged,
    n_massive}``; ``ratio`` is None when the median is 0; ``n_massive`` counts entries meeting the criterion."""
    a = h.detach().abs().double()
    N, T, d = a.shape
    vals, flat = torch.topk(a.reshape(-1), min(k, a.numel()))
    top = []
    for v, i in zip(vals.tolist(), flat.tolist()):
        top.append({"value": v, "seq": i // (T * d), "pos": (i // d) % T, "channel": i % d})
    median = float(a.median())
    ratio = top[0]["value"] / median if median > 0 else None
    n_massive = int(((a > ABS_MIN) & (a > RATIO_MIN * median)).sum())
    return {"top": top, "median": median, "ratio": ratio, "flagged": n_massive > 0, "n_massive": n_massive}


def massive_by_block(hidden: list[torch.Tensor], k: int = 3) -> dict:
    """Per block output (``hidden[1:]``): :func:`massive_activations`, plus the criterion and the largest ratio."""
    blocks = [{"block": l, **massive_activations(h, k)} for l, h in enumerate(hidden[1:])]
    ratios = [b["ratio"] for b in blocks if b["ratio"] is not None]
    return {
        "criterion": {"abs_min": ABS_MIN, "median_ratio_min": RATIO_MIN},
        "blocks": blocks,
        "max_ratio": max(ratios) if ratios else None,
        "max_abs": max((b["top"][0]["value"] for b in blocks), default=None),
        "any_flagged": any(b["flagged"] for b in blocks),
    }
