"""Simulated (fake-quant) round-to-nearest quantization of a GPT's linear layers, with per-layer statistics.

RTN, symmetric, per output channel or per group of ``G`` consecutive inputs (the baseline of GPTQ, QuaRot and
HIGGS; docs/surgery.md)::

    s   = max|W_group| / (2^(b-1) - 1)
    W_q = clamp(round(W / s), -2^(b-1), 2^(b-1) - 1) * s

``W [out, in]``: per channel, one ``s`` per row; per group, one per ``[row, G inputs]`` (``in % G == 0``).
Activations (``acts=8``): the same rule per token on each quantized linear's input ``x [..., in]`` (a forward
pre-hook), as in QuaRot's W4A8/W8A8 settings. Everything stays fp32: the model is *simulated*, nothing runs in
integer arithmetic, and no memory or speed is saved.

Which linears: every ``nn.Linear`` inside the blocks (attention ``qkv``/``proj`` and the linear-attention gates,
MLP ``fc``/``gate``/``proj``). The embeddings and the LM head stay in full precision (as in QuaRot and GPTQ's
LLaMA experiments, which keep the head in 16 bits).

Per layer: ``rel_err = ||W - W_q||_F^2 / ||W||_F^2`` (the input of the HIGGS linearity theorem, Malinovskii et
al. 2024: the perplexity increase is about ``sum_l a_l * rel_err_l``), and the input activations' outlier
statistics over a sample: ``absmax``, ``median |x|``, their ratio, and the kurtosis of the entries
(``E[(x - mu)^4] / var^2``, 3 for a Gaussian; rotations push it towards 3).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch
from torch import nn

from normlab.errors import NormlabError

WEIGHT_BITS = (8, 4, 3)
ACT_BITS = (8,)


def rtn(w: torch.Tensor, bits: int, group: int | None = None) -> torch.Tensor:
    """Fake-quantized copy of ``w [out, in]`` (same dtype): symmetric RTN per output row, or per ``group`` inputs."""
    if bits < 2:
        raise NormlabError(f"weight bits must be >= 2, got {bits}")
    qmax = 2 ** (bits - 1) - 1
    out, inp = w.shape
    g = inp if group is None else group
    if inp % g:
        raise NormlabError(f"--group {g} does not divide the input width {inp} of a linear layer")
    wg = w.reshape(out, inp // g, g)
    s = wg.abs().amax(-1, keepdim=True) / qmax
    s = torch.where(s > 0, s, torch.ones_like(s))  # an all-zero group stays zero
    q = torch.clamp(torch.round(wg / s), -qmax - 1, qmax) * s
    return q.reshape(out, inp)


def rtn_tokens(x: torch.Tensor, bits: int = 8) -> torch.Tensor:
    """Per-token symmetric RTN of ``x [..., in]`` (one scale per row over the last dimension)."""
    qmax = 2 ** (bits - 1) - 1
    s = x.abs().amax(-1, keepdim=True) / qmax
    s = torch.where(s > 0, s, torch.ones_like(s))
    return torch.clamp(torch.round(x / s), -qmax - 1, qmax) * s


def quantized_linears(model: nn.Module) -> dict[str, nn.Linear]:
    """``{name: module}`` of the linears that get quantized: every ``nn.Linear`` under ``blocks``."""
    return {n: m for n, m in model.named_modules() if isinstance(m, nn.Linear) and n.startswith("blocks.")}


@torch.no_grad()
def quantize_weights(model: nn.Module, bits: int, group: int | None = None) -> dict[str, dict[str, float]]:
    """Replace each quantized linear's weight by its RTN copy (in place); per-layer error statistics."""
    if bits not in WEIGHT_BITS:
        raise NormlabError(f"--weights {bits} is not supported; allowed: {', '.join(map(str, WEIGHT_BITS))}")
    if group is not None and group < 1:
        raise NormlabError(f"--group must be >= 1, got {group}")
    stats = {}
    for name, lin in quantized_linears(model).items():
        w = lin.weight.detach().double()
        q = rtn(w, bits, group)
        err = (w - q).pow(2).sum().item()
        norm2 = w.pow(2).sum().item()
        stats[name] = {"shape": list(w.shape), "rel_err": err / norm2 if norm2 > 0 else 0.0,
                       "max_abs_err": (w - q).abs().max().item()}
        lin.weight.copy_(q.to(lin.weight.dtype))
    return stats


@contextmanager
def act_quant(model: nn.Module, bits: int | None) -> Iterator[None]:
    """Within the block, every quantized linear sees its input RTN-quantized per token at ``bits`` (None: off)."""
    if bits is None:
        yield
        return
    if bits not in ACT_BITS:
        raise NormlabError(f"--acts {bits} is not supported; allowed: 8, none")
    handles = [m.register_forward_pre_hook(lambda _m, args: (rtn_tokens(args[0], bits), *args[1:]))
               for m in quantized_linears(model).values()]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def kurtosis(x: torch.Tensor) -> float:
    """``E[(x - mu)^4] / var^2`` over all entries (Pearson; 3 for a Gaussian)."""
    x = x.double().flatten()
    c = x - x.mean()
    var = c.pow(2).mean()
    return float(c.pow(4).mean() / var.pow(2)) if var > 0 else 0.0


@torch.no_grad()
def activation_stats(model: nn.Module, x: torch.Tensor) -> dict[str, dict[str, float]]:
    """Input statistics of every quantized linear on the token batch ``x [B, T]``: absmax, median |x|, their
    ratio (the massive-activation measure of Sun et al. 2024 applied to linear inputs) and kurtosis."""
    seen: dict[str, torch.Tensor] = {}
    handles = [m.register_forward_pre_hook(lambda _m, args, n=n: seen.__setitem__(n, args[0].detach()))
               for n, m in quantized_linears(model).items()]
    try:
        model.eval()
        model(x)
    finally:
        for h in handles:
            h.remove()
    out = {}
    for n, a in seen.items():
        absmax = a.abs().max().item()
        med = a.abs().median().item()
        out[n] = {"absmax": absmax, "median_abs": med, "outlier_ratio": absmax / med if med > 0 else float("inf"),
                  "kurtosis": kurtosis(a)}
    return out
