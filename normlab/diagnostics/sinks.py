"""Attention sinks: how much attention the first token collects.

Gu et al. 2025, "When Attention Sink Emerges in Language Models: An Empirical View" (ICLR 2025; repo
sail-sg/Attention-Sink, ``eval_sink_open_source.py: compute_attention_sink``). For one sequence, layer and head
with causal attention probabilities ``A [T, T]`` (row = query ``i``, column = key ``k``, 0-based), the importance
of key ``k`` is ``sum_i A[i, k] / (T - k)`` -- the mean attention key ``k`` receives from the ``T - k`` queries
that can see it. The sink rate is the share of (sequence, layer, head) whose first-token importance exceeds
``epsilon = 0.3``, measured on ``T = 64`` tokens (the paper's setting; their code reports it in percent).

Attention probabilities: :func:`attention_probs` (the API other analyses may use too).

- If a block's attention module defines ``attention_probs(x) -> [B, H, T, T]`` (``x`` = the module's input), that
  is used: an attention kind with extras this module cannot know (QK-norm, softcap, ALiBi, ...) exposes its own.
- Otherwise, for softmax attention with a fused ``qkv`` projection (``CausalSelfAttention`` and its Pre-CRMSNorm
  variant), the probabilities are recomputed from the module's input captured by a forward pre-hook:
  ``q, k = split(qkv(x))``, QK-norm (``q_norm``/``k_norm``) and RoPE when the module has them (learned or no
  positions need nothing), ``A = softmax(cap(q k^T / sqrt(d_head)) + alibi + causal mask)`` with the module's
  score softcap / ALiBi slopes when set.
- Softplus attention (LSSA/LSSAR, ``SoftplusAttention``): its own l1-normalised weights (``weights(q, k)``), a
  T x T matrix whose rows sum to 1 like softmax probabilities; the sink metric is then computed on them
  (``attention`` in the result says which kind was measured).
- Linear attention kinds (``LinearAttention``, NaLaFormer) have no T x T matrix: unavailable, with that reason.
- Either way the result is checked: ``proj((A v) merged over heads)`` must reproduce the module's actual output.
  When it does not (an unsupported option), or the module has no ``T x T`` probability matrix (linear
  attention kinds), :class:`AttentionUnavailable` is raised with the reason; ``sink_analysis`` reports it.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from normlab.diagnostics.capture import eval_mode, hooks

EPSILON = 0.3
SINK_CONTEXT = 64


class AttentionUnavailable(Exception):
    """No T x T softmax attention probabilities can be obtained for this model (the message says why)."""


def _attention_classes() -> dict[str, tuple[type, ...]]:
    """The attention classes this module knows, by kind (imported lazily; kinds missing in this version are
    left out)."""
    import importlib

    found: dict[str, tuple[type, ...]] = {}
    for kind, mod, name in (("softmax", "normlab.attention.softmax", "CausalSelfAttention"),
                            ("softplus", "normlab.attention.softplus", "SoftplusAttention"),
                            ("linear", "normlab.attention.linear", "LinearAttention")):
        try:
            found[kind] = (getattr(importlib.import_module(mod), name),)
        except (ImportError, AttributeError):
            continue
    return found


def _qkv(attn: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v ``[B, H, T, hd]`` (float64) from the fused ``qkv`` projection (layout ``[q | k | v]``), with the
    module's QK-norm (``q_norm`` / ``k_norm``, before RoPE) and RoPE when present."""
    B, T, _ = x.shape
    H, hd = attn.heads, attn.head_dim
    q, k, v = attn.qkv(x).view(B, T, 3, H, hd).permute(2, 0, 3, 1, 4)
    if getattr(attn, "q_norm", None) is not None:
        q, k = attn.q_norm(q), attn.k_norm(k)
    if getattr(attn, "rope", None) is not None:
        q, k = attn.rope(q, k)
    return q, k, v


