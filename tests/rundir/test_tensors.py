"""normlab.rundir.tensors: the final checkpoint survives a full disk (the run stays resumable), identical runs give
identical model files, poisoned weights (NaN, integer dtypes) are refused."""

from __future__ import annotations

import hashlib
import json

import pytest

from tests.helpers import SHORT, assert_bad_input, run_inproc, tree

pytestmark = pytest.mark.usefixtures("one_thread")


def test_disk_full_during_the_final_checkpoint_stays_resumable(run, tmp_path, monkeypatch, cache):
    """safetensors' error on a full disk is one line (exit 2); nothing corrupt is left and --resume after freeing
    space ends with the same weights as an uninterrupted run."""
    import normlab.rundir.tensors as nio  # tensor files are written beside the checkpoint code
    from safetensors import SafetensorError

    from tests.helpers import assert_same_weights

    real = nio.save_file

    def full(tensors, path, metadata=None):
        if "step_00000008" in str(path):
            raise SafetensorError("Error while serializing: IoError(Os { code: 28, kind: StorageFull })")
        return real(tensors, path, metadata=metadata)

    out = tmp_path / "r"
    monkeypatch.setattr(nio, "save_file", full)
    proc = run_inproc("train", "tiny", *SHORT, "--out", str(out), cache=cache)
    last = proc.stderr.strip().splitlines()[-1]  # progress lines came first; the error is one line, no traceback
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert last.startswith("error: ") and "step_00000008" in last and "No space left on device" in last
    assert "normlab train --resume RUN_DIR" in last  # the way out, named for the command (normlab.safety)
    monkeypatch.setattr(nio, "save_file", real)
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["step_00000004"]  # no temp dir, no partial one
    assert not (out / "summary.json").exists()
    proc = run_inproc("train", "--resume", str(out), "--json", cache=cache)
    assert proc.returncode == 0, proc.stderr
    assert_same_weights(out, run)


def test_identical_runs_give_identical_model_files(run, tmp_path, cache):
    """sha256 of model.safetensors (and of each checkpoint's files) equal between identical runs."""
    out = tmp_path / "again"
    run_inproc("train", "tiny", *SHORT, "--out", str(out), cache=cache, check=True)
    for rel in ("model.safetensors", "checkpoints/step_00000008/model.safetensors",
                "checkpoints/step_00000008/optim.safetensors"):
        assert hashlib.sha256((out / rel).read_bytes()).digest() == hashlib.sha256((run / rel).read_bytes()).digest()
    import struct

    raw = (out / "model.safetensors").read_bytes()
    header = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])  # dicts keep the file's key order
    assert list(header["__metadata__"]) == sorted(header["__metadata__"]) == ["config_hash", "format"]


@pytest.mark.parametrize("poison,fragment", [("nan", "contains NaN or inf"), ("int64", "has dtype torch.int64")])
def test_poisoned_weights_are_refused(poison, fragment, run_copy, cache):
    import torch
    from safetensors.torch import load_file, save_file

    path = run_copy / "model.safetensors"
    t = load_file(str(path))
    name = sorted(t)[0]
    t[name] = torch.full_like(t[name], float("nan")) if poison == "nan" else t[name].to(torch.int64)
    save_file(t, str(path))
    before = tree(run_copy)
    assert_bad_input(run_inproc("eval", str(run_copy), "--max-tokens", "256", cache=cache), fragment, name)
    assert tree(run_copy) == before


@pytest.mark.parametrize("change, says", [
    (lambda s: s.__setitem__("step", "4"), "step must be 4 (its directory's step), got '4'"),
    (lambda s: s.__setitem__("step", float("nan")), "step must be 4 (its directory's step)"),
    (lambda s: s.__setitem__("step", 10 ** 400), "holds an integer of 401 digits"),  # the bounded reader (io)
    (lambda s: s.__setitem__("tokens_seen", -1), "tokens_seen must be an integer >= 0"),
    (lambda s: s.__setitem__("elapsed_s", "x"), "elapsed_s must be a finite number >= 0"),
    (lambda s: s.pop("rng"), "rng must be an object with the data generator's state"),
    (lambda s: s["rng"].__setitem__("data", [300, -1]), "rng.data must be a list of bytes (integers 0-255)"),
])
def test_a_hand_edited_checkpoint_state_is_one_line_and_leaves_the_run(change, says, run_copy, cache):
    """--resume from a checkpoint whose state.json has a field of the wrong type or value (a step that is not its
    directory's, a negative token count, no RNG state) is one line naming the file and the field, exit 2 (it was a
    TypeError / KeyError / IndexError traceback, or a step of 1e400 taken as the run's end); nothing in the run
    directory changes. Stacked groups resume through the same reader."""
    import shutil

    shutil.rmtree(run_copy / "checkpoints" / "step_00000008")
    (run_copy / "summary.json").unlink()
    (run_copy / "model.safetensors").unlink()
    path = run_copy / "checkpoints" / "step_00000004" / "state.json"
    state = json.loads(path.read_text())
    change(state)
    path.write_text(json.dumps(state))
    before = tree(run_copy)
    assert_bad_input(run_inproc("train", "--resume", str(run_copy), cache=cache), str(path), says)
    assert {k: v for k, v in tree(run_copy).items() if k != ".train.lock"} == before  # metrics.jsonl kept whole
