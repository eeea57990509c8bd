"""Live TensorBoard tracking (normlab.train.tracking): a single ``normlab train`` writes scalars and hparams while it
trains; the event files are decoded with the protobuf classes of tensorboardX and checked against metrics.jsonl."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from normlab.train.tracking import flat_hparams, read_hparams, read_scalars
from tests.helpers import cli_env


def test_single_run_writes_tensorboard_while_it_trains(tmp_path, cache):
    out = tmp_path / "run"
    args = ["train", "tiny", "--set", "train.steps=5000", "--set", "train.log_every=1", "--set", "train.eval_every=5",
            "--set", "train.checkpoint_every=5000", "--set", "model.context=16", "--out", str(out)]
    proc = subprocess.Popen([sys.executable, "-m", "normlab", *args], env=cli_env(cache),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    seen: list = []
    alive = False
    try:
        deadline = time.time() + 180
        while time.time() < deadline and proc.poll() is None:
            if (out / "tb").is_dir():
                seen = read_scalars(out / "tb")
                if sum(t == "val/bpb" for t, _, _ in seen) >= 2:
                    alive = proc.poll() is None  # read while the run is still training
                    break
            time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGINT)  # checkpoint and stop (status interrupted)
        proc.wait(timeout=120)
    assert alive, "no validation scalars appeared while the run trained"
    assert {"train/loss", "train/lr", "train/grad_norm", "perf/tokens_per_s", "val/loss"} <= {t for t, _, _ in seen}
    assert any(t.startswith("diag/") for t, _, _ in seen)  # training-time diagnostics (diag.every: 10)

    # after the run: every logged value equals metrics.jsonl (float32 in the event file)
    scalars = read_scalars(out / "tb")
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    for key, tag in (("loss", "train/loss"), ("lr", "train/lr"), ("grad_norm", "train/grad_norm"),
                     ("val_bpb", "val/bpb")):
        want = {m["step"]: m[key] for m in metrics if key in m}
        got = {s: v for t, s, v in scalars if t == tag}
        assert got.keys() == want.keys() and len(want) >= 2, tag
        assert all(got[s] == pytest.approx(want[s], rel=1e-6, abs=1e-12) for s in want), tag
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "interrupted" and max(s for t, s, _ in scalars if t == "train/loss") == summary["step"]

    hp = read_hparams(out / "tb")
    cfg = flat_hparams(__import__("yaml").safe_load((out / "config.yaml").read_text()))
    assert hp["model.norm"] == "layernorm" and hp["train.steps"] == 5000 and hp["model.context"] == 16
    assert set(cfg) <= set(hp) and hp["status"] == "STATUS_UNKNOWN"  # interrupted (resumable)


def test_flat_hparams():
    assert flat_hparams({"model": {"norm": "rmsnorm", "norm_options": {}, "x": None, "l": [1, 2]}, "seed": 3}) == {
        "model.norm": "rmsnorm", "model.norm_options": "{}", "model.l": "[1, 2]", "seed": 3}
