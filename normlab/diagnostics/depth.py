"""Variance growth with depth ("the curse of depth").

Sun et al. 2025, "The Curse of Depth in Large Language Models" (arXiv:2502.05795): in Pre-LN the variance of the
residual stream grows with depth (exponentially in their analysis), so deep blocks become close to the identity;
Kim et al. 2025, "Peri-LN" show the same curve for Pre-LN and a flatter one with output norms.

For each depth ``j = 0..L`` (0 = the stream entering block 0, ``j = l + 1`` = output of block ``l``), pooled over
every element of the sample ``[N, T, d]``: ``rms = sqrt(mean(h^2))``, ``var = mean(h^2) - mean(h)^2``. The growth
rate is the least-squares slope of ``ln(var)`` against ``j`` (nats per block; ``exp(slope)`` = variance growth
factor per block); ``log_var_slope_blocks`` fits the block outputs only (``j >= 1``), since the embedding point
often sits far below the rest (tied embeddings are initialised with std 0.02).
"""

from __future__ import annotations

import math
from typing import Sequence

import torch


def stream_moments(h: torch.Tensor) -> tuple[float, float]:
    """``(rms, var)`` of all elements of ``h`` (float64 accumulation)."""
    x = h.detach().double()
    ms = float(x.square().mean())
    mean = float(x.mean())
    return math.sqrt(ms), max(ms - mean * mean, 0.0)


def log_slope(values: Sequence[float]) -> float | None:
    """Least-squares slope of ``ln(values[j])`` against ``j = 0..n-1``; None with fewer than 2 positive values
    (non-positive values are left out)."""
    pts = [(j, math.log(v)) for j, v in enumerate(values) if v > 0 and math.isfinite(v)]
    if len(pts) < 2:
        return None
    n = len(pts)
    mx = sum(p[0] for p in pts) / n
    my = sum(p[1] for p in pts) / n
    sxx = sum((p[0] - mx) ** 2 for p in pts)
    sxy = sum((p[0] - mx) * (p[1] - my) for p in pts)
    return sxy / sxx


def variance_by_depth(hidden: Sequence[torch.Tensor]) -> dict:
    """Per-depth RMS and variance of the stream and the slope of log-variance (and log-RMS) against depth.

    ``hidden``: ``[L + 1]`` tensors ``[N, T, d]`` (see :func:`normlab.diagnostics.capture.capture_stream`).
    """
    rms, var = zip(*(stream_moments(h) for h in hidden)) if hidden else ((), ())
    slope = log_slope(var)
    return {
        "depth": list(range(len(hidden))),
        "label": ["embed"] + [f"block {l}" for l in range(len(hidden) - 1)],
        "rms": list(rms),
        "var": list(var),
        "log_var_slope": slope,
        "var_growth_per_block": math.exp(slope) if slope is not None else None,
        "log_var_slope_blocks": log_slope(var[1:]),
        "log_rms_slope": log_slope(rms),
        "var_last_over_first": (var[-1] / var[0]) if hidden and var[0] > 0 else None,
    }
