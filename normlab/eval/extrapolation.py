"""Length extrapolation: loss and bits-per-byte at context lengths ``factor * training context``, and loss per
position bucket inside the window.

Protocol (as in ALiBi, Press et al. 2022, "Train Short, Test Long", and the LSSA/LSSAR length claims, Gao, Spratling
& Gionfrida 2025): every factor scores the same tokens, the first ``M = floor(N / C_max) * C_max`` targets of the
split (``C_max`` the largest evaluated context, ``N`` the available targets), with non-overlapping windows of the
factor's context
(``normlab.eval.lm.windows``; every target scored exactly once; the first target of a window has only its own input
token as context). ``bpb = sum(nll) / (bytes * ln 2)`` (lm-evaluation-harness).

Position buckets are powers of two of the position ``j`` (0-based index in the window of the input token whose
next token is scored, i.e. ``j + 1`` tokens of context): ``[0,1), [1,2), [2,4), [4,8), ...``; the same edges for
every factor, so buckets past the training context show what the model does with positions it never saw.

The model is only called as ``model(x)`` with ``x [B, T]`` for any T; positions and attention kinds decide what
happens past the training length. Learned absolute positions have no embedding past their table: refused.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from normlab.attention import get_attention_class
from normlab.errors import NormlabError
from normlab.eval.lm import window_batches, windows
from normlab.plotting import pyplot, save_png

MAX_FACTOR = 4096  # x the training context; longer windows are far outside any memory budget


def parse_factors(text: str) -> list[float]:
    """``"1,2,4"`` -> ``[1.0, 2.0, 4.0]``; each must be a finite number > 0 (one-line NormlabError otherwise)."""
    out = []
    for part in str(text).split(","):
        part = part.strip()
        try:
            f = float(part)
        except ValueError:
            raise NormlabError(f"--factors must be comma-separated numbers > 0, got '{part}' in '{text}'") from None
        if not math.isfinite(f) or f <= 0 or f > MAX_FACTOR:
            raise NormlabError(f"--factors must be numbers > 0 and <= {MAX_FACTOR}, got {part}")
        out.append(f)
    if not out:
        raise NormlabError("--factors needs at least one number")
    return out


def bucket_edges(context: int) -> list[int]:
    """Power-of-two bucket edges ``[0, 1, 2, 4, ..., context]`` (the last bucket ends at ``context``)."""
    edges = [0, 1]
    while edges[-1] < context:
        edges.append(min(edges[-1] * 2, context))
    return edges


def check_positions(factors: list[float], train_context: int, positions: str) -> None:
    """Learned absolute positions have no embedding past their table: any factor > 1 is a one-line error."""
    for f in factors:
        ctx = max(1, round(f * train_context))
        if positions == "learned" and ctx > train_context:
            raise NormlabError(
                f"factor {fmt_factor(f)} needs context {ctx}, beyond the learned position table ({train_context}); "
                "learned positions cannot extrapolate (use factors <= 1)"
            )


def window_bytes_estimate(context: int, *, width: int, heads: int, vocab: int, mlp_ratio: float,
                          quadratic: bool = True) -> int:
    """Rough peak bytes of one inference window of length ``context`` (float32, no autograd): logits and their
    softmax (``3 T V``), the widest activation (``T width (mlp_ratio + 4)`` x2) and, for softmax-like attention
    without a fused kernel, the ``heads x T x T`` scores and probabilities."""
    t = context
    est = 4 * (3 * t * vocab + 2 * t * width * (mlp_ratio + 4))
    if quadratic:
        est += 4 * 2 * heads * t * t
    return int(est)


def _size(n: float) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def fmt_factor(f: float) -> int | float:
    return int(f) if float(f).is_integer() else f


@torch.no_grad()
def score_positions(model: torch.nn.Module, tokens: np.ndarray, context: int, *,
                    batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-target NLL (nats, float64) and the position in its window, for non-overlapping windows of ``context``
    over 1-D ``tokens [n]`` (all ``n - 1`` targets). Returns ``(nll [n-1], pos [n-1])`` in target order."""
    nll_out, pos_out = [], []
    for batch, x, y in window_batches(tokens, windows(len(tokens), context, context), batch_size):
        logits = model(x).float()
        nll = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1), reduction="none")
        nll_out.append(nll.double().numpy())
        pos_out.append(np.tile(np.arange(x.shape[1]), len(batch)))
    return np.concatenate(nll_out), np.concatenate(pos_out)


