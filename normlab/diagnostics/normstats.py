"""Norm parameter statistics: gain distributions, DyT's alpha, running statistics of batch-statistic norms.

For every occupied norm site (``embed_norm``, ``blocks.<l>.<site>``, ``final_norm``):

- ``weight`` (the gain; ``gain`` = the applied ``1 + w`` for RMSNorm with ``unit_offset``) and ``bias``:
  mean, std, min, max and the 5/25/50/75/95 % quantiles;
- each scalar parameter the norm class declares in ``scalar_params`` (DyT's ``alpha``, Zhu et al. 2025,
  "Transformers without Normalization": how far into tanh's saturation the norm pushes typical inputs);
- every floating-point buffer (BatchNorm ``running_mean``/``running_var``, PowerNorm ``phi``, Unified
  Normalization ``running_var``, ...) summarised the same way, and integer counters (``step``, ``num_batches``)
  as plain ints.
"""

from __future__ import annotations

import torch
from torch import nn

from normlab.diagnostics.training import norm_modules

QUANTILES = (0.05, 0.25, 0.5, 0.75, 0.95)


def describe(t: torch.Tensor) -> dict:
    """``{n, mean, std, min, max, q05, q25, q50, q75, q95}`` of all elements (float64; std unbiased, 0 for n=1)."""
    x = t.detach().double().reshape(-1)
    out = {"n": x.numel(), "mean": float(x.mean()), "std": float(x.std()) if x.numel() > 1 else 0.0,
           "min": float(x.min()), "max": float(x.max())}
    qs = torch.quantile(x, torch.tensor(QUANTILES, dtype=torch.float64))
    out.update({f"q{round(q * 100):02d}": float(v) for q, v in zip(QUANTILES, qs)})
    return out


def norm_stats(m: nn.Module) -> dict:
    """Statistics of one norm module (see the module docstring)."""
    out: dict = {"type": type(m).__name__, "name": getattr(m, "name", type(m).__name__)}
    w = getattr(m, "weight", None)
    if isinstance(w, torch.Tensor):
        out["weight"] = describe(w)
        out["gain"] = describe(1.0 + w.detach()) if getattr(m, "unit_offset", False) else out["weight"]
    b = getattr(m, "bias", None)
    if isinstance(b, torch.Tensor):
        out["bias"] = describe(b)
    for pname in getattr(type(m), "scalar_params", ()):  # declared by the norm class (normlab.norms.registry)
        p = getattr(m, pname)
        out[pname] = float(p.detach().reshape(-1)[0]) if p.numel() == 1 else describe(p)
    buffers = {}
    for name, buf in m.named_buffers(recurse=False):
        if buf.is_floating_point():
            buffers[name] = describe(buf) if buf.numel() else None
        elif buf.numel() == 1:
            buffers[name] = int(buf)
    if buffers:
        out["buffers"] = buffers
    return out


def norm_parameter_stats(model: nn.Module) -> dict:
    """``{module path: norm_stats}`` for every occupied norm site of a GPT."""
    return {path: norm_stats(m) for path, m in norm_modules(model).items()}
