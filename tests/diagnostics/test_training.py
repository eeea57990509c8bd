"""normlab.diagnostics.training: a diagnostic step reads its statistics to the host in one transfer, other steps
read nothing (the counter test of issue 55 item 1); the values are those of the host-side formulas."""

from __future__ import annotations

import math
import os
import traceback
from collections import defaultdict

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import normlab.diagnostics.training as T
from normlab.config import load_config
from normlab.train.loop import train

pytestmark = pytest.mark.usefixtures("one_thread")

DIAG_DIR = os.sep + os.path.join("normlab", "diagnostics") + os.sep
# what waits for the device: a scalar read (.item(), float(), bool(), an `if` on a tensor), a boolean index or
# nonzero (its output size), a masked select, and a list or host copy of a tensor
SYNCING = {torch.ops.aten._local_scalar_dense.default, torch.ops.aten.nonzero.default,
           torch.ops.aten.masked_select.default, torch.ops.aten.index.Tensor}


class DiagReads:
    """Counts, per training step, the host reads made from normlab/diagnostics/ (any frame of the stack there):
    the syncing aten ops above, ``Tensor.tolist``, ``Tensor.cpu`` and ``Tensor.numpy``."""

    def __init__(self) -> None:
        self.reads: dict[int | None, list[str]] = defaultdict(list)
        self.step: int | None = None

    def count(self, what: str) -> None:
        frames = [f for f in traceback.extract_stack()[:-2] if DIAG_DIR in f.filename]
        if frames:
            self.reads[self.step].append(f"{what} {os.path.basename(frames[-1].filename)}:{frames[-1].name}")


def test_a_diagnostic_step_reads_once_and_other_steps_never(monkeypatch, tmp_path):
    reads = DiagReads()

    class Mode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func in SYNCING and not (func is torch.ops.aten.index.Tensor and not _bool_index(args)):
                reads.count(str(func))
            return func(*args, **(kwargs or {}))

    for name in ("tolist", "cpu", "numpy"):
        real = getattr(torch.Tensor, name)

        def counted(t, *a, _real=real, _name=name, **k):
            reads.count(_name)
            return _real(t, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, counted)
    real_start = T.TrainDiagnostics.start_step

    def start(self, step):
        reads.step = step
        return real_start(self, step)

    real_after = T.TrainDiagnostics.after_backward

    def after(self, step, loss):
        real_after(self, step, loss)
        reads.step = None  # from here to the next step's start: the update, evaluation, checkpoints, summary

    monkeypatch.setattr(T.TrainDiagnostics, "start_step", start)
    monkeypatch.setattr(T.TrainDiagnostics, "after_backward", after)
    # QK-norm and an embedding norm: every kind of statistic (norm sites, grad norms, logit probe, weight norms,
    # Softmax Collapse over two micro-batches)
    cfg = load_config("tiny", ["train.steps=12", "diag.every=4", "train.eval_every=12", "train.checkpoint_every=12",
                               "train.grad_accum=2", "model.qk_norm=true", "model.embed_norm=true"])
    with Mode():
        train(cfg, tmp_path / "r", quiet=True)
    diag_steps = [i for i in range(12) if (i + 1) % 4 == 0]
    for i in range(12):
        if i in diag_steps:
            assert len(reads.reads[i]) == 1, (i, reads.reads[i])
            assert reads.reads[i][0] == "tolist training.py:read_once"
        else:
            assert reads.reads[i] == [], (i, reads.reads[i])
    recs = [r for r in map(__import__("json").loads, (tmp_path / "r" / "metrics.jsonl").read_text().splitlines())
            if "diag/resid_rms/0" in r]
    assert [r["step"] for r in recs] == [i + 1 for i in diag_steps]
    keys = set(recs[0])
    for k in ("diag/embed_rms", "diag/norm_rms/final_norm", "diag/grad_norm/attn/0", "diag/attn_logit_max/1",
              "diag/output_lse", "diag/tev_mean", "diag/head_spectral_norm", "diag/softmax_collapse"):
        assert k in keys, k


def _bool_index(args) -> bool:
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (args[1] if len(args) > 1 else []) or [])


def test_a_diagnostic_steps_record_matches_direct_computations():
    """The record read in one transfer holds what direct computations give: block 0's output RMS and variance, the
    attention gradient norm of block 0, the mean logsumexp of the output, the Softmax Collapse fractions, the TEV."""
    from normlab.diagnostics.collapse import collapse_fractions
    from normlab.model import build_model

    cfg = load_config("tiny", ["model.vocab_size=16", "diag.every=1"])
    torch.manual_seed(0)
    model = build_model(cfg.model)
    diag = T.TrainDiagnostics(model, cfg.diag)
    seen = {}
    model.blocks[0].register_forward_hook(lambda m, i, o: seen.__setitem__("b0", o.detach().double()))
    x, y = torch.randint(16, (4, 32)), torch.randint(16, (4, 32))
    diag.start_step(0)
    logits = model(x)
    diag.observe_output(logits, y)
    torch.nn.functional.cross_entropy(logits.reshape(-1, 16), y.reshape(-1)).backward()
    diag.after_backward(0, 1.0)
    rec = diag.collect()
    b0 = seen["b0"]
    assert rec["diag/resid_rms/0"] == pytest.approx(float(b0.square().mean().sqrt()), rel=1e-6)
    assert rec["diag/resid_var/0"] == pytest.approx(float(b0.var(correction=0)), rel=1e-5)
    g = torch.cat([p.grad.reshape(-1).double() for p in model.blocks[0].attn.parameters()])
    assert rec["diag/grad_norm/attn/0"] == pytest.approx(float(g.norm()), rel=1e-6)
    lse = torch.logsumexp(logits.detach().double(), -1).mean()
    assert rec["diag/output_lse"] == pytest.approx(float(lse), rel=1e-6)
    frac = collapse_fractions(logits, y)
    assert (rec["diag/softmax_collapse"], rec["diag/logits_beyond_exp"]) == (frac["softmax_collapse"],
                                                                           frac["logits_beyond_exp"])
    tev = model.tok_emb.weight.detach().double().std(dim=1, correction=0)
    assert rec["diag/tev_mean"] == pytest.approx(float(tev.mean()), rel=1e-12)


def test_read_once_keeps_order_and_drops_non_finite_where_asked():
    vals = {"a": torch.tensor(1.5), "b": torch.tensor(float("nan")), "c": torch.tensor(2, dtype=torch.int64),
            "d": torch.tensor(float("inf"))}
    assert list(T.read_once(vals, {"b", "d"}).items()) == [("a", 1.5), ("c", 2.0)]
    got = T.read_once(vals, set())
    assert list(got) == ["a", "b", "c", "d"] and math.isnan(got["b"]) and got["d"] == math.inf
