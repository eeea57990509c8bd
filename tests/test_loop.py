"""normlab.train.loop: kill -9 between the final checkpoint and the summary keeps the metrics; two Ctrl-C before the
loop still write a summary."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.helpers import SHORT, run_inproc

pytestmark = pytest.mark.usefixtures("one_thread")


def test_kill_9_between_final_checkpoint_and_summary_keeps_metrics(run, tmp_path, cache):
    """Issue row 1: the final checkpoint carries the final metrics, so a resume restores them (not null)."""
    x = tmp_path / "x"
    shutil.copytree(run, x)
    (x / "model.safetensors").unlink()
    (x / "summary.json").unlink()
    proc = run_inproc("train", "--resume", str(x), "--json", cache=cache)
    assert proc.returncode == 0, proc.stderr
    got, ref = json.loads(proc.stdout), json.loads((run / "summary.json").read_text())
    for k in ("val_bpb", "val_loss", "train_loss", "best_val_bpb"):
        assert got[k] is not None and got[k] == ref[k], k
    assert (x / "model.safetensors").read_bytes() == (run / "model.safetensors").read_bytes()


def _popen_train(args: list[str], cache: Path):
    import subprocess
    import sys

    from tests.helpers import cli_env

    return subprocess.Popen([sys.executable, "-m", "normlab.cli", *args], env=cli_env(cache),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_ctrl_c_twice_before_the_loop_writes_summary(tmp_path, cache):
    import signal
    import time

    out = tmp_path / "r"
    proc = _popen_train(["train", "tiny", *SHORT, "--set", "train.steps=400", "--out", str(out)], cache)
    deadline = time.time() + 120
    while not (out / "config.yaml").exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    s = json.loads((out / "summary.json").read_text())
    assert s["status"] == "interrupted" and s["steps"] == 400
