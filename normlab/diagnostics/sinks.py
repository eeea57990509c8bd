"""Attention sinks: how much attention the first token collects.

Gu et al. 2025, "When Attention Sink Emerges in Language Models: An Empirical View" (ICLR 2025; repo
sail-sg/Attention-Sink, ``eval_sink_open_source.py: compute_attention_sink``). For one sequence, layer and head
with causal attention probabilities ``A [T, T]`` (row = query ``i``, column = key ``k``, 0-based), the importance
of key ``k`` is ``sum_i A[i, k] / (T - k)`` -- the mean attention key ``k`` receives from the ``T - k`` queries
that can see it. The sink rate is the share of (sequence, layer, head) whose first-token importance exceeds
``epsilon = 0.3``, measured on ``T = 64`` tokens (the paper's setting; their code reports it in percent).

Attention probabilities: :func:`attention_probs` (the API other analyses may use too).

- Each attention kind computes its own probabilities, ``attention_probs(x) -> [B, H, T, T]`` (``x`` = the
  module's input, captured by a forward pre-hook; normlab.attention.registry): softmax attention
  ``softmax(cap(q k^T / sqrt(d_head)) + alibi + causal mask)`` with its QK-norm, RoPE, softcap and ALiBi;
  softplus attention (LSSA/LSSAR) its own l1-normalised weights, a T x T matrix whose rows sum to 1 like softmax
  probabilities (``attention`` in the result says which kind was measured).
- A kind that declares ``score_matrix = False`` (linear attention, NaLaFormer) has no T x T matrix: unavailable,
  with that reason.
- Either way the result is checked: ``proj((A v) merged over heads)`` must reproduce the module's actual output.
  When it does not (an option the kind's ``attention_probs`` does not know), :class:`AttentionUnavailable` is raised
  with the reason; ``sink_analysis`` reports it.
"""

from __future__ import annotations

import torch
from torch import nn

from normlab.diagnostics.capture import eval_mode, hooks, record_io

EPSILON = 0.3
SINK_CONTEXT = 64


class AttentionUnavailable(Exception):
    """No T x T softmax attention probabilities can be obtained for this model (the message says why)."""


def _qkv(attn: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v ``[B, H, T, hd]`` from a fused ``qkv`` projection (layout ``[q | k | v]``), for the output check."""
    B, T, _ = x.shape
    return attn.qkv(x).view(B, T, 3, attn.heads, attn.head_dim).permute(2, 0, 3, 1, 4).unbind(0)


def _probs(attn: nn.Module, x: torch.Tensor, where: str) -> tuple[torch.Tensor, str]:
    """``(A [B, H, T, T], kind)`` for one attention module from its own ``attention_probs(x)``, else
    AttentionUnavailable: a kind declaring ``score_matrix = False`` (normlab.attention.registry) has none."""
    kind = getattr(type(attn), "kind", None) or "module attention_probs"
    if not getattr(type(attn), "score_matrix", True):
        raise AttentionUnavailable(f"{where}: {kind} attention (kernel features, division normalisation) has no "
                                   "T x T probability matrix")
    if callable(getattr(attn, "attention_probs", None)):
        return attn.attention_probs(x).double(), kind
    raise AttentionUnavailable(f"{where}: this attention kind has no T x T softmax probability matrix")


def _check(attn: nn.Module, A: torch.Tensor, x: torch.Tensor, out: torch.Tensor, where: str) -> None:
    """Raise AttentionUnavailable unless ``proj(A v)`` reproduces the module output ``out``."""
    if not hasattr(attn, "qkv"):
        return  # attention_probs of a module without a fused qkv: trusted as is
    v = _qkv(attn, x)[2].double()
    proj = getattr(attn, "proj", None)
    if proj is None:
        raise AttentionUnavailable(f"{where}: cannot verify the recomputed probabilities (no output projection)")
    B, H, T, hd = v.shape
    y = (A.to(v.dtype) @ v).transpose(1, 2).reshape(B, T, H * hd)
    re = proj(y.to(out.dtype))
    err = float((re - out).abs().max())
    scale = float(out.abs().max()) or 1.0
    if not err <= 1e-3 * scale + 1e-6:
        raise AttentionUnavailable(
            f"{where}: recomputed softmax attention does not reproduce the module's output (max abs diff {err:.3g}"
            f" vs output scale {scale:.3g}); this attention kind needs an attention_probs(x) method"
        )


@torch.no_grad()
def attention_probs(model: nn.Module, idx: torch.Tensor, kinds_out: list[str] | None = None) -> torch.Tensor:
    """Causal attention probabilities of every layer: ``idx [B, T] -> A [L, B, H, T, T]`` (float64, rows sum to 1).

    One eval-mode forward with hooks on each block's ``attn`` (removed afterwards); ``kinds_out`` (optional list)
    receives the attention kinds measured (the registered kind names, e.g. ``softmax``, ``softplus``). Raises
    :class:`AttentionUnavailable` (with a one-line reason) for attention without a softmax probability matrix or
    when the recomputation does not reproduce the module's output.
    """
    blocks = list(model.blocks)
    inputs, outputs, regs = record_io([b.attn for b in blocks])
    kinds: set[str] = set()
    with eval_mode(model), hooks(regs):
        model(idx)
        probs = []
        for l, b in enumerate(blocks):
            attn, x, out = b.attn, inputs[l], outputs[l]
            where = f"block {l} attention ({type(attn).__name__})"
            if x is None or out is None:
                raise AttentionUnavailable(f"{where}: the attention module was not called")
            A, kind = _probs(attn, x, where)
            _check(attn, A, x, out, where)
            probs.append(A)
            kinds.add(kind)
    if kinds_out is not None:
        kinds_out.extend(sorted(kinds))
    return torch.stack(probs)


def token_importance(A: torch.Tensor) -> torch.Tensor:
    """``A [..., T, T] -> importance [..., T]``: ``sum_i A[i, k] / (T - k)`` (Gu et al.)."""
    T = A.shape[-1]
    ratios = torch.arange(T, 0, -1, dtype=A.dtype, device=A.device)  # T - k for k = 0..T-1
    return A.sum(dim=-2) / ratios


def sink_stats(A: torch.Tensor, epsilon: float = EPSILON) -> dict:
    """From ``A [L, B, H, T, T]``: first-token importance per (layer, head) averaged over sequences, the sink rate
    (share of (sequence, layer, head) with first-token importance > ``epsilon``) overall and per layer."""
    first = token_importance(A)[..., 0]  # [L, B, H]
    sink = (first > epsilon).double()
    return {
        "context": A.shape[-1],
        "epsilon": epsilon,
        "first_token_importance": first.mean(dim=1).tolist(),  # [L][H]
        "first_token_importance_mean": float(first.mean()),
        "sink_rate": float(sink.mean()),
        "sink_rate_per_layer": sink.mean(dim=(1, 2)).tolist(),
    }


def sink_analysis(model: nn.Module, idx: torch.Tensor, *, context: int = SINK_CONTEXT,
                  epsilon: float = EPSILON) -> dict:
    """``{available: True, ...sink_stats}`` on the first ``context`` tokens of each sequence of ``idx``, or
    ``{available: False, reason}``. With causal attention the first ``context`` rows/columns of the full attention
    matrix are exactly the prefix's own, so a prefix forward is enough."""
    idx = idx[:, :context]
    kinds: list[str] = []
    try:
        A = attention_probs(model, idx, kinds)
    except AttentionUnavailable as e:
        return {"available": False, "reason": str(e), "context": idx.shape[1], "epsilon": epsilon}
    return {"available": True, "attention": kinds, **sink_stats(A, epsilon)}
