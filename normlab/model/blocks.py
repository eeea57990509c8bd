"""Transformer block that receives its norm modules (torchtune-style dependency injection).

The placement (``normlab.model.placements``) decides which of the six norm sites hold a norm; the others are
``nn.Identity``. One forward covers every placement::

    x = attn_post(x + attn_out(attn(attn_in(x))))
    x = mlp_post(x + mlp_out(mlp(mlp_in(x))))
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from normlab.model.placements import SITES


class MLP(nn.Module):
    """Feed-forward sublayer. ``gelu``: ``proj(gelu(fc(x)))``; ``swiglu`` (Shazeer 2020):
    ``proj(silu(fc(x)) * gate(x))`` with hidden size ``2/3`` of the gelu one (equal parameter count).
    ``x [B, T, d] -> [B, T, d]``; ``proj`` writes to the residual stream.
    """

    def __init__(self, width: int, ratio: float, activation: str, *, bias: bool, dropout: float):
        super().__init__()
        self.activation = activation
        hidden = int(ratio * width)
        if activation == "swiglu":
            hidden = int(2 * hidden / 3)
            self.gate = nn.Linear(width, hidden, bias=bias)
        self.fc = nn.Linear(width, hidden, bias=bias)
        self.proj = nn.Linear(hidden, width, bias=bias)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.activation == "swiglu":
            h = F.silu(self.fc(x)) * self.gate(x)
        else:
            h = F.gelu(self.fc(x))
        return self.drop(self.proj(h))


class Block(nn.Module):
    """One transformer block. ``norms`` maps site name -> module (missing sites become ``nn.Identity``).

    ``x [B, T, d] -> [B, T, d]``.
    """

    def __init__(self, attn: nn.Module, mlp: nn.Module, norms: dict[str, nn.Module]):
        super().__init__()
        unknown_sites = set(norms) - set(SITES)
        if unknown_sites:
            raise ValueError(f"unknown norm sites {sorted(unknown_sites)}")
        self.attn, self.mlp = attn, mlp
        for site in SITES:
            setattr(self, site, norms.get(site, nn.Identity()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.attn_post(x + self.attn_out(self.attn(self.attn_in(x))))
        x = self.mlp_post(x + self.mlp_out(self.mlp(self.mlp_in(x))))
        return x
