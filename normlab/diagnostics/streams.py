"""The composite residual mapping's gain of a model with residual streams (hyper-connections, mHC;
normlab.model.streams), recorded during training on diagnostic steps (``diag.every``):

- ``diag/hc_gain_fwd``: the mHC paper's "Amax gain magnitude" of the composite mapping ``P = H_res^(K) ...
  H_res^(1)`` over all ``K = 2 L`` connections (Xie et al. 2025, arXiv:2512.24880, Sec. 3.1 and Fig. 3): the
  largest absolute row sum ``max_i sum_j |P_ij|`` (how much the streams' signal can grow from the embedding to the
  last block), maximised over the tokens of the step's batch (each token has its own dynamic maps);
- ``diag/hc_gain_bwd``: the largest absolute column sum (how much a gradient can grow on its way back).

A doubly stochastic ``H_res`` (mHC) keeps both at 1 whatever the depth; HC's unconstrained product can grow or
shrink. Cost: one ``[n, n]`` product per connection and token on diagnostic steps only; the maxima stay on the
device until read. Models without streams record nothing.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn


def _composite(h_res: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(max row sum, max column sum)`` of ``|P|``, ``P = h_res[-1] @ ... @ h_res[0]`` per token (0-dim tensors)."""
    p = None
    for m in h_res:
        m = m.detach().double().reshape(-1, *m.shape[-2:])
        p = m if p is None else m @ p
    if p is None:
        return None
    a = p.abs()
    return a.sum(-1).amax(), a.sum(-2).amax()


def composite_gain(h_res: list[torch.Tensor]) -> dict[str, float]:
    """``{"fwd": max_token max_i sum_j |P_ij|, "bwd": max_token max_j sum_i |P_ij|}`` for ``h_res`` (one
    ``[..., n, n]`` per connection, in the order the model applies them; ``h'_i = sum_j H[i, j] h_j``);
    ``{}`` for an empty list."""
    out = _composite(h_res)
    return {} if out is None else {"fwd": float(out[0]), "bwd": float(out[1])}


def connections(model: nn.Module) -> list[nn.Module]:
    """The model's multi-stream connections (HC, mHC; not nGPT's single stream) in the order its forward applies them
    (attention then MLP, per block)."""
    out = []
    for blk in getattr(model, "blocks", []):
        for name in ("attn_hc", "mlp_hc"):
            m = getattr(blk, name, None)
            if m is not None and getattr(m, "multi_stream", False):
                out.append(m)
    return out


class StreamGainProbe:
    """Attach to a GPT for one step (``attach``), read ``diag/hc_gain_*`` (``read``), detach (``detach``)."""

    def __init__(self, model: nn.Module):
        self.model = model
        self._conns = connections(model)
        self._seen: list[torch.Tensor] = []
        self._max: list[torch.Tensor] | None = None
        self._handles: list[Any] = []

    def attach(self) -> None:
        self.detach()
        if not self._conns:
            return
        self._seen, self._max = [], None
        self._handles = [c.register_forward_hook(self._conn_hook) for c in self._conns]
        self._handles.append(self.model.register_forward_hook(self._model_hook))

    def detach(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    @torch.no_grad()
    def _conn_hook(self, _mod: nn.Module, _inp: Any, out: Any) -> None:
        self._seen.append(out[3].detach())

    @torch.no_grad()
    def _model_hook(self, _mod: nn.Module, _inp: Any, _out: Any) -> None:
        got = _composite(self._seen) if len(self._seen) == len(self._conns) else None
        self._seen = []
        if got is not None:
            self._max = list(got) if self._max is None else [torch.maximum(a, b) for a, b in zip(self._max, got)]

    def tensors(self) -> dict[str, torch.Tensor]:
        """The step's maxima as 0-dim device tensors (``diag/hc_gain_fwd``, ``diag/hc_gain_bwd``; empty without
        streams), for the caller to read in one transfer with the step's other statistics."""
        return {} if self._max is None else {"diag/hc_gain_fwd": self._max[0], "diag/hc_gain_bwd": self._max[1]}

    def finish(self, read: dict[str, float]) -> dict[str, float]:
        """The gains from :meth:`tensors`' values read to floats, non-finite ones left out; resets for the next
        step."""
        self._max = None
        return {k: v for k, v in read.items() if math.isfinite(v)}

    def read(self) -> dict[str, float]:
        """:meth:`tensors` read (one transfer) and :meth:`finish`ed: ``{"diag/hc_gain_fwd": ...,
        "diag/hc_gain_bwd": ...}`` of the step (empty without streams)."""
        t = self.tensors()
        return self.finish(dict(zip(t, torch.stack(list(t.values())).tolist() if t else [])))
