"""Transformer block that receives its norm modules (torchtune-style dependency injection).

The placement (``normlab.model.placements``) decides which of the six norm sites hold a norm; the others are
``nn.Identity``. One forward covers every placement::

    x = attn_post(k * x + a_attn * attn_out(attn(s * attn_in(x))))
    x = mlp_post(k * x + a_mlp * mlp_out(mlp(s * mlp_in(x))))

Three modifiers, constants chosen by the model builder:

- ``s`` (``in_scale``): LayerNorm Scaling, Sun et al. 2025, "The Curse of Depth in Large Language Models":
  ``1/sqrt(l)`` for the block at depth ``l`` (1-based), 1 otherwise.
- ``a`` (``res_scale``): residual-branch scaling. A fixed float (``1/sqrt(2L)``, "On residual network depth") or,
  when ``None``, one learnable scalar per branch initialised to 0 (ReZero, Bachlechner et al. 2020; SkipInit,
  De & Smith 2020), named ``attn_res_scale`` / ``mlp_res_scale``. At ``a = 0`` a block without post norms is the
  identity.
- ``k`` (``skip_scale``): the factor on the skip path, DeepNorm's ``alpha = (2N)^(1/4)`` (Wang et al. 2022,
  arXiv:2203.00555), 1 otherwise.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from normlab.attention.base import AttentionState
from normlab.attention.dropout import Dropout
from normlab.model.placements import SITES


class MLP(nn.Module):
    """Feed-forward sublayer. ``gelu``: ``proj(gelu(fc(x)))`` (exact, erf); ``gelu_tanh``: the same with the tanh
    approximation of GELU (Hendrycks & Gimpel 2016; GPT-2's ``gelu_new``); ``swiglu`` (Shazeer 2020):
    ``proj(silu(fc(x)) * gate(x))`` with hidden size ``2/3`` of the gelu one (equal parameter count);
    ``selu`` (Klambauer et al. 2017, self-normalizing networks; pair with ``model.norm: none``, LeCun-normal init).
    ``ngpt`` adds nGPT's scales ``s_u``, ``s_v`` of the pre-activations (``suv``).
    ``hidden`` (``model.mlp_hidden``) sets the hidden size directly instead (e.g. an imported HF model's
    ``intermediate_size``). ``x [B, T, d] -> [B, T, d]``; ``proj`` writes to the residual stream.
    """

    def __init__(self, width: int, ratio: float, activation: str, *, bias: bool, dropout: float,
                 hidden: int | None = None, ngpt: bool = False):
        super().__init__()
        self.activation = activation
        if hidden is None:
            hidden = int(ratio * width)
            if activation == "swiglu":
                hidden = int(2 * hidden / 3)
        if activation == "swiglu":
            self.gate = nn.Linear(width, hidden, bias=bias)
        self.fc = nn.Linear(width, hidden, bias=bias)
        self.proj = nn.Linear(hidden, width, bias=bias)
        self.drop = Dropout(dropout)
        # nGPT (Loshchilov et al. 2025, eq. 20-21): the pre-activations scaled by s_u, s_v, stored as the authors do
        # (init 1, used as suv * sqrt(width)); [u | v] = [gate | fc] for swiglu, [fc] otherwise
        self.suv_scale = math.sqrt(width)
        self.suv = nn.Parameter(torch.ones(hidden * (2 if activation == "swiglu" else 1))) if ngpt else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.activation == "swiglu":
            u, v = self.gate(x), self.fc(x)
            if self.suv is not None:
                su, sv = (self.suv * self.suv_scale).chunk(2)
                u, v = u * su, v * sv
            h = F.silu(v) * u
        else:
            h = self.fc(x)
            if self.suv is not None:
                h = h * (self.suv * self.suv_scale)
            if self.activation == "selu":
                h = F.selu(h)
            else:
                h = F.gelu(h, approximate="tanh" if self.activation == "gelu_tanh" else "none")
        return self.drop(self.proj(h))


class Block(nn.Module):
    """One transformer block. ``norms`` maps site name -> module (missing sites become ``nn.Identity``).

    ``in_scale`` multiplies the input-norm outputs (LayerNorm Scaling); ``res_scale`` multiplies each branch
    output before the residual addition (``None``: a learnable scalar per branch, initialised to 0); ``skip_scale``
    multiplies the skip path (DeepNorm). ``connections`` (attention, MLP): hyper-connection modules
    (normlab.model.streams) that replace the residual additions; the block then maps ``h [B, T, n, d] -> [B, T, n,
    d]``: ``x_in, h_res, post, _ = hc(h)``; ``h = hc.depth(branch(x_in), h_res, post)`` per sublayer.
    ``attn`` is any attention kind (normlab.attention): ``attn(x)`` or ``attn(x, state=...)``.
    ``x [B, T, d] -> [B, T, d]``.
    """

    def __init__(self, attn: nn.Module, mlp: nn.Module, norms: dict[str, nn.Module], *,
                 in_scale: float = 1.0, res_scale: float | None = 1.0, skip_scale: float = 1.0,
                 connections: tuple[nn.Module, nn.Module] | None = None):
        super().__init__()
        unknown_sites = set(norms) - set(SITES)
        if unknown_sites:
            raise ValueError(f"unknown norm sites {sorted(unknown_sites)}")
        self.attn, self.mlp = attn, mlp
        for site in SITES:
            setattr(self, site, norms.get(site, nn.Identity()))
        self.in_scale, self.skip_scale = in_scale, skip_scale
        self.attn_hc, self.mlp_hc = connections if connections is not None else (None, None)
        if res_scale is None:
            self.attn_res_scale = nn.Parameter(torch.zeros(()))
            self.mlp_res_scale = nn.Parameter(torch.zeros(()))
        else:
            self.attn_res_scale = self.mlp_res_scale = res_scale

    def forward(self, x: torch.Tensor, state: AttentionState | None = None) -> torch.Tensor:
        """``state``: this block's attention decoding state (``GPT.step``), updated in place; None = full forward."""
        attn = self.attn if state is None else partial(self.attn, state=state)
        if self.attn_hc is not None:  # residual streams h [B, T, n, d] (normlab.model.streams)
            inp, res, post, _ = self.attn_hc(x)
            x = self.attn_hc.depth(self.branch(inp, self.attn_in, attn, self.attn_out, self.attn_res_scale), res, post)
            inp, res, post, _ = self.mlp_hc(x)
            return self.mlp_hc.depth(self.branch(inp, self.mlp_in, self.mlp, self.mlp_out, self.mlp_res_scale), res,
                                     post)
        x = self.attn_post(self.skip(x) + self.branch(x, self.attn_in, attn, self.attn_out, self.attn_res_scale))
        x = self.mlp_post(self.skip(x) + self.branch(x, self.mlp_in, self.mlp, self.mlp_out, self.mlp_res_scale))
        return x

    def skip(self, x: torch.Tensor) -> torch.Tensor:
        """The residual path ``k * x`` (``x`` itself when ``k`` is 1)."""
        return x if self.skip_scale == 1.0 else x * self.skip_scale

    def branch(self, x: torch.Tensor, norm_in: nn.Module, f: Callable, norm_out: nn.Module,
               scale: float | torch.Tensor) -> torch.Tensor:
        """``scale * norm_out(f(in_scale * norm_in(x)))``; factors that are exactly 1.0 are skipped."""
        h = norm_in(x)
        if self.in_scale != 1.0:
            h = h * self.in_scale
        h = norm_out(f(h))
        return h if isinstance(scale, float) and scale == 1.0 else h * scale