def _recompute(attn: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(A [B, H, T, T], v [B, H, T, hd])`` of a fused-qkv softmax attention module on input ``x [B, T, C]``:
    ``softmax(cap(q k^T / sqrt(hd)) + alibi + causal mask)`` with the module's softcap / ALiBi when it has them
    (float64)."""
    q, k, v = _qkv(attn, x)
    T, hd = x.shape[1], attn.head_dim
    s = (q.double() @ k.double().transpose(-2, -1)) / math.sqrt(hd)
    cap = getattr(attn, "softcap", None)
    if cap is not None:
        s = cap * torch.tanh(s / cap)
    slopes = getattr(attn, "alibi_slopes", None)
    if slopes is not None:
        from normlab.attention.positions import alibi_bias

        s = s + alibi_bias(slopes.double(), T, T)
    mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
    A = torch.softmax(s.masked_fill(~mask, float("-inf")), dim=-1)
    return A, v.double()


def _softplus_weights(attn: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Softplus attention (LSSA/LSSAR): the module's own l1-normalised weights ``[B, H, T, T]``."""
    q, k, v = _qkv(attn, x)
    return attn.weights(q.double(), k.double(), 0), v.double()


def _probs(attn: nn.Module, x: torch.Tensor, where: str) -> tuple[torch.Tensor, torch.Tensor | None, str]:
    """``(A, v or None, kind)`` for one attention module, or AttentionUnavailable."""
    if callable(getattr(attn, "attention_probs", None)):
        return attn.attention_probs(x).double(), None, "module attention_probs"
    classes = _attention_classes()
    if "linear" in classes and isinstance(attn, classes["linear"]):
        raise AttentionUnavailable(f"{where}: linear attention (kernel features, division normalisation) has no "
                                   "T x T probability matrix")
    if "softplus" in classes and isinstance(attn, classes["softplus"]):
        A, v = _softplus_weights(attn, x)
        return A, v, "softplus"
    if hasattr(attn, "qkv") and hasattr(attn, "heads") and hasattr(attn, "head_dim"):
        A, v = _recompute(attn, x)
        return A, v, "softmax"
    raise AttentionUnavailable(f"{where}: this attention kind has no T x T softmax probability matrix")


def _check(attn: nn.Module, A: torch.Tensor, v: torch.Tensor | None, x: torch.Tensor, out: torch.Tensor,
           where: str) -> None:
    """Raise AttentionUnavailable unless ``proj(A v)`` reproduces the module output ``out``."""
    if v is None:
        if not hasattr(attn, "qkv"):
            return  # a module-provided attention_probs without a fused qkv: trusted as is
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
    receives the attention kinds measured (``softmax``, ``softplus``, ``module attention_probs``). Raises
    :class:`AttentionUnavailable` (with a one-line reason) for attention without a softmax probability matrix or
    when the recomputation does not reproduce the module's output.
    """
    blocks = list(model.blocks)
    inputs: list[torch.Tensor | None] = [None] * len(blocks)
    outputs: list[torch.Tensor | None] = [None] * len(blocks)

    def pre(l: int):
        def hook(_m: nn.Module, inp: tuple) -> None:
            inputs[l] = inp[0].detach()
        return hook

    def post(l: int):
        def hook(_m: nn.Module, _inp: tuple, out: torch.Tensor) -> None:
            outputs[l] = out.detach()
        return hook

    kinds: set[str] = set()
    regs = []
    for l, b in enumerate(blocks):
        regs += [lambda b=b, l=l: b.attn.register_forward_pre_hook(pre(l)),
                 lambda b=b, l=l: b.attn.register_forward_hook(post(l))]
    with eval_mode(model), hooks(regs):
        model(idx)
        probs = []
        for l, b in enumerate(blocks):
            attn, x, out = b.attn, inputs[l], outputs[l]
            where = f"block {l} attention ({type(attn).__name__})"
            if x is None or out is None:
                raise AttentionUnavailable(f"{where}: the attention module was not called")
            A, v, kind = _probs(attn, x, where)
            _check(attn, A, v, x, out, where)
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
