"""Label-free quality scores of a language model: MaNo and the Matrix Nuclear-Norm (``normlab eval --label-free``).

**MaNo** (Xie, Odonnat, Feofanov et al. 2024, "MaNo: Exploiting Matrix Norm for Unsupervised Accuracy Estimation
Under Distribution Shifts", NeurIPS 2024, arXiv:2405.18979; authors' code Renchunzi-Xie/MaNo, ``src/mano/mano.py``).
Logits ``q [N, K]`` (here: one row per scored token position, ``K`` = vocabulary):

1. criterion ``Phi = mean_i [ -(1/K) sum_k log softmax(q_i)_k ]`` (the cross-entropy to the uniform
   distribution, as their code computes it);
2. normalisation: ``softmax(q_i)`` when ``Phi > eta`` (``eta = 5``), else the order-2 Taylor form
   ``v = 1 + q + q^2/2``, shifted by its row minimum and divided by its row sum;
3. score ``S = ||P||_p / (N K)^(1/p) = ((1/(N K)) sum_ij |P_ij|^p)^(1/p)`` with ``p = 4``.

Higher ``S`` = more confident predictions, which the paper finds tracks accuracy. ``Phi >= log K`` always (the
cross-entropy to uniform is at least its entropy), so for ``K >= 149`` (``log K > 5``; bytes: ``K = 256``) the
softmax branch is always taken.

**Matrix Nuclear-Norm** (Li, Xia, Chang & Wu 2024, "Large Language Model Evaluation via Matrix Nuclear-Norm",
arXiv:2410.10672; authors' code MLGroupJLU/MatrixNuclearNorm, ``code/MNN.py``). Per sequence, the model's last
hidden states ``R [T, d]`` (what the LM head reads: after the final norm, as ``AutoModel(...)[0]`` gives for
GPT-2-style models): subtract the column means (over tokens), divide every row by its L2 norm, then approximate the
nuclear norm by the sum of the ``D = min(T, d)`` largest column L2 norms (the ``L_{1,2}`` approximation),
divide by ``T``; the score is the mean over sequences. Lower means a more compressed representation in the
paper's reading; normlab reports the value and measures its relation to loss rather than assuming a direction.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

MANO_P = 4
MANO_ETA = 5.0
MANO_TAYLOR = 2


def mano_criterion(logits: torch.Tensor) -> float:
    """``Phi``: mean over rows of the cross-entropy of ``softmax(logits)`` to the uniform distribution."""
    return float((-F.log_softmax(logits.double(), -1).mean(-1)).mean())


def mano_normalise(logits: torch.Tensor, phi: float, eta: float = MANO_ETA, order: int = MANO_TAYLOR) -> torch.Tensor:
    """Rows of ``logits [N, K]`` mapped to the simplex: softmax when ``phi > eta``, else the Taylor form."""
    q = logits.double()
    if phi > eta:
        return torch.softmax(q, -1)
    v = 1 + q
    for i in range(2, order + 1):
        v = v + q ** i / i  # as the authors' code (= q^i / i! for the default order 2)
    v = v - v.min(-1, keepdim=True).values
    return F.normalize(v, p=1, dim=-1)


def mano_score(logits: torch.Tensor, p: int = MANO_P, eta: float = MANO_ETA) -> dict[str, float]:
    """MaNo of ``logits [N, K]``: ``{"mano", "criterion", "normalisation"}``."""
    phi = mano_criterion(logits)
    prob = mano_normalise(logits, phi, eta)
    n, k = prob.shape
    score = float(prob.abs().pow(p).sum().pow(1.0 / p) / (n * k) ** (1.0 / p))
    return {"mano": score, "criterion": phi, "normalisation": "softmax" if phi > eta else "taylor"}


def nuclear_norm_score(hidden: torch.Tensor) -> float:
    """Matrix Nuclear-Norm of one sequence's hidden states ``hidden [T, d]`` divided by ``T`` (authors' code)."""
    r = hidden.double()
    r = r - r.mean(0)
    r = r / r.norm(dim=1, keepdim=True)
    cols = torch.sort(r.pow(2).sum(0).sqrt(), descending=True).values
    return float(cols[: min(r.shape)].sum()) / r.shape[0]


@torch.no_grad()
def label_free_scores(model: nn.Module, tokens: np.ndarray, *, context: int, max_tokens: int,
                      batch_size: int = 16) -> dict[str, float]:
    """Both scores of ``model`` on non-overlapping windows ``[context]`` from the start of ``tokens`` (at most
    ``max_tokens`` positions): MaNo over all positions' logits, MNN averaged over the windows (one sequence each).
    The hidden states are the LM head's input (a forward pre-hook on ``model.lm_head``)."""
    n_win = max(1, min(max_tokens // context, (len(tokens) - 1) // context))
    wins = np.stack([tokens[i * context:(i + 1) * context].astype(np.int64) for i in range(n_win)])
    seen: list[torch.Tensor] = []
    hook = model.lm_head.register_forward_pre_hook(lambda _m, args: seen.append(args[0].detach()))
    logits = []
    model.eval()
    try:
        for b in range(0, n_win, batch_size):
            logits.append(model(torch.from_numpy(wins[b:b + batch_size])).float())
    finally:
        hook.remove()
    lg = torch.cat(logits).reshape(-1, logits[0].shape[-1])
    hidden = torch.cat(seen)
    mano = mano_score(lg)
    mnn = float(np.mean([nuclear_norm_score(h) for h in hidden]))
    return {**mano, "matrix_nuclear_norm": mnn, "windows": n_win, "positions": int(lg.shape[0])}
