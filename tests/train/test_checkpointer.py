"""normlab.train.checkpointer: a checkpoint written in the background holds the state as of its save (the same
bytes as a write in the loop), one write at a time; a failed write raises its one-line error in the training
thread and leaves the previous checkpoint whole; a run whose checkpoint write fails ends with that line."""

from __future__ import annotations

import re
import threading

import pytest
import torch
from safetensors import SafetensorError

import normlab.rundir.tensors as tensor_files
from normlab.config import load_config
from normlab.model import build_model
from normlab.train.checkpointer import CheckpointWriter
from normlab.train.optim import build_optimizer
from tests.helpers import run_inproc, tree

pytestmark = pytest.mark.usefixtures("one_thread")
SAVE_FILE = tensor_files.save_file
STATE = {"tokens_seen": 0, "elapsed_s": 0.0, "rng": {"data": [1, 2]}, "nested": {"losses": [1.0]}}


def _model_opt():
    cfg = load_config("tiny", ["model.depth=1"])
    torch.manual_seed(0)
    model = build_model(cfg.model)
    opt, _ = build_optimizer(model, cfg.train, cfg.optim)
    model(torch.randint(0, 256, (2, 8))).float().mean().backward()
    opt.step()  # optimizer state to checkpoint
    return model, opt


def _files(d):
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


def test_a_background_checkpoint_holds_the_state_of_its_save_in_the_bytes_of_a_write_in_the_loop(tmp_path,
                                                                                                   monkeypatch):
    model, opt = _model_opt()
    state = {k: (dict(v) if isinstance(v, dict) else v) for k, v in STATE.items()}
    tensor_files.save_checkpoint(tmp_path / "sync", 3, *tensor_files.checkpoint_tensors(model, opt), STATE, "h", 2)
    release, real = threading.Event(), tensor_files.save_checkpoint

    def held(*args):  # the write starts only after the training thread changed everything it was handed
        release.wait(10)
        return real(*args)

    monkeypatch.setattr(tensor_files, "save_checkpoint", held)
    writer = CheckpointWriter()
    writer.save(tmp_path / "bg", 3, model, opt, state, "h", 2)
    assert writer.pending
    with torch.no_grad():  # the next step: parameters and optimizer state change in place
        for p in model.parameters():
            p.add_(1.0)
        for s in opt.state.values():
            s["exp_avg"].mul_(3)
    state["nested"]["losses"].append(2.0)
    release.set()
    writer.wait()
    assert not writer.pending
    assert _files(tmp_path / "bg/checkpoints/step_00000003") == _files(tmp_path / "sync/checkpoints/step_00000003")


def test_one_write_at_a_time_and_the_newest_kept(tmp_path, monkeypatch):
    model, opt = _model_opt()
    live, most, real = [0], [0], tensor_files.save_checkpoint
    lock = threading.Lock()

    def counted(*args):
        with lock:
            live[0] += 1
            most[0] = max(most[0], live[0])
        try:
            threading.Event().wait(0.05)  # a slow disk
            return real(*args)
        finally:
            with lock:
                live[0] -= 1

    monkeypatch.setattr(tensor_files, "save_checkpoint", counted)
    writer = CheckpointWriter()
    for step in (1, 2, 3, 4):
        writer.save(tmp_path, step, model, opt, STATE, "h", 2)
    writer.wait()
    assert most[0] == 1
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_00000003", "step_00000004"]


def _disk_full(monkeypatch, after: int):
    """safetensors' writer fails (a full disk) from its ``after``-th file on."""
    calls, real = [0], SAVE_FILE

    def save_file(*args, **kwargs):
        calls[0] += 1
        if calls[0] > after:
            raise SafetensorError("No space left on device (os error 28)")
        return real(*args, **kwargs)

    monkeypatch.setattr(tensor_files, "save_file", save_file)


def _error(call):
    """``call``'s exception as ``(type, one line)``, the temporary directory's random suffix masked."""
    try:
        call()
    except Exception as e:  # noqa: BLE001
        return type(e), re.sub(r"(\.step_\d{8})\.\w{8}", r"\1.TMP", str(e))
    raise AssertionError("no error")


def test_a_failed_background_write_raises_its_line_in_the_training_thread_and_keeps_the_previous_checkpoint(
        tmp_path, monkeypatch):
    model, opt = _model_opt()
    writer = CheckpointWriter()
    writer.save(tmp_path, 1, model, opt, STATE, "h", 2)
    writer.wait()
    before = tree(tmp_path)
    _disk_full(monkeypatch, after=1)  # the second checkpoint's optimizer file cannot be written
    in_loop = _error(lambda: tensor_files.save_checkpoint(
        tmp_path, 2, *tensor_files.checkpoint_tensors(model, opt), STATE, "h", 2))  # as the loop wrote it before
    assert tree(tmp_path) == before
    _disk_full(monkeypatch, after=1)
    writer.save(tmp_path, 2, model, opt, STATE, "h", 2)
    raised = _error(writer.wait)
    assert raised == in_loop and "\n" not in raised[1]
    assert "No space left on device" in raised[1] and "optim.safetensors" in raised[1]
    assert tree(tmp_path) == before  # step 1 whole, no step 2
    assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["step_00000001"]  # no temporary directory
    writer.wait()  # raised once
    _disk_full(monkeypatch, after=0)
    writer.save(tmp_path, 3, model, opt, STATE, "h", 2)
    assert _error(lambda: writer.save(tmp_path, 4, model, opt, STATE, "h", 2))[0] is raised[0]  # the next save
    assert writer.settle() is None and tree(tmp_path) == before


def test_a_run_whose_checkpoint_write_fails_ends_with_one_line_and_its_last_checkpoint(tmp_path, cache,
                                                                                       monkeypatch):
    out = tmp_path / "run"
    _disk_full(monkeypatch, after=2)  # step 4's checkpoint (model, optimizer) is written, step 8's is not
    r = run_inproc("train", "tiny", "--set", "train.steps=12", "--set", "train.checkpoint_every=4", "--set",
                   "train.eval_every=12", "--set", "diag.every=0", "--out", str(out), cache=cache)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    last = r.stderr.strip().splitlines()[-1]  # after the progress lines: the write's one line, as in the loop
    assert last.startswith("error: ") and ".step_00000008." in last and "No space left on device" in last, last
    assert "normlab train --resume" in last
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step_00000004"]
    assert not (out / "summary.json").exists() and not (out / "model.safetensors").exists()
