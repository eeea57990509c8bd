"""Learning-rate schedule: linear warm-up then cosine decay to ``min_lr_ratio * lr`` (nanoGPT)."""

from __future__ import annotations

import math


def lr_at(step: int, *, lr: float, warmup: int, total: int, min_ratio: float) -> float:
    """LR for optimizer step ``step`` (0-based): ``lr * (step+1)/warmup`` during warm-up, then cosine."""
    if warmup > 0 and step < warmup:
        return lr * (step + 1) / warmup
    span = max(1, total - warmup)
    progress = min(1.0, (step - warmup) / span)
    min_lr = lr * min_ratio
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (lr - min_lr)
