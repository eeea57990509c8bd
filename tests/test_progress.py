"""Progress where it used to be silent: data preparation (reading, BPE training, tokenizing) on a terminal, and
``normlab compare`` between run completions (per-run step, ETA, log path)."""

from __future__ import annotations

import io
import json
import re

import pytest
import yaml

from normlab.data import prepare_data
from normlab.data import progress as data_progress
from normlab.experiments.progress import eta_s
from normlab.run.rundir import last_step
from tests.helpers import normlab

SOURCE = "synthetic:markov?order=1&alphabet=8&length=20000&seed=3"


def test_data_preparation_reports_its_stages_on_a_terminal(tmp_path, monkeypatch, capsys):
    from rich.console import Console

    prepare_data(SOURCE, "bpe:280", cache_dir=tmp_path / "quiet")  # not a terminal: nothing printed
    assert capsys.readouterr().err == ""
    buf = io.StringIO()
    monkeypatch.setattr(data_progress, "_console", lambda: Console(file=buf, force_terminal=True, width=200))
    monkeypatch.setattr(data_progress, "MIN_REPORT_S", 0.0)
    prepare_data(SOURCE, "bpe:280", cache_dir=tmp_path / "tty")
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", buf.getvalue())
    for want in (f"reading corpus '{SOURCE}': done in", "training BPE tokenizer (vocab 280) on the train split",
                 "tokenizing the train split", "tokenizing the val split", "tokenizing the test split"):
        assert want in text, (want, text)
    buf.truncate(0)
    prepare_data(SOURCE, "bpe:280", cache_dir=tmp_path / "tty")  # cached: no tokenizer training any more
    assert "training BPE" not in buf.getvalue()


def test_last_step_and_eta(tmp_path):
    m = tmp_path / "metrics.jsonl"
    assert last_step(m) is None
    m.write_text('{"step": 3, "loss": 1.0}\n{"step": 7, "loss": 0.9}\n{"step": 8, "lo')  # a line cut by kill -9
    assert last_step(m) == 7
    assert eta_s(step=30, steps=100, first_step=10, elapsed_s=40.0) == pytest.approx(140.0)  # 20 steps in 40 s
    assert eta_s(step=10, steps=100, first_step=10, elapsed_s=5.0) is None


@pytest.mark.slow
def test_compare_prints_running_runs_step_eta_and_log(tmp_path, cache, monkeypatch):
    monkeypatch.setenv("NORMLAB_PROGRESS_EVERY", "0.3")
    sweep = tmp_path / "s.yaml"
    sweep.write_text(yaml.safe_dump({"name": "p", "base": "tiny", "seeds": [0], "set": {
        "train.steps": 80, "train.log_every": 1, "train.eval_every": 80, "train.checkpoint_every": 80,
        "model.context": 16}, "variants": [{"name": "RMS", "set": {"model.norm": "rmsnorm"}}]}))
    out = tmp_path / "out"
    proc = normlab("compare", str(sweep), "--out", str(out), "--workers", "1", "--json", cache=cache)
    assert proc.returncode == 0, proc.stderr
    log = out / "logs" / "rms-s0.log"
    lines = re.findall(r"rms-s0: step (\d+)/80, ETA (\S+) \(log: (.+)\)", proc.stderr)
    assert lines, proc.stderr
    # step 0 is the loss-at-initialisation record, written before the first step (ETA n/a then)
    assert all(0 <= int(s) <= 80 and p == str(log) for s, _, p in lines) and log.is_file()
    assert all(eta == "n/a" for s, eta, _ in lines if int(s) == 0)
    assert json.loads(proc.stdout)["counts"] == {"completed": 1}
