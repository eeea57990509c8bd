"""normlab.diagnostics.massive: the authors' massive-activation statistic (mean over sequences of the per-sequence
top-1 / median ratio)."""

from __future__ import annotations


import numpy as np
import pytest
import torch


torch.set_num_threads(1)


def test_massive_per_sequence_is_the_authors_mean_over_sequences():
    """Per sequence: top-3 of |h| over tokens and channels and torch.median(|h|), then np.mean over sequences
    (locuslab/massive-activations main_llm.py --exp2 + plot_layer_ax), against a plain numpy loop."""
    from normlab.diagnostics.massive import massive_by_block, per_sequence

    g = torch.Generator().manual_seed(0)
    h = torch.randn(4, 6, 5, generator=g, dtype=torch.float64)
    h[2, 3, 1] = 40.0  # one massive entry in one sequence
    cols = []
    for s in range(4):
        a = np.abs(h[s].numpy()).ravel()
        srt = np.sort(a)[::-1]
        med = np.sort(a)[(a.size - 1) // 2]  # torch.median: the lower middle value
        cols.append([srt[0], srt[1], srt[2], med])
    mean = np.mean(np.array(cols), axis=0)
    r = per_sequence(h)
    assert r["top"] == pytest.approx(list(mean[:3]), rel=1e-12) and r["median"] == pytest.approx(mean[3], rel=1e-12)
    assert r["ratio"] == pytest.approx(mean[0] / mean[3], rel=1e-12)
    assert r["ratio_mean"] == pytest.approx(np.mean([c[0] / c[3] for c in cols]), rel=1e-12)
    mb = massive_by_block([h, h, 2 * h])
    assert mb["max_ratio"] == pytest.approx(40.0 / float(h.abs().median()), rel=1e-12)  # pooled: max over sequences
    assert mb["max_ratio_per_seq"] == pytest.approx(r["ratio"], rel=1e-12) and r["ratio"] < mb["max_ratio"]
    assert mb["max_top1_per_seq"] == pytest.approx(2 * mean[0], rel=1e-12)
