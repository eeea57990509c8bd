"""normlab.train.runstate: a checkpoint restores a run's state exactly (the continued run equals the uninterrupted
one bit for bit), refuses another config's checkpoint, and the divergence rule is the documented ``3 ln(vocab)``."""

from __future__ import annotations

import json
import math

import pytest
import torch

from normlab.config import apply_norm_defaults, load_config
from normlab.errors import NormlabError
from normlab.model import build_model
from normlab.rundir.readers import load_data, read_jsonl
from normlab.train.loop import get_batch
from normlab.train.losses import lm_loss
from normlab.train.runstate import RunState, loss_ceiling, truncate_metrics
from tests.helpers import assert_same_weights, kill_9_in, normlab, summary

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
    a.writer.wait()  # written in the background (normlab.train.checkpointer)
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
    a.writer.wait()
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


def test_a_run_killed_before_its_first_checkpoint_resumes_with_its_step_0_line_and_config_hash(tmp_path, cache):
    """kill -9 after config.yaml, fingerprint.json and param_groups.json, before the data's identity and the step-0
    line: ``--resume`` restarts from the seeded initialisation with the loss at initialisation and the config hash
    of the uninterrupted run (was: no step-0 line, init_val_* null, config.yaml's hash)."""
    args = ["train", "tiny", "--set", "train.steps=8", "--set", "train.eval_every=8"]
    ref, cut = tmp_path / "ref", tmp_path / "cut"
    normlab(*args, "--out", str(ref), cache=cache, check=True)
    kill_9_in(args, cut, cache, "normlab.rundir.readers:save_run_identity")
    assert (cut / "param_groups.json").is_file() and not (cut / "metrics.jsonl").exists()
    assert not list((cut / "checkpoints").glob("step_*")) if (cut / "checkpoints").exists() else True
    normlab("train", "--resume", str(cut), cache=cache, check=True)
    want, got = summary(ref), summary(cut)
    assert got["config_hash"] == want["config_hash"] and got["config_hash"] != load_config(
        str(cut / "config.yaml")).hash()  # the declared hash, not that of config.yaml's filled-in values
    assert (got["init_val_bpb"], got["init_val_loss"]) == (want["init_val_bpb"], want["init_val_loss"])
    assert read_jsonl(cut / "metrics.jsonl")[0] == read_jsonl(ref / "metrics.jsonl")[0]
    assert (cut / "data.json").is_file() and got["val_bpb"] == want["val_bpb"]
    assert_same_weights(ref, cut)
