"""In-context probes on synthetic data with a fixed seed: induction and associative recall.

- **Induction** (Olsson et al. 2022, "In-context Learning and Induction Heads"): ``n`` sequences of ``L`` tokens
  drawn uniformly from the vocabulary, each repeated once (``[n, 2L]``). The first copy is unpredictable: its loss
  cannot be below ``ln V`` in expectation (chance), whatever the model; the second copy can be copied from the
  first. Reported: the mean cross-entropy (nats) of the first copy's tokens 2..L (predicted from their prefix) and of
  the second copy's tokens 2..L (the first token of the second copy is not inferable and is left out), and the
  difference ``first - second`` (0 = no induction; ``ln V`` = perfect copying), with its 95% Student-t interval
  over the sequences (``induction_gain_ci95``) and how it compares to chance (``vs_chance``: above chance when the
  interval is above 0).
- **Associative recall** (Ba et al. 2016, "Using Fast Weights to Attend to the Recent Past"; Arora et al. 2023,
  "Zoology", multi-query associative recall): ``k1 v1 k2 v2 ... kn vn kq`` with ``n`` distinct keys drawn from the
  lower half of the vocabulary, values drawn (with replacement) from the upper half, and ``kq`` one of the ``n``
  keys; the model should predict its value. Reported: accuracy of the argmax over the value tokens at the query
  (chance ``1 / num_values``; ties go to the lowest value id) and the cross-entropy of the correct value over the
  whole vocabulary (chance ``ln V`` for uniform logits). The accuracy has its exact Clopper-Pearson 95% interval
  (``accuracy_ci95``; above chance when it is above ``1 / num_values``), the loss a Student-t interval over the
  sequences (``loss_ci95``).

``symbols`` (default: every id of the vocabulary) restricts the random tokens to a set of ``K`` token ids, e.g. the
ids that occur in the run's training split (``normlab probe --symbols data``): a model never trained on an id
cannot be asked to copy it. Chance is then ``ln K`` for the first copy and ``1 / (K - K // 2)`` for recall (keys
from the first half of the symbols, values from the second).

A model here is any callable ``idx [B, T] (int64) -> logits [B, T, V]`` (``GPT.forward`` without targets).
``probe_run`` measures both on a trained run directory (``normlab probe RUN``; a sweep with ``diag.probes: true``
stores the same record as ``RUN/probes.json`` through ``store_probes``).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F

from normlab.errors import NormlabError
from normlab.rundir.files import PROBES_FILE
from normlab.rundir.publish import write_record
from normlab.rundir.readers import load_run, run_data
from normlab.stats.exact import clopper_pearson
from normlab.stats.intervals import MeanCI, mean_ci

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


def _symbols(vocab: int, symbols: torch.Tensor | None) -> torch.Tensor:
    return torch.arange(vocab) if symbols is None else torch.as_tensor(symbols, dtype=torch.long)


def induction(model: Model, *, vocab: int, length: int, sequences: int = 64, seed: int = 0, batch_size: int = 16,
              device: torch.device | str = "cpu", symbols: torch.Tensor | None = None) -> dict[str, Any]:
    """The induction probe (module docstring). ``length >= 2``; the model sees ``2 * length`` tokens."""
    if length < 2:
        raise ValueError(f"length must be >= 2, got {length}")
    sym = _symbols(vocab, symbols)
    idx = sym[induction_data(len(sym), length, sequences, seed)]
    logits = _logits(model, idx, batch_size, device)[:, :-1]  # position t predicts token t + 1
    nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), idx[:, 1:].reshape(-1),
                          reduction="none").view(sequences, -1)
    first_i = nll[:, : length - 1].double().mean(1)  # per sequence: tokens 1 .. L-1 of the first copy
    second_i = nll[:, length:].double().mean(1)  # tokens L+1 .. 2L-1: the second copy without its first token
    first, second = first_i.mean().item(), second_i.mean().item()
    gain = mean_ci((first_i - second_i).tolist())  # the sequences are the unit: a t interval over them
    return {"length": length, "sequences": sequences, "seed": seed, "vocab": vocab, "symbols": len(sym),
            "first_copy_loss": first, "second_copy_loss": second, "induction_gain": first - second,
            "induction_gain_ci95": _interval(gain), "chance_induction_gain": 0.0,
            "vs_chance": compare_to_chance(gain.low, above=lambda low: low > 0.0),
            "chance_first_copy_loss": math.log(len(sym)), "perfect_second_copy_loss": 0.0}


def recall(model: Model, *, vocab: int, pairs: int, sequences: int = 256, seed: int = 0, batch_size: int = 16,
           device: torch.device | str = "cpu", symbols: torch.Tensor | None = None) -> dict[str, Any]:
    """The associative-recall probe (module docstring). The model sees ``2 * pairs + 1`` tokens."""
    sym = _symbols(vocab, symbols)
    k = len(sym)
    idx, answer = recall_data(k, pairs, sequences, seed)  # symbol indices
    last = _logits(model, sym[idx], batch_size, device)[:, -1]  # [S, V] at the query
    values = sym[k // 2:]
    guess = last[:, values].argmax(-1) + k // 2
    loss_i = F.cross_entropy(last, sym[answer], reduction="none").double()
    correct = int((guess == answer).sum())
    chance = 1.0 / (k - k // 2)
    acc = clopper_pearson(correct, sequences)  # exact binomial interval of the accuracy
    loss = mean_ci(loss_i.tolist())
    return {"pairs": pairs, "sequences": sequences, "seed": seed, "vocab": vocab, "symbols": k,
            "num_values": k - k // 2, "accuracy": correct / sequences, "correct": correct,
            "accuracy_ci95": [acc.low, acc.high], "chance_accuracy": chance,
            "vs_chance": compare_to_chance(acc.low, above=lambda low: low > chance),
            "loss": loss_i.mean().item(), "loss_ci95": _interval(loss), "chance_loss": math.log(vocab)}


ABOVE_CHANCE = "above chance"
NOT_ABOVE_CHANCE = "not above chance"
"""How a probe's measure compares to chance: ``above chance`` when its whole 95% interval is on the better side of
the chance level (induction gain > 0; recall accuracy > 1 / num_values), else ``not above chance`` (the interval
reaches chance, or there is no interval)."""


def compare_to_chance(low: float | None, *, above: Callable[[float], bool]) -> str:
    """``ABOVE_CHANCE`` when the interval's lower end ``low`` is beyond chance (``above(low)``), else
    ``NOT_ABOVE_CHANCE`` (also without an interval)."""
    return ABOVE_CHANCE if low is not None and above(low) else NOT_ABOVE_CHANCE


def _interval(ci: MeanCI) -> list[float] | None:
    """``[low, high]`` of a t interval (None for a single value)."""
    return None if ci.half is None else [ci.low, ci.high]


SYMBOLS = ("data", "all")  # normlab probe --symbols: the run's training-split ids, or the whole vocabulary
DEFAULTS = {"length": None, "pairs": None, "sequences": 64, "seed": 0, "symbols": "data", "batch_size": 16}
"""``probe_run``'s settings when none is given: ``normlab probe``'s flag defaults, and what a sweep stores."""


def probe_run(run_dir: str | Path, *, length: int | None = None, pairs: int | None = None, sequences: int = 64,
              seed: int = 0, symbols: str = "data", batch_size: int = 16) -> dict[str, Any]:
    """Both probes on the run in ``run_dir`` (its final weights, else its last checkpoint; CPU, fp32):
    ``{run_dir, vocab, context, symbols, induction: {...}, recall: {...}}``. ``length`` defaults to half the run's
    context, ``pairs`` to ``min(16, (context - 1) // 2, K // 2)``; ``symbols``: ``data`` (the ids of the run's
    training split, identity-checked; K of them) or ``all`` (the whole vocabulary). A setting that does not fit
    the run is a one-line ``NormlabError`` naming what is allowed."""
    if symbols not in SYMBOLS:
        raise NormlabError(f"symbols must be one of {', '.join(SYMBOLS)}, got {symbols!r}")
    run = load_run(run_dir)
    mc = run.cfg.model
    vocab, context = mc.vocab_size, mc.context
    ids = None
    if symbols == "data":  # the ids of the run's training split (its own corpus, identity-checked)
        ids = torch.from_numpy(np.unique(np.asarray(run_data(run_dir, run.cfg).train)).astype(np.int64))
        if len(ids) < 4:
            raise NormlabError(f"{run_dir}: its training split uses {len(ids)} token ids; the probes need at least "
                               "4 (use --symbols all)")
    k = vocab if ids is None else len(ids)
    length = length or context // 2
    if length < 2 or 2 * length > context:
        raise NormlabError(f"--length {length}: the repeated sequence (2 x {length} tokens) must fit the run's "
                           f"context ({context}); allowed: 2 .. {context // 2}")
    pairs = pairs or min(16, (context - 1) // 2, k // 2)
    if pairs < 1 or 2 * pairs + 1 > context or pairs > k // 2:
        raise NormlabError(f"--pairs {pairs}: 2 x pairs + 1 tokens must fit the context ({context}) and pairs must "
                           f"be <= symbols / 2 ({k // 2}); allowed: 1 .. {min((context - 1) // 2, k // 2)}")
    common = {"sequences": sequences, "seed": seed, "batch_size": batch_size, "symbols": ids}
    return {"run_dir": str(run_dir), "vocab": vocab, "context": context, "symbols": symbols,
            "induction": induction(run.model, vocab=vocab, length=length, **common),
            "recall": recall(run.model, vocab=vocab, pairs=pairs, **common)}


def store_probes(run_dir: str | Path) -> dict[str, Any]:
    """``probe_run(run_dir)`` at ``DEFAULTS`` written to ``RUN_DIR/probes.json`` (atomic) with the settings used
    (``settings``: the keyword arguments of ``probe_run``, so ``normlab probe`` with them reproduces it); a run the
    probes do not fit gets ``{settings, error}`` instead. Returns what was written."""
    settings = dict(DEFAULTS)
    try:
        rec = {**probe_run(run_dir, **settings), "settings": settings}
        rec.pop("run_dir")  # stored results name no machine path
    except NormlabError as e:
        rec = {"settings": settings, "error": str(e)}
    write_record(run_dir, PROBES_FILE, rec)
    return rec
