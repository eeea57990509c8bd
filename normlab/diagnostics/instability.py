"""Instability signals of Wortsman et al. 2023, "Small-scale proxies for large-scale Transformer training
instabilities" (arXiv:2309.14322), recorded during training on diagnostic steps (``diag.every``):

- ``diag/attn_logit_max/<l>``: the largest pre-softmax attention logit ``max_{b,h,i,j<=i} q_i . k_j / sqrt(d_head)``
  of block ``l`` (after QK-norm and RoPE, before a softcap, bias or mask; causal positions only). Its growth with
  the learning rate is *attention logit growth*, which QK-norm removes (paper section 3.1).
- ``diag/output_lse``: the mean over positions of ``logsumexp`` of the output logits ``[B, T, vocab]`` (the
  model's output, after any final-logit softcap): ``log Z``. Its drift away from 0 is *output logit divergence*,
  which the z-loss ``1e-4 log^2 Z`` removes (section 3.2).

Cost: one extra ``[B, H, T, T]`` score product per block and one ``logsumexp`` over the logits, on diagnostic steps
only (the probes are attached in ``start_step`` and removed in ``after_backward``); the maxima and sums stay on the
device until read. Attention kinds without a softmax score (``linear``, ``softplus``, ...) record no logit maximum.
With gradient accumulation, the maximum and the mean pool all micro-batches of the step.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn


class InstabilityProbe:
    """Attach to a GPT for one step (``attach``), read the signals (``read``), detach (``detach``)."""

    def __init__(self, model: nn.Module):
        self.model = model
        self._attn: list[tuple[int, nn.Module]] = [
            (l, blk.attn) for l, blk in enumerate(getattr(model, "blocks", [])) if hasattr(blk.attn, "logit_probe")]
        self._max: dict[int, torch.Tensor] = {}
        self._lse_sum: torch.Tensor | float = 0.0
        self._lse_n = 0
        self._handle: Any = None

    def attach(self) -> None:
        self.detach()
        self._max, self._lse_sum, self._lse_n = {}, 0.0, 0
        for l, attn in self._attn:
            attn.logit_probe = self._attn_probe(l)
        self._handle = self.model.register_forward_hook(self._output_hook)

    def detach(self) -> None:
        for _, attn in self._attn:
            attn.logit_probe = None
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def _attn_probe(self, l: int):
        @torch.no_grad()
        def probe(q: torch.Tensor, k: torch.Tensor) -> None:
            t_q, t_k = q.shape[-2], k.shape[-2]
            s = (q.detach().float() @ k.detach().float().transpose(-2, -1)) / math.sqrt(q.shape[-1])
            i = torch.arange(t_q, device=q.device)[:, None]
            j = torch.arange(t_k, device=q.device)[None, :]
            m = s.masked_fill(j > i + (t_k - t_q), float("-inf")).amax()
            self._max[l] = m if l not in self._max else torch.maximum(self._max[l], m)
        return probe

    @torch.no_grad()
    def _output_hook(self, _mod: nn.Module, _inp: Any, out: Any) -> None:
        logits = out[0] if isinstance(out, tuple) else out
        if not isinstance(logits, torch.Tensor) or logits.dim() != 3:
            return
        lse = torch.logsumexp(logits.detach().float(), dim=-1)
        self._lse_sum = self._lse_sum + lse.double().sum()
        self._lse_n += lse.numel()

    def read(self) -> dict[str, float]:
        """``{"diag/attn_logit_max/<l>": ..., "diag/output_lse": ...}`` of the step (only what was seen)."""
        out = {f"diag/attn_logit_max/{l}": float(m) for l, m in sorted(self._max.items())}
        if self._lse_n:
            out["diag/output_lse"] = float(self._lse_sum) / self._lse_n
        self._max, self._lse_sum, self._lse_n = {}, 0.0, 0
        return {k: v for k, v in out.items() if math.isfinite(v)}  # a non-finite step is caught as divergence
