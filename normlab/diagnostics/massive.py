"""Massive activations: a few hidden-state entries orders of magnitude larger than the rest.

Sun, Chen, Kolter & Liu 2024, "Massive Activations in Large Language Models" (arXiv:2402.17762; repo
locuslab/massive-activations, ``main_llm.py --exp2``: per layer output, the top-3 of ``|h|`` flattened over
tokens and channels and the median of ``|h|``). The paper's criterion: an activation is massive when
``|h| > 100`` and ``|h| > 1000 x median(|h|)`` of its layer's output. Small CPU models rarely reach 100 in
absolute value, so the ratio ``top1 / median`` is reported regardless of the flag.

Two readings of one block output ``[N, T, d]`` (N sequences):

- the authors' (``per_sequence``): for each sequence its top-3 ``|h|`` (over tokens and channels) and its median
  ``|h|``, then each averaged over the N sequences (``main_llm.py --exp2`` collects ``seq_np[:3] = top-3``,
  ``seq_np[3] = median`` per sequence; ``plot_layer_ax`` plots ``np.mean`` over sequences);
  ``ratio = mean top-1 / mean median``, and ``ratio_mean`` = the mean over sequences of each one's top-1 / median;
- pooled (kept as a second number): the top-3 entries of the whole sample with their (sequence, token position,
  channel), the median of ``|h|`` over all entries, and ``ratio = top1 / median``. The pooled top-1 is the maximum
  over sequences, so it is never below the per-sequence mean.
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


def per_sequence(h: torch.Tensor, k: int = 3) -> dict:
    """The authors' statistics of ``h [N, T, d]``: per sequence the top-``k`` ``|h|`` and the median ``|h|``, each
    averaged over the N sequences -> ``{top [k] (mean top-1..k), median (mean median), ratio (mean top-1 / mean
    median; None when 0), ratio_mean (mean over sequences of top-1 / median, sequences with median 0 left out)}``."""
    a = h.detach().abs().double().reshape(h.shape[0], -1)  # [N, T*d]
    top = torch.topk(a, min(k, a.shape[1]), dim=1).values  # [N, k]
    med = a.median(dim=1).values  # [N] (torch: the lower of the two middle values, as the authors' torch.median)
    top_mean = top.mean(0).tolist()
    med_mean = float(med.mean())
    ok = med > 0
    return {"top": top_mean, "median": med_mean, "ratio": top_mean[0] / med_mean if med_mean > 0 else None,
            "ratio_mean": float((top[ok, 0] / med[ok]).mean()) if bool(ok.any()) else None}


def massive_by_block(hidden: list[torch.Tensor], k: int = 3) -> dict:
    """Per block output (``hidden[1:]``): :func:`massive_activations` (pooled) with the authors' per-sequence
    statistics under ``per_sequence`` (:func:`per_sequence`), plus the criterion and the largest ratios over blocks:
    ``max_ratio`` (pooled), ``max_ratio_per_seq`` (the authors' mean top-1 / mean median)."""
    blocks = [{"block": l, **massive_activations(h, k), "per_sequence": per_sequence(h, k)}
              for l, h in enumerate(hidden[1:])]
    ratios = [b["ratio"] for b in blocks if b["ratio"] is not None]
    seq_ratios = [b["per_sequence"]["ratio"] for b in blocks if b["per_sequence"]["ratio"] is not None]
    return {
        "criterion": {"abs_min": ABS_MIN, "median_ratio_min": RATIO_MIN},
        "blocks": blocks,
        "max_ratio": max(ratios) if ratios else None,
        "max_ratio_per_seq": max(seq_ratios) if seq_ratios else None,
        "max_abs": max((b["top"][0]["value"] for b in blocks), default=None),
        "max_top1_per_seq": max((b["per_sequence"]["top"][0] for b in blocks), default=None),
        "any_flagged": any(b["flagged"] for b in blocks),
    }
