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
from normlab.rundir.readers import last_step
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


def test_training_progress_without_a_terminal_prints_elapsed_and_eta(monkeypatch, capsys):
    """Issue 29 item 8: plain progress lines carry elapsed time and ETA, by hand: 30 s for steps 10 -> 40 of 100
    (resumed at 10) leaves 60 steps at 1 s each."""
    from normlab.train import progress as train_progress

    clock = iter([1000.0, 1030.0, 1100.0])
    monkeypatch.setattr(train_progress.time, "time", lambda: next(clock))
    rep = train_progress.ProgressReporter(100, start=10)  # stderr is captured: not a terminal
    rep.update(40, 3.25, 1234.0)
    rep.update(100, 3.0, 1000.0)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "step 40/100 loss 3.2500 1,234 tok/s elapsed 0:00:30 eta 0:01:00"
    assert lines[1] == "step 100/100 loss 3.0000 1,000 tok/s elapsed 0:01:40 eta 0:00:00"
    assert train_progress._hms(3725.4) == "1:02:05"


def test_a_run_directory_named_with_escapes_prints_one_escaped_line_each(tmp_path, cache):
    """``train --out`` a directory whose name holds an ANSI escape and a newline: the run trains into that very
    directory, and every stderr line of the training loop (the banner names the run) shows them as escapes."""
    from tests.helpers import run_inproc

    out = tmp_path / "red\x1b[31m\nrun"
    r = run_inproc("train", "tiny", "--set", "train.steps=2", "--set", "train.eval_every=2", "--out", str(out),
                   cache=cache)
    assert r.returncode == 0, r.stderr
    assert "\x1b" not in r.stderr and (out / "summary.json").is_file()
    banner = [ln for ln in r.stderr.splitlines() if ln.startswith("train ")]  # the one-line banner names the run
    assert len(banner) == 1 and "red\\x1b[31m\\nrun: " in banner[0]
    assert r.stdout.startswith(f"run {tmp_path}/red\\x1b[31m\\nrun: status completed") and "\x1b" not in r.stdout


def test_sweep_eta_after_the_first_finished_run(tmp_path, monkeypatch):
    """The sweep's own ETA, by hand: 3 of 10 runs done in 60 s (any number of workers) leaves 7 runs at 20 s each;
    none before the first run finished. The periodic progress block starts with it."""
    from normlab.experiments import progress

    assert progress.sweep_eta_s(3, 10, 60.0) == pytest.approx(140.0) and progress.sweep_eta_s(0, 10, 60.0) is None
    clock = iter([1000.0, 1000.0, 1030.0, 1060.0, 1060.0])
    monkeypatch.setattr(progress.time, "monotonic", lambda: next(clock))
    lines: list[str] = []
    p = progress.SweepProgress(tmp_path, lines.append, every=1.0, total=10)
    assert p.sweep_line(0) == "sweep: 0/10 runs done, 30s elapsed, ETA after the first run finishes"
    assert p.sweep_line(3) == "sweep: 3/10 runs done, 1m00s elapsed, ETA 2m20s"


def test_sweep_bar_on_a_terminal_counts_finished_runs(tmp_path):
    """On a terminal the sweep gets a rich progress bar whose count follows the finished runs (1/2 after the first);
    off a terminal it draws nothing."""
    from rich.console import Console

    from normlab.experiments.progress import SweepProgress

    buf = io.StringIO()
    p = SweepProgress(tmp_path, lambda s: None, every=0, total=2)
    with p.bar(Console(file=buf, force_terminal=True, width=120)):
        p.sweep_line(1)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", buf.getvalue())
    assert "sweep" in text and "1/2 runs" in text and "ETA " in text.split("1/2 runs", 1)[1], text
    quiet = io.StringIO()
    with p.bar(Console(file=quiet, force_terminal=False)):
        p.sweep_line(2)
    assert quiet.getvalue() == ""
