"""Instability signals of Wortsman et al. 2023, "Small-scale proxies for large-scale Transformer training
instabilities" (arXiv:2309.14322), recorded during training on diagnostic steps (``diag.every``):

- ``diag/attn_logit_max/<l>``: the largest pre-softmax attention logit ``max_{b,h,i,j<=i} q_i . k_j / sqrt(d_head)``
  of block ``l`` (after QK-norm and RoPE, before a softcap, bias or mask; causal positions only). Its growth with
  the learning rate is *attention logit growth*, which QK-norm removes (paper section 3.1).
- ``diag/output_lse``: the mean over positions of ``logsumexp`` of the output logits ``[B, T, vocab]`` (the
  model's output, after any final-logit softcap): ``log Z``. Its drift away from 0 is *output logit divergence*,
  which the z-loss ``1e-4 log^2 Z`` removes (section 3.2).

Cost: one extra score product per block, in chunks of ``LOGIT_PROBE_ROWS`` query rows (``[B, H, rows, T]`` fp32
at a time, not the whole ``[B, H, T, T]``), and one ``logsumexp`` over the logits, on diagnostic steps only (the
probes are attached in ``start_step`` and removed in ``after_backward``); the maxima and sums stay on the device
until read, with the step's other statistics, in one transfer (normlab.diagnostics.training). Attention kinds
without a softmax score (``linear``, ``softplus``, ...) record no logit maximum.
With gradient accumulation, the maximum and the mean pool all micro-batches of the step.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn


LOGIT_PROBE_ROWS = 256  # query rows per chunk of the logit probe's score product (the max is exact in any chunking)


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
            qf, kt, scale = q.detach().float(), k.detach().float().transpose(-2, -1), math.sqrt(q.shape[-1])
            j = torch.arange(t_k, device=q.device)[None, :]
            for a in range(0, t_q, LOGIT_PROBE_ROWS):  # [B, H, rows, T_k] scores at a time, not [B, H, T_q, T_k]
                s = (qf[..., a : a + LOGIT_PROBE_ROWS, :] @ kt) / scale
                i = torch.arange(a, a + s.shape[-2], device=q.device)[:, None]
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

    def tensors(self) -> dict[str, torch.Tensor]:
        """The step's reductions as 0-dim device tensors: ``diag/attn_logit_max/<l>`` (only the blocks seen) and the
        sum of the positions' logsumexp (``diag/output_lse``, divided by their count in :meth:`finish`), for the
        caller to read in one transfer with the step's other statistics."""
        out: dict[str, Any] = {f"diag/attn_logit_max/{l}": m.double() for l, m in sorted(self._max.items())}
        if self._lse_n:
            out["diag/output_lse"] = self._lse_sum
        return out

    def finish(self, read: dict[str, float]) -> dict[str, float]:
        """The signals from :meth:`tensors`' values read to floats (``{"diag/attn_logit_max/<l>": ...,
        "diag/output_lse": ...}``), non-finite values left out (a non-finite step is caught as divergence); resets
        for the next step."""
        out = dict(read)
        if "diag/output_lse" in out:
            out["diag/output_lse"] = out["diag/output_lse"] / self._lse_n
        self._max, self._lse_sum, self._lse_n = {}, 0.0, 0
        return {k: v for k, v in out.items() if math.isfinite(v)}

    def read(self) -> dict[str, float]:
        """:meth:`tensors` read (one transfer) and :meth:`finish`ed."""
        t = self.tensors()
        return self.finish(dict(zip(t, torch.stack(list(t.values())).tolist() if t else [])))
