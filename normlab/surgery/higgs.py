"""HIGGS-style weight quantization and the linearity theorem (Malinovskii, Panferov, Ilin, Guo, Richtárik &
Alistarh 2024, "Pushing the Limits of Large Language Model Quantization via the Linearity Theorem",
arXiv:2411.17525; HIGGS = Hadamard Incoherence with Gaussian MSE-optimal GridS).

**Grid** (``normlab quantize --grid higgs``): each group of ``G`` consecutive inputs of a weight row (``G`` a power
of two; default the largest power of two dividing the layer's input width) is rotated by a randomized Hadamard
transform ``w -> (w * s) H / sqrt(G)`` (``s`` random signs, fixed seed), which makes its entries close to
Gaussian; the rotated group is scaled by its RMS ``sigma`` and every entry rounded to the nearest level of the
MSE-optimal grid for a unit Gaussian -- the Lloyd-Max quantizer with ``2^b`` levels (:func:`lloyd_max`); then
scaled back and rotated back (simulated: the dequantized weight is stored in the original basis, which computes the
same as storing the rotated weight and rotating the input). Deviations, stated: scalar grids only (HIGGS also uses
vector grids of dimension 2-4), and the scale is the group RMS rather than a per-group scale fitted by MSE.

**Linearity theorem** (their Theorem 1 / section 3): for small per-layer errors the loss increase is about
linear in the layers' relative squared errors, ``Delta L ~= sum_l a_l t_l``, ``t_l = ||W_l - Q(W_l)||_F^2 /
||W_l||_F^2``. The coefficients ``a_l`` are measured as they do, by adding Gaussian noise of relative squared error
``t`` to one layer at a time: ``a_l = (L(W_l + noise) - L) / t`` (:func:`layer_coefficients`); the prediction for a
quantized model is then compared with its measured bits/byte increase across bit widths (:func:`linearity_check`).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from functools import cache

import numpy as np
import torch
from scipy.stats import norm as normal
from torch import nn

from normlab.errors import NormlabError
from normlab.surgery.quantize import quantize_weights, quantized_linears, rtn
from normlab.surgery.rotate import sylvester

GRIDS = ("rtn", "higgs")
NOISE_REL_ERR = 1e-2  # t of the noise that measures a_l


@cache
def lloyd_max(bits: int, iters: int | None = None, tol: float = 1e-12) -> tuple[float, ...]:
    """The ``2^bits`` Lloyd-Max (MSE-optimal) reconstruction levels of a unit Gaussian, ascending.

    Lloyd's iteration with exact Gaussian centroids: thresholds = midpoints of adjacent levels; each level = the
    conditional mean ``(phi(a) - phi(b)) / (Phi(b) - Phi(a))`` of its cell ``(a, b)``; started at the cell
    quantiles of N(0, 3) (the asymptotically optimal point density, Panter & Dite 1951). Known values (Max 1960):
    1 bit +-0.7979; 2 bits +-0.4528, +-1.5104; 3 bits +-0.2451, +-0.7560,
    +-1.3440, +-2.1520. ``iters`` (default 20,000 up to 4 bits, where it converges to ``tol``; 300 above, where
    Lloyd's iteration crawls: the 8-bit grid's outermost levels, beyond 3.9 where the Gaussian mass is below 1e-4,
    are then within ~0.02 of the fixed point and the inner ones much closer)."""
    if bits < 1:
        raise NormlabError(f"grid bits must be >= 1, got {bits}")
    n = 2 ** bits
    iters = iters if iters is not None else (20000 if bits <= 4 else 300)
    levels = math.sqrt(3) * normal.ppf((np.arange(n) + 0.5) / n)  # Panter-Dite point density p^(1/3): N(0, 3)
    for _ in range(iters):
        t = np.concatenate([[-np.inf], (levels[1:] + levels[:-1]) / 2, [np.inf]])
        a, b = t[:-1], t[1:]
        new = (normal.pdf(a) - normal.pdf(b)) / (normal.cdf(b) - normal.cdf(a))
        done = np.max(np.abs(new - levels)) < tol
        levels = new
        if done:
            break
    return tuple(float(v) for v in levels)


def nearest_level(x: torch.Tensor, levels: torch.Tensor) -> torch.Tensor:
    """Each entry of ``x`` replaced by the nearest value of the ascending ``levels [n]`` (any shape)."""
    mids = (levels[1:] + levels[:-1]) / 2
    return levels[torch.bucketize(x.contiguous(), mids)]


def default_group(width: int) -> int:
    """The largest power of two dividing ``width``."""
    return width & -width


def _signs(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 2, (n,), generator=g).double() * 2 - 1


def higgs_quantize(w: torch.Tensor, bits: int, group: int | None = None, seed: int = 0) -> torch.Tensor:
    """Fake-quantized copy of ``w [out, in]`` (same dtype) on the HIGGS scalar grid (module docstring)."""
    out, inp = w.shape
    g = default_group(inp) if group is None else group
    if g < 1 or g & (g - 1) or inp % g:
        raise NormlabError(f"--grid higgs needs a power-of-two group dividing the input width {inp}, got {g}")
    H = torch.from_numpy(sylvester(g)).double() / math.sqrt(g)
    s = _signs(g, seed)
    levels = torch.tensor(lloyd_max(bits), dtype=torch.float64)
    x = w.double().reshape(out, inp // g, g)
    y = (x * s) @ H
    sigma = y.pow(2).mean(-1, keepdim=True).sqrt()
    sigma = torch.where(sigma > 0, sigma, torch.ones_like(sigma))
    yq = nearest_level(y / sigma, levels) * sigma
    return ((yq @ H.T) * s).reshape(out, inp).to(w.dtype)


def quantize_copy(w: torch.Tensor, bits: int, grid: str, group: int | None, seed: int = 0) -> torch.Tensor:
    """``w`` quantized by ``grid`` (``rtn``: normlab.surgery.quantize.rtn; ``higgs``: :func:`higgs_quantize`)."""
    if grid == "rtn":
        return rtn(w, bits, group)
    if grid == "higgs":
        return higgs_quantize(w, bits, group, seed)
    raise NormlabError(f"--grid {grid} is not supported; allowed: {', '.join(GRIDS)}")


@torch.no_grad()
def quantize_layers(model: nn.Module, bits: int, group: int | None = None, grid: str = "rtn",
                    seed: int = 0) -> dict[str, dict[str, float]]:
    """Every quantized linear's weight replaced (in place) by its ``grid`` copy; per-layer ``{shape, rel_err,
    max_abs_err}`` as normlab.surgery.quantize.quantize_weights (which it is, for ``rtn``)."""
    if grid == "rtn":
        return quantize_weights(model, bits, group)
    stats = {}
    for name, lin in quantized_linears(model).items():
        w = lin.weight.detach().double()
        q = quantize_copy(w, bits, grid, group, seed)
        norm2 = float(w.pow(2).sum())
        stats[name] = {"shape": list(w.shape), "rel_err": float((w - q).pow(2).sum()) / norm2 if norm2 > 0 else 0.0,
                       "max_abs_err": float((w - q).abs().max())}
        lin.weight.copy_(q.to(lin.weight.dtype))
    return stats


@torch.no_grad()
def layer_coefficients(model: nn.Module, score: Callable[[nn.Module], float], *, t: float = NOISE_REL_ERR,
                       seed: int = 0) -> dict[str, float]:
    """``{layer: a_l}``: the loss increase per unit relative squared error of each quantized linear, measured by
    adding Gaussian noise with ``||noise||^2 = t ||W||^2`` (in expectation) to that layer alone."""
    base = score(model)
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, lin in quantized_linears(model).items():
        w0 = lin.weight.detach().clone()
        sd = math.sqrt(t * float(w0.double().pow(2).mean()))
        noise = torch.randn(w0.shape, generator=gen, dtype=torch.float64) * sd
        lin.weight.copy_((w0.double() + noise).to(w0.dtype))
        t_real = float(noise.pow(2).sum() / w0.double().pow(2).sum())
        out[name] = (score(model) - base) / t_real
        lin.weight.copy_(w0)
    return out


@torch.no_grad()
def linearity_check(model: nn.Module, score: Callable[[nn.Module], float], bits_list: tuple[int, ...], *,
                    grid: str = "rtn", group: int | None = None, seed: int = 0,
                    t: float = NOISE_REL_ERR) -> dict:
    """Predicted (``sum_l a_l t_l``) against measured bits/byte increase of ``model`` quantized at each of
    ``bits_list`` on ``grid``. ``score(m)`` returns bits/byte. ``{coefficients, noise_rel_err, rows: [{bits,
    measured, predicted, sum_rel_err}]}``."""
    coef = layer_coefficients(model, score, t=t, seed=seed)
    base = score(model)
    rows = []
    for bits in bits_list:
        q = copy.deepcopy(model)
        pred, total = 0.0, 0.0
        for name, lin in quantized_linears(q).items():
            w = lin.weight.detach().double()
            wq = quantize_copy(w, bits, grid, group, seed)
            rel = float((w - wq).pow(2).sum() / w.pow(2).sum()) if float(w.pow(2).sum()) > 0 else 0.0
            pred += coef[name] * rel
            total += rel
            lin.weight.copy_(wq.to(lin.weight.dtype))
        rows.append({"bits": bits, "measured": score(q) - base, "predicted": pred, "sum_rel_err": total})
    return {"coefficients": coef, "noise_rel_err": t, "grid": grid, "rows": rows}
