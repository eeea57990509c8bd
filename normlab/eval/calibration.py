"""Calibration of next-token probabilities and post-hoc temperature scaling (Guo et al. 2017, "On Calibration of
Modern Neural Networks").

For ``N`` scored tokens with logits ``z [N, V]``, targets ``y [N]`` and ``p = softmax(z / T)``:

    NLL   = mean_i -log p_i[y_i]
    Brier = mean_i sum_v (p_iv - 1[v == y_i])^2          (multi-class Brier score, Brier 1950)
    ECE   = sum_b |B_b| / N * |acc(B_b) - conf(B_b)|      15 equal-width bins over the top-1 confidence
                                                          max_v p_iv, bin b = (b/15, (b+1)/15] (Guo et al.'s code)

``fit_temperature`` minimises validation NLL over ``T > 0``. In ``beta = 1/T`` the NLL
``mean_i logsumexp(beta z_i) - beta z_i[y_i]`` is convex (a log-sum-exp of linear functions), with derivative
``mean_i E_p[z_i] - z_i[y_i]`` and second derivative ``mean_i Var_p[z_i] >= 0``, so a safeguarded Newton iteration
on beta finds the global optimum in a few steps (each a pass over the logits, done in row chunks in float64).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from normlab.errors import NormlabError
from normlab.eval.lm import windows
from normlab.plotting import pyplot, save_png

ECE_BINS = 15
T_MIN, T_MAX = 1e-2, 1e2
_CHUNK = 4096


def _chunks(n: int):
    for s in range(0, n, _CHUNK):
        yield slice(s, min(s + _CHUNK, n))


def _probs(z: torch.Tensor, temperature: float) -> torch.Tensor:
    return torch.softmax(z.double() / temperature, dim=-1)


def calibration_stats(logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0,
                      n_bins: int = ECE_BINS) -> dict:
    """NLL, Brier, ECE and the per-bin reliability table of ``softmax(logits / T)``.

    ``logits [N, V]``, ``targets [N]``. Returns ``{nll, brier, ece, accuracy, bins: [{lo, hi, count, confidence,
    accuracy}]}`` (empty bins have count 0 and null confidence/accuracy).
    """
    if logits.ndim != 2 or targets.shape != logits.shape[:1] or len(targets) == 0:
        raise ValueError(f"need logits [N, V] and targets [N] with N >= 1, got {tuple(logits.shape)}, "
                         f"{tuple(targets.shape)}")
    n = len(targets)
    nll = brier = 0.0
    conf = torch.empty(n, dtype=torch.float64)
    correct = torch.empty(n, dtype=torch.bool)
    for sl in _chunks(n):
        p = _probs(logits[sl], temperature)
        y = targets[sl].long()
        py = p.gather(1, y[:, None]).squeeze(1)
        nll -= float(torch.log(py.clamp_min(1e-300)).sum())
        brier += float((p.square().sum(1) - 2 * py + 1).sum())
        c, pred = p.max(dim=1)
        conf[sl], correct[sl] = c, pred == y
    edges = torch.linspace(0, 1, n_bins + 1, dtype=torch.float64)
    idx = torch.bucketize(conf, edges[1:-1], right=False)  # conf in (lo, hi] -> bin b
    bins, ece = [], 0.0
    for b in range(n_bins):
        m = idx == b
        cnt = int(m.sum())
        row = {"lo": float(edges[b]), "hi": float(edges[b + 1]), "count": cnt, "confidence": None, "accuracy": None}
        if cnt:
            cb, ab = float(conf[m].mean()), float(correct[m].double().mean())
            row.update(confidence=cb, accuracy=ab)
            ece += cnt / n * abs(ab - cb)
        bins.append(row)
    return {"nll": nll / n, "brier": brier / n, "ece": ece, "accuracy": float(correct.double().mean()),
            "bins": bins}


def _nll_derivs(z: torch.Tensor, y: torch.Tensor, beta: float) -> tuple[float, float, float]:
    """NLL(beta), dNLL/dbeta, d2NLL/dbeta2 for logits scaled by ``beta = 1/T`` (means over rows)."""
    f = g = h = 0.0
    for sl in _chunks(len(y)):
        zc = z[sl].double()
        s = beta * zc
        lse = torch.logsumexp(s, dim=1)
        p = torch.exp(s - lse[:, None])
        zy = zc.gather(1, y[sl, None].long()).squeeze(1)
        ez = (p * zc).sum(1)
        f += float((lse - beta * zy).sum())
        g += float((ez - zy).sum())
        h += float(((p * zc.square()).sum(1) - ez.square()).sum())
    n = len(y)
    return f / n, g / n, h / n


def fit_temperature(logits: torch.Tensor, targets: torch.Tensor, *, max_iter: int = 50,
                    tol: float = 1e-10) -> float:
    """The ``T`` in ``[0.01, 100]`` minimising ``NLL(softmax(logits / T), targets)``.

    ``logits [N, V]`` (raw, any float dtype), ``targets [N]``. Safeguarded Newton on ``beta = 1/T`` (convex),
    halving the step until the NLL does not increase; stops at a bound when the optimum lies beyond it.
    """
    if len(targets) == 0:
        raise ValueError("fit_temperature needs at least one token")
    lo, hi = 1.0 / T_MAX, 1.0 / T_MIN
    beta = 1.0
    f, g, h = _nll_derivs(logits, targets, beta)
    for _ in range(max_iter):
        if g == 0.0:  # flat in float64 (e.g. every token right with probability 1): any larger beta is as good
            break
        step = -g / h if h > 1e-300 else -math.copysign(beta, g)
        for _ in range(60):
            cand = min(max(beta + step, lo), hi)
            fc, gc, hc = _nll_derivs(logits, targets, cand)
            if fc <= f + 1e-15 * abs(f):
                break
            step /= 2
        else:
            break
        moved = abs(cand - beta)
        beta, f, g, h = cand, fc, gc, hc
        pinned = (beta == lo and g > 0) or (beta == hi and g < 0)  # optimum beyond the allowed T range
        if moved <= tol * beta or pinned:
            break
    return 1.0 / beta


@torch.no_grad()
def collect_logits(model: torch.nn.Module, tokens: np.ndarray, *, context: int, batch_size: int = 16,
                   max_tokens: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Raw logits ``[N, V]`` (float32) and targets ``[N]`` of every scored token of ``tokens`` (1-D ids), with
    non-overlapping windows of ``context`` (``normlab.eval.lm.windows``); ``max_tokens`` limits ``N``."""
    if max_tokens:
        tokens = tokens[: max_tokens + 1]
    if len(tokens) < 2:
        raise NormlabError(f"split has {len(tokens)} token(s); at least 2 are needed")
    was_training = model.training
    model.eval()
    out_z, out_y = [], []
    wins = windows(len(tokens), context, context)
    for i in range(0, len(wins), batch_size):
        group = wins[i : i + batch_size]
        for L in sorted({e - b for b, e, _ in group}, reverse=True):  # equal lengths batch together
            same = [(b, e) for b, e, _ in group if e - b == L]
            x = torch.from_numpy(np.stack([tokens[b:e].astype(np.int64) for b, e in same]))
            y = torch.from_numpy(np.stack([tokens[b + 1 : e + 1].astype(np.int64) for b, e in same]))
            z = model(x).float()
            out_z.append(z.reshape(-1, z.size(-1)))
            out_y.append(y.reshape(-1))
    model.train(was_training)
    return torch.cat(out_z), torch.cat(out_y)


