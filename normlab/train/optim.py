"""Optimizer construction with explicit parameter groups (nanoGPT ``configure_optimizers``).

Weight decay applies to matrices of linear layers only by default; norm gains/biases, all biases and embeddings
are not decayed (switches ``train.wd_norm`` and ``train.wd_embeddings``). The grouping is returned so the run can
log it (``param_groups.json``).
"""

from __future__ import annotations

import torch
from torch import nn

from normlab.config import TrainConfig
from normlab.norms.registry import _REGISTRY


def is_norm_module(m: nn.Module) -> bool:
    """True for any registered hidden-state norm (and torch's own norm layers)."""
    return isinstance(m, tuple(_REGISTRY.values()) + (nn.LayerNorm, nn.RMSNorm))


def param_groups(model: nn.Module, tcfg: TrainConfig) -> tuple[list[dict], dict[str, list[str]]]:
    """Split parameters into decay / no-decay groups. Returns (torch param groups, {group: [names]})."""
    kinds: dict[str, str] = {}
    for mname, m in model.named_modules():
        for pname, p in m.named_parameters(recurse=False):
            full = f"{mname}.{pname}" if mname else pname
            if is_norm_module(m):
                kinds[full] = "norm"
            elif isinstance(m, nn.Embedding):
                kinds[full] = "embedding"
            elif p.ndim < 2:
                kinds[full] = "bias"
            else:
                kinds[full] = "matrix"
    decay_kinds = {"matrix"} | ({"norm"} if tcfg.wd_norm else set()) | ({"embedding"} if tcfg.wd_embeddings else set())
    named = dict(model.named_parameters())  # deduplicates tied weights
    decay = [n for n in named if kinds[n] in decay_kinds]
    no_decay = [n for n in named if kinds[n] not in decay_kinds]
    groups = [
        {"params": [named[n] for n in decay], "weight_decay": tcfg.weight_decay},
        {"params": [named[n] for n in no_decay], "weight_decay": 0.0},
    ]
    return groups, {"decay": decay, "no_decay": no_decay}


def build_optimizer(model: nn.Module, tcfg: TrainConfig) -> tuple[torch.optim.Optimizer, dict[str, list[str]]]:
    """AdamW over the explicit groups; returns the optimizer and the grouping (names) for logging."""
    groups, names = param_groups(model, tcfg)
    opt = torch.optim.AdamW(groups, lr=tcfg.lr, betas=(tcfg.beta1, tcfg.beta2), eps=1e-8, foreach=True)
    return opt, names
