"""Language-model losses with output (logit) normalization.

    ce        = mean_t CE(logits_t, y_t)                                   (raw logits)
    z-loss    = c * mean_t logsumexp(logits_t)^2                           PaLM (Chowdhery et al. 2022), c = 1e-4
    LogitNorm = mean_t CE(logits_t / (||logits_t||_2 + 1e-7) / tau, y_t)   Wei et al. 2022, "Mitigating Neural
                Network Overconfidence with Logit Normalization" (repo hongxin001/logitnorm_ood); tau 0.01-0.04
    softcap   = c * tanh(logits / c)                                       Gemma 2 (Gemma Team 2024), c = 30

The training loss is ``LogitNorm`` (when ``logitnorm_tau`` is set) or ``ce``, plus the z-loss term (always on the
raw logits). LogitNorm is training-time only: evaluation and sampling use the raw logits (``ce``), as in the paper,
so a LogitNorm model's raw-logit scale is arbitrary and post-hoc temperature scaling (``normlab calibrate``) is the
way to read calibrated probabilities from it. The softcap, in contrast, is part of the model
(``normlab.model.gpt.softcap``, applied in
``GPT.forward`` from ``model.logit_softcap``, train and eval); ``lm_loss(logit_softcap=c)`` is only for logits
that have not been capped already (capping twice is not the same as capping once).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from normlab.model.gpt import softcap

LOGITNORM_EPS = 1e-7  # as in hongxin001/logitnorm_ood, common/loss_function.py


def logitnorm(logits: torch.Tensor, tau: float) -> torch.Tensor:
    """LogitNorm (Wei et al. 2022): ``logits / (||logits||_2 + 1e-7) / tau``, norm over the last (vocab) dim.

    ``logits [..., V] -> [..., V]``; every row then has L2 norm ~``1 / tau``.
    """
    if tau <= 0:
        raise ValueError(f"logitnorm tau must be > 0, got {tau}")
    norms = torch.linalg.vector_norm(logits, ord=2, dim=-1, keepdim=True) + LOGITNORM_EPS
    return logits / norms / tau


def lm_loss(logits: torch.Tensor, targets: torch.Tensor, *, z_loss: float = 0.0,
            logitnorm_tau: float | None = None, logit_softcap: float | None = None,
            ignore_index: int = -100) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Training loss and its parts.

    ``logits [B, T, V]`` (any float dtype; computed in float32), ``targets [B, T]`` int64 (``ignore_index``
    positions are left out of every mean). Returns ``(loss, parts)``: ``loss`` a differentiable 0-dim tensor;
    ``parts`` detached 0-dim tensors (``float()`` them when logging): ``ce`` (raw-logit cross-entropy, the number
    evaluation reports), ``z_loss`` (the added term ``c * mean lse^2``, when ``z_loss > 0``), ``logitnorm_ce``
    (the LogitNorm objective, when ``logitnorm_tau`` is set).
    """
    if z_loss < 0:
        raise ValueError(f"z_loss must be >= 0, got {z_loss}")
    V = logits.size(-1)
    x = softcap(logits.float(), logit_softcap).reshape(-1, V)
    y = targets.reshape(-1)
    keep = y != ignore_index
    n = keep.sum().clamp_min(1)
    ce = F.cross_entropy(x, y, ignore_index=ignore_index)
    parts: dict[str, torch.Tensor] = {"ce": ce.detach()}
    if logitnorm_tau is not None:
        main = F.cross_entropy(logitnorm(x, logitnorm_tau), y, ignore_index=ignore_index)
        parts["logitnorm_ce"] = main.detach()
    else:
        main = ce
    loss = main
    if z_loss > 0:
        lse = torch.logsumexp(x, dim=-1)
        zl = z_loss * (lse.square() * keep).sum() / n
        parts["z_loss"] = zl.detach()
        loss = loss + zl
    return loss, parts