def ece_note(before: dict, after: dict, temperature: float) -> str | None:
    """A sentence when temperature scaling raised the held-out ECE (``calibration_stats`` dicts), else None.

    ``T`` minimises NLL on the fit half (Guo et al. 2017), not the binned ECE; on a model that is already well
    calibrated the NLL-optimal ``T`` can leave ECE higher on the held-out half, and a lower NLL is then the only
    thing scaling bought."""
    if after["ece"] <= before["ece"]:
        return None
    nll = "lowered" if after["nll"] < before["nll"] else "did not lower"
    return (f"temperature scaling raised the held-out ECE ({before['ece']:.4f} -> {after['ece']:.4f}): T = "
            f"{temperature:.4f} minimises NLL on the fit half, not ECE, and {nll} the held-out NLL "
            f"({before['nll']:.4f} -> {after['nll']:.4f}); the unscaled model was already calibrated to ECE "
            f"{before['ece']:.4f}, so keep T = 1 if ECE is what matters")


def reliability_diagram(before: dict, after: dict, path: str | Path, *, temperature: float, title: str = "") -> None:
    """Write a two-panel reliability diagram PNG (before / after temperature scaling) from ``calibration_stats``."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.6), sharey=True)
    for ax, stats, name in ((axes[0], before, "before (T = 1)"), (axes[1], after, f"after (T = {temperature:.3f})")):
        lo = [b["lo"] for b in stats["bins"]]
        width = stats["bins"][0]["hi"] - stats["bins"][0]["lo"]
        acc = [b["accuracy"] or 0.0 for b in stats["bins"]]
        conf = [b["confidence"] if b["count"] else b["lo"] + width / 2 for b in stats["bins"]]
        ax.bar(lo, acc, width=width, align="edge", edgecolor="black", color="tab:blue", label="accuracy")
        gap_lo = [min(a, c) for a, c in zip(acc, conf)]
        gap_h = [abs(c - a) if b["count"] else 0.0 for a, c, b in zip(acc, conf, stats["bins"])]
        ax.bar(lo, gap_h, bottom=gap_lo, width=width, align="edge", color="tab:red", alpha=0.3, label="gap")
        ax.plot([0, 1], [0, 1], "k--", lw=1)
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.set_xlabel("top-1 confidence")
        ax.set_title(f"{name}: ECE {stats['ece']:.4f}, NLL {stats['nll']:.4f}")
        ax.legend(loc="upper left")
    axes[0].set_ylabel("accuracy")
    if title:
        fig.suptitle(title)
    save_png(fig, path)
