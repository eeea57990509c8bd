"""Cheap statistics of two weight matrices, recorded during training on diagnostic steps (``diag.every``) and in
``summary.json`` at the end of training.

**Token Embedding Variability** (Chung, Hong, An, Thorne & Yun 2024, "Stable Language Model Pre-training by
Reducing Embedding Variability", arXiv:2409.07787, section 2): for the token embedding matrix ``E [V, d]`` (rows
``e_i``), ``TEV_i = sqrt(1/d sum_j (e_ij - mean_j e_ij)^2)``, the standard deviation of token ``i``'s embedding
across its ``d`` coordinates; the paper tracks its mean and standard deviation over the vocabulary as a cheap
proxy for the gradient variance of Pre-LN models (large gradients of the shallow layers inflate the embeddings'
variability). Keys ``diag/tev_mean``, ``diag/tev_std`` (population std over the ``V`` tokens).

**Output-layer operator norm** (Filatov, Wang, Ebert & Kesselheim 2025, "Optimal Scaling Needs Optimal Norm",
arXiv:2510.03871): at the optimal (learning rate, batch size) the output layer's operator norm stays the same
across model and data sizes ("norm transfer"). Their norm is Scion's for the output layer, the RMS -> infinity
operator norm ``||W||_{RMS->inf} = sup_x ||W x||_inf / ||x||_RMS = sqrt(d_in) max_i ||w_i||_2`` (rows ``w_i`` of
``W [V, d_in]``); the plain spectral norm ``||W||_2`` (largest singular value) is logged too. Keys
``diag/head_rms_inf_norm``, ``diag/head_spectral_norm``; the LM head is the tied embedding when tied.
"""

from __future__ import annotations

import math

import torch
from torch import nn


@torch.no_grad()
def tev_tensors(E: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(mean, std)`` over the ``V`` rows of ``TEV_i`` = the population std of row ``i`` of ``E [V, d]``: 0-dim
    float64 tensors on ``E``'s device (no host read)."""
    tev = E.detach().double().std(dim=1, correction=0)
    return tev.mean(), tev.std(correction=0)


def token_embedding_variability(E: torch.Tensor) -> tuple[float, float]:
    """:func:`tev_tensors` as floats."""
    mean, std = torch.stack(tev_tensors(E)).tolist()
    return mean, std


@torch.no_grad()
def rms_to_inf_tensor(W: torch.Tensor) -> torch.Tensor:
    """``||W||_{RMS->inf} = sqrt(d_in) max_i ||W[i]||_2`` for ``W [d_out, d_in]`` (Scion's output-layer norm), a 0-dim
    float64 tensor on ``W``'s device."""
    W = W.detach().double()
    return math.sqrt(W.shape[1]) * torch.linalg.vector_norm(W, dim=1).max()


def rms_to_inf_norm(W: torch.Tensor) -> float:
    return float(rms_to_inf_tensor(W))


@torch.no_grad()
def spectral_tensor(W: torch.Tensor) -> torch.Tensor:
    """The largest singular value of ``W [d_out, d_in]`` (``torch.linalg.matrix_norm(W, 2)``, in float64), a 0-dim
    tensor on ``W``'s device; NaN for non-finite weights (a diverged run's, whose SVD would fail), decided on the
    device (the SVD then runs on zeros): no host read."""
    W = W.detach().double()
    finite = torch.isfinite(W).all()
    return torch.where(finite, torch.linalg.matrix_norm(torch.where(finite, W, 0.0), ord=2), math.nan)


def spectral_norm(W: torch.Tensor) -> float:
    return float(spectral_tensor(W))


def weight_norm_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """``diag/tev_mean``, ``diag/tev_std`` (token embeddings) and ``diag/head_rms_inf_norm``,
    ``diag/head_spectral_norm`` (LM head) of a GPT as 0-dim float64 device tensors (read by the caller, with the
    step's other statistics, in one transfer); a model without ``tok_emb`` / ``lm_head`` gives ``{}``."""
    out: dict[str, torch.Tensor] = {}
    emb = getattr(model, "tok_emb", None)
    if isinstance(emb, nn.Embedding):
        out["diag/tev_mean"], out["diag/tev_std"] = tev_tensors(emb.weight)
    head = getattr(model, "lm_head", None)
    if isinstance(head, nn.Linear):
        out["diag/head_rms_inf_norm"] = rms_to_inf_tensor(head.weight)
        out["diag/head_spectral_norm"] = spectral_tensor(head.weight)
    return out


def weight_norm_record(model: nn.Module) -> dict[str, float]:
    """:func:`weight_norm_tensors` read (one transfer), non-finite values left out."""
    t = weight_norm_tensors(model)
    values = torch.stack(list(t.values())).tolist() if t else []
    return {k: v for k, v in zip(t, values) if math.isfinite(v)}
