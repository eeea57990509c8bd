"""normlab.train.runstate: a checkpoint restores a run's state exactly (the continued run equals the uninterrupted
one bit for bit), refuses another config's checkpoint, and the divergence rule is the documented ``3 ln(vocab)``."""

from __future__ import annotations

import json
import math

import pytest
import torch

from normlab.config import load_config
from normlab.errors import NormlabError
from normlab.model import build_model
from normlab.rundir.readers import apply_norm_defaults, load_data, read_jsonl
from normlab.train.loop import get_batch
from normlab.train.losses import lm_loss
from normlab.train.runstate import RunState, loss_ceiling, truncate_metrics

pytestmark = pytest.mark.usefixtures("one_thread")
SETS = ["model.depth=1", "train.steps=6", "train.clip=adagc", "optim.nap=true", "optim.effective_lr_every=2",
        "diag.every=0"]


@pytest.fixture(scope="module")
def data(cache):
    import os

    os.environ["NORMLAB_CACHE_DIR"] = str(cache)
    try:
        return load_data(load_config("tiny", SETS))
    finally:
        del os.environ["NORMLAB_CACHE_DIR"]


def _state(run_dir, data, sets=SETS) -> RunState:
    cfg = load_config("tiny", sets)
    cfg.model.vocab_size = data.vocab_size
    apply_norm_defaults(cfg)
    torch.manual_seed(cfg.seed)
    return RunState.build(cfg, run_dir, data, build_model(cfg.model), cfg.hash())


def _steps(s: RunState, n: int) -> None:
    """``n`` steps as the loop takes them (one micro-batch, eager forward)."""
    tc, mc = s.cfg.train, s.cfg.model
    for _ in range(n):
        s.set_lr()
        x, y = get_batch(s.data.train, tc.batch_size, mc.context, s.gen)
        loss, parts = lm_loss(s.model(x).float(), y)
        loss.backward()
        grad_norm = s.after_backward(float(parts["ce"]))
        assert s.diverged(grad_norm) is None
        s.advance(s.optimizer_step())


def test_a_resumed_state_continues_as_the_uninterrupted_one(tmp_path, data):
    ref = _state(tmp_path / "ref", data)
    _steps(ref, 6)

    a = _state(tmp_path / "a", data)
    _steps(a, 3)
    rng = torch.get_rng_state()
    a.checkpoint(a.step, 1.5, rng, None)
    b = _state(tmp_path / "a", data)  # a new process: seeded init again, then the checkpoint over it
    got = b.resume()
    assert torch.equal(got["torch"], rng) and "cuda" not in got
    assert (b.step, b.tokens_seen, b.elapsed, b.last_loss) == (3, a.tokens_seen, 1.5, a.last_loss)
    assert torch.equal(b.gen.get_state(), a.gen.get_state())
    _steps(b, 3)
    assert b.step == ref.step == 6 and b.last_loss == ref.last_loss
    for (n, p), (_, q) in zip(b.model.named_parameters(), ref.model.named_parameters()):
        assert torch.equal(p, q), n
    assert b.clipper.state_dict() == ref.clipper.state_dict()  # AdaGC's thresholds


def test_a_checkpoint_of_another_config_is_refused(tmp_path, data):
    a = _state(tmp_path / "r", data)
    _steps(a, 1)
    a.checkpoint(a.step, 0.0, torch.get_rng_state(), None)
    other = _state(tmp_path / "r", data, [*SETS, "train.lr=0.001"])
    with pytest.raises(NormlabError, match="another config"):
        other.resume()


def test_resume_drops_metrics_after_the_checkpoint(tmp_path):
    path = tmp_path / "metrics.jsonl"
    lines = [json.dumps({"step": i, "loss": float(i)}) for i in range(6)]
    path.write_text("\n".join(lines[:4]) + "\nnot json\n" + "\n".join(lines[4:]) + "\n")
    truncate_metrics(path, 3)
    assert [r["step"] for r in read_jsonl(path)] == [0, 1, 2, 3]


def test_divergence_is_a_loss_above_three_times_uniform_or_not_finite(tmp_path, data):
    s = _state(tmp_path / "r", data)
    ceiling = 3.0 * math.log(data.vocab_size)
    assert loss_ceiling(s.cfg) == pytest.approx(ceiling)
    s.last_loss = ceiling * 0.99
    assert s.diverged(1.0) is None and s.step == 0 and s.status == "completed"
    assert s.diverged(float("inf")) is not None and s.status == "diverged" and s.step == 1
    s.status, s.step, s.last_loss = "completed", 4, ceiling * 1.01
    assert s.diverged(1.0).startswith("diverged at step 5: loss") and s.status == "diverged"
