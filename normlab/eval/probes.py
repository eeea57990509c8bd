"""In-context probes on synthetic data with a fixed seed: induction and associative recall.

- **Induction** (Olsson et al. 2022, "In-context Learning and Induction Heads"): ``n`` sequences of ``L`` tokens
  drawn uniformly from the vocabulary, each repeated once (``[n, 2L]``). The first copy is unpredictable: its loss
  cannot be below ``ln V`` in expectation (chance), whatever the model; the second copy can be copied from the
  first. Reported: the mean cross-entropy (nats) of the first copy's tokens 2..L (predicted from their prefix) and of
  the second copy's tokens 2..L (the first token of the second copy is not inferable and is left out), and the
  difference ``first - second`` (0 = no induction; ``ln V`` = perfect copying).
- **Associative recall** (Ba et al. 2016, "Using Fast Weights to Attend to the Recent Past"; Arora et al. 2023,
  "Zoology", multi-query associative recall): ``k1 v1 k2 v2 ... kn vn kq`` with ``n`` distinct keys drawn from the
  lower half of the vocabulary, values drawn (with replacement) from the upper half, and ``kq`` one of the ``n``
  keys; the model should predict its value. Reported: accuracy of the argmax over the value tokens at the query
  (chance ``1 / num_values``; ties go to the lowest value id) and the cross-entropy of the correct value over the
  whole vocabulary (chance ``ln V`` for uniform logits).

A model here is any callable ``idx [B, T] (int64) -> logits [B, T, V]`` (``GPT.forward`` without targets).
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch
import torch.nn.functional as F

Model = Callable[[torch.Tensor], torch.Tensor]


def induction_data(vocab: int, length: int, sequences: int, seed: int) -> torch.Tensor:
    """``[sequences, 2 * length]`` int64: uniform random tokens of ``[0, vocab)``, each row's first half repeated."""
    g = torch.Generator().manual_seed(seed)
    half = torch.randint(0, vocab, (sequences, length), generator=g)
    return torch.cat([half, half], dim=1)


def recall_data(vocab: int, pairs: int, sequences: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(idx [sequences, 2 * pairs + 1], answer [sequences])``: keys distinct per row from ``[0, vocab // 2)``,
    values from ``[vocab // 2, vocab)``, the last token a key of the row, ``answer`` its value."""
    keys_n = vocab // 2
    if pairs > keys_n:
        raise ValueError(f"pairs ({pairs}) must be <= vocab // 2 ({keys_n})")
    g = torch.Generator().manual_seed(seed)
    keys = torch.stack([torch.randperm(keys_n, generator=g)[:pairs] for _ in range(sequences)])
    values = torch.randint(keys_n, vocab, (sequences, pairs), generator=g)
    pick = torch.randint(0, pairs, (sequences,), generator=g)
    rows = torch.arange(sequences)
    idx = torch.stack([keys, values], dim=2).reshape(sequences, 2 * pairs)
    idx = torch.cat([idx, keys[rows, pick][:, None]], dim=1)
    return idx, values[rows, pick]


@torch.no_grad()
def _logits(model: Model, idx: torch.Tensor, batch_size: int, device: torch.device | str) -> torch.Tensor:
    out = [model(idx[i:i + batch_size].to(device)).float().cpu() for i in range(0, len(idx), batch_size)]
    return torch.cat(out)


def induction(model: Model, *, vocab: int, length: int, sequences: int = 64, seed: int = 0, batch_size: int = 16,
              device: torch.device | str = "cpu") -> dict[str, Any]:
    """The induction probe (module docstring). ``length >= 2``; the model sees ``2 * length`` tokens."""
    if length < 2:
        raise ValueError(f"length must be >= 2, got {length}")
    idx = induction_data(vocab, length, sequences, seed)
    logits = _logits(model, idx, batch_size, device)[:, :-1]  # position t predicts token t + 1
    nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), idx[:, 1:].reshape(-1),
                          reduction="none").view(sequences, -1)
    first = nll[:, : length - 1].mean().item()  # tokens 1 .. L-1 of the first copy
    second = nll[:, length:].mean().item()  # tokens L+1 .. 2L-1: the second copy without its first token
    return {"length": length, "sequences": sequences, "seed": seed, "vocab": vocab,
            "first_copy_loss": first, "second_copy_loss": second, "induction_gain": first - second,
            "chance_first_copy_loss": math.log(vocab), "perfect_second_copy_loss": 0.0}


def recall(model: Model, *, vocab: int, pairs: int, sequences: int = 256, seed: int = 0, batch_size: int = 16,
           device: torch.device | str = "cpu") -> dict[str, Any]:
    """The associative-recall probe (module docstring). The model sees ``2 * pairs + 1`` tokens."""
    idx, answer = recall_data(vocab, pairs, sequences, seed)
    last = _logits(model, idx, batch_size, device)[:, -1]  # [S, V] at the query
    lo = vocab // 2
    guess = last[:, lo:].argmax(-1) + lo
    loss = F.cross_entropy(last, answer).item()
    return {"pairs": pairs, "sequences": sequences, "seed": seed, "vocab": vocab, "num_values": vocab - lo,
            "accuracy": (guess == answer).float().mean().item(), "chance_accuracy": 1.0 / (vocab - lo),
            "loss": loss, "chance_loss": math.log(vocab)}