def extrapolate(model: torch.nn.Module, tokens: np.ndarray, token_bytes: np.ndarray, *, train_context: int,
                factors: list[float], positions: str = "rope", attention: str = "softmax", max_tokens: int = 0,
                memory_gb: float = 4.0, batch_size: int = 16) -> dict:
    """Loss / bits-per-byte per factor and per position bucket.

    ``tokens [N+1]`` 1-D ids of the split, ``token_bytes [V]`` bytes per id. Returns ``{results: [{factor, context,
    loss, bpb, tokens, windows, batch_size, buckets: [{start, end, tokens, loss}]}], skipped: [{factor,
    context, reason}], tokens, bytes}``. Factors whose context exceeds the available targets, or whose single
    window would exceed ``memory_gb``, are skipped with a reason.
    """
    if max_tokens and max_tokens < 0:
        raise NormlabError(f"--max-tokens must be >= 0, got {max_tokens}")
    if max_tokens:
        tokens = tokens[: max_tokens + 1]
    avail = len(tokens) - 1
    cfg = getattr(model, "cfg", None)
    width, heads = getattr(cfg, "width", 512), getattr(cfg, "heads", 8)
    vocab, ratio = getattr(cfg, "vocab_size", len(token_bytes)), getattr(cfg, "mlp_ratio", 4.0)
    cap = memory_gb * 2**30
    check_positions(factors, train_context, positions)
    plan, skipped = [], []
    for f in factors:
        ctx = max(1, round(f * train_context))
        need = window_bytes_estimate(ctx, width=width, heads=heads, vocab=vocab, mlp_ratio=ratio,
                                     quadratic=get_attention_class(attention).score_matrix)
        if ctx > avail:
            skipped.append({"factor": fmt_factor(f), "context": ctx,
                            "reason": f"context exceeds the {avail} tokens available in the split"
                                      + (" (raise --max-tokens)" if max_tokens else "")})
        elif need > cap:
            skipped.append({"factor": fmt_factor(f), "context": ctx,
                            "reason": f"one window needs ~{_size(need)} > --memory-gb {memory_gb:g} (estimate)"})
        else:
            plan.append((f, ctx, max(1, min(batch_size, int(cap // need)))))
    if not plan:
        raise NormlabError("no factor can be evaluated: " + "; ".join(
            f"factor {s['factor']} (context {s['context']}): {s['reason']}" for s in skipped))
    c_max = max(ctx for _, ctx, _ in plan)
    m = (avail // c_max) * c_max
    toks = tokens[: m + 1]
    n_bytes = int(token_bytes[toks[1:].astype(np.int64)].sum())
    results = []
    for f, ctx, bs in plan:
        nll, pos = score_positions(model, toks, ctx, batch_size=bs)
        edges = bucket_edges(ctx)
        buckets = []
        for lo, hi in zip(edges[:-1], edges[1:]):
            sel = (pos >= lo) & (pos < hi)
            if sel.any():
                buckets.append({"start": lo, "end": hi, "tokens": int(sel.sum()), "loss": float(nll[sel].mean()),
                                "beyond_train_context": lo >= train_context})
        total = float(nll.sum())
        results.append({"factor": fmt_factor(f), "context": ctx, "loss": total / len(nll),
                        "bpb": total / (n_bytes * math.log(2)), "tokens": int(len(nll)),
                        "windows": math.ceil(m / ctx), "batch_size": bs, "buckets": buckets})
    return {"results": results, "skipped": skipped, "tokens": m, "bytes": n_bytes, "train_context": train_context}


def plot_extrapolation(report: dict, path: str | Path, *, title: str = "") -> None:
    """PNG: loss vs context (left) and loss per position bucket for every factor (right)."""
    plt = pyplot()
    import matplotlib.ticker

    res = report["results"]
    tc = report["train_context"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.4))
    a.plot([r["context"] for r in res], [r["loss"] for r in res], "o-")
    a.axvline(tc, color="gray", ls="--", lw=1, label=f"training context {tc}")
    a.set_xscale("log", base=2)
    a.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    a.set_xlabel("evaluation context (tokens)")
    a.set_ylabel("loss (nats / token)")
    a.ticklabel_format(axis="y", useOffset=False)
    a.set_title("loss vs context")
    a.legend()
    for r in res:
        xs = [max(bk["start"], 0.5) for bk in r["buckets"]]  # bucket [0,1) drawn at 0.5 on the log axis
        b.plot(xs, [bk["loss"] for bk in r["buckets"]], "o-", ms=3, label=f"x{r['factor']} ({r['context']})")
    b.axvline(tc, color="gray", ls="--", lw=1)
    b.set_xscale("log", base=2)
    b.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: "0" if v < 1 else f"{v:g}"))
    b.set_xlabel("position in window (bucket start; bucket [0, 1) drawn at 0.5)")
    b.set_ylabel("mean loss in bucket")
    b.set_title("loss per position bucket")
    b.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    save_png(fig, path)
