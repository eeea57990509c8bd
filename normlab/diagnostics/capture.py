"""Capture the residual stream of a GPT with forward hooks that are always removed afterwards.

``capture_stream(model, idx)`` returns the stream entering block 0 and every block's output,
``[L + 1]`` tensors of shape ``[B, T, d]`` (index 0 = embeddings after the optional embedding norm, index
``l + 1`` = output of block ``l``), and the logits ``[B, T, vocab]``. A model with ``n`` residual streams
(hyper-connections, mHC: ``[B, T, n, d]``; normlab.model.streams) is captured as the sum of its streams, the vector
its final norm reads.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, Iterator

import torch
from torch import nn


@contextlib.contextmanager
def hooks(register: list[Callable[[], torch.utils.hooks.RemovableHandle]]) -> Iterator[None]:
    """Register the given hooks for the ``with`` body and remove every one of them afterwards, even on error."""
    handles = []
    try:
        for reg in register:
            handles.append(reg())
        yield
    finally:
        for h in handles:
            h.remove()


@contextlib.contextmanager
def eval_mode(model: nn.Module) -> Iterator[None]:
    """``model.eval()`` for the body (batch-statistic norms then use running statistics), then restore."""
    was = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was)


def record_io(modules: list[nn.Module]) -> tuple[list, list, list]:
    """Forward hooks that keep each module's first positional input and its output, detached: returns
    ``(inputs, outputs, registrations)``; the two lists (one slot per module, None until it runs) fill during a
    forward run inside ``hooks(registrations)``, which removes the hooks afterwards."""
    inputs: list[torch.Tensor | None] = [None] * len(modules)
    outputs: list[torch.Tensor | None] = [None] * len(modules)

    def pre(l: int):
        def hook(_m: nn.Module, inp: tuple) -> None:
            inputs[l] = inp[0].detach()
        return hook

    def post(l: int):
        def hook(_m: nn.Module, _inp: tuple, out: torch.Tensor) -> None:
            outputs[l] = out.detach()
        return hook

    regs = []
    for l, m in enumerate(modules):
        regs += [lambda m=m, l=l: m.register_forward_pre_hook(pre(l)),
                 lambda m=m, l=l: m.register_forward_hook(post(l))]
    return inputs, outputs, regs


@dataclass
class Stream:
    """``hidden[0]``: input of block 0; ``hidden[l + 1]``: output of block ``l``; all ``[B, T, d]``."""

    hidden: list[torch.Tensor]
    logits: torch.Tensor


@torch.no_grad()
def capture_stream(model: nn.Module, idx: torch.Tensor) -> Stream:
    """One eval-mode forward of ``idx [B, T]`` recording the residual stream before/after every block."""
    blocks = list(model.blocks)
    inputs, outputs, regs = record_io(blocks)  # block l>0 takes block l-1's output: only inputs[0] is new
    with eval_mode(model), hooks(regs):
        logits = model(idx)
    if not blocks:  # a model without blocks: the stream is whatever reaches the final norm (not captured)
        raise ValueError("model has no blocks")
    hidden = [h if h.dim() == 3 else h.sum(-2) for h in (inputs[0], *outputs)]  # n streams: their sum
    return Stream(hidden, logits)  # type: ignore[arg-type]
