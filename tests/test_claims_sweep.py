"""The claims suite trains through the sweep runner (normlab.experiments.runner): its output directory is a sweep
directory, old-layout runs are moved in and reused, ``--reuse`` copies another sweep's identical runs, Ctrl-C
stops it resumably with exit status 130 and measures nothing."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from normlab.experiments.claims.budgets import get_budget
from normlab.experiments.claims.variants import variant_config
from normlab.experiments.store import Store
from tests.helpers import cli_env, run_inproc

ARGS = ("claims", "--budget", "tiny", "--seeds", "1", "--only", "powernorm-lm", "--json")


def test_claims_dir_is_a_sweep_dir_and_old_layout_runs_are_moved_in(tmp_path):
    """A first run writes a sweep directory (store rows completed, TensorBoard per run); the same runs put back in
    the layout before the sweep runner (runs/<variant>/seed<k> + claims_spec.json, no store) are moved into place and
    reused (0 trained), giving the same values."""
    from normlab.experiments.claims.execution import spec_record
    from normlab.io import write_json

    out, cache = tmp_path / "claims", tmp_path / "cache"
    rep = json.loads(run_inproc(*ARGS, "--out", str(out), cache=cache, check=True).stdout)
    assert rep["trained_runs"] == 2 and rep["reused_runs"] == 0
    rows = {r["run_id"]: r for r in Store(out / "results.sqlite").runs()}
    runs = rep["claims"][0]["runs"][0]
    assert sorted(rows) == sorted(Path(p).name for p in runs.values())
    assert all(r["status"] == "completed" and r["train_calls"] == 1 for r in rows.values())
    assert all(any((out / "tb" / rid).iterdir()) for rid in rows)
    assert yaml.safe_load((out / "sweep.yaml").read_text()) == {"name": "claims-tiny", "claims_budget": "tiny"}

    old = tmp_path / "old"  # the same runs in the old layout
    for variant, p in runs.items():
        dest = old / "runs" / variant / "seed0"
        shutil.copytree(p, dest)
        write_json(dest / "claims_spec.json", spec_record(variant_config(variant, get_budget("tiny"), 0)))
    again = run_inproc(*ARGS, "--out", str(old), cache=cache, check=True)
    rep2 = json.loads(again.stdout)
    assert rep2["trained_runs"] == 0 and rep2["reused_runs"] == 2, again.stderr
    assert rep2["claims"][0]["values"] == rep["claims"][0]["values"]
    assert "moved 2 finished run(s) of the old layout" in again.stderr
    assert not (old / "runs" / "powernorm").exists()
    moved = {r["run_id"]: r for r in Store(old / "results.sqlite").runs()}
    assert sorted(moved) == sorted(rows) and all(r["status"] == "completed" and r["train_calls"] == 0
                                                 for r in moved.values())
    assert [r["val_bpb"] for _, r in sorted(moved.items())] == [r["val_bpb"] for _, r in sorted(rows.items())]


def test_claims_refuse_another_sweeps_directory(tmp_path):
    from tests.helpers import assert_bad_input

    out, cache = tmp_path / "claims", tmp_path / "cache"
    out.mkdir()
    Store(out / "results.sqlite").create("demo", "0123456789abcdef")
    assert_bad_input(run_inproc(*ARGS, "--out", str(out), cache=cache), "holds sweep 'demo'")
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    assert_bad_input(run_inproc(*ARGS, "--out", str(other), cache=cache), "holds neither claims results nor a sweep")
    assert [p.name for p in other.iterdir()] == ["notes.txt"]


def test_claims_reuse_copies_a_sweeps_identical_run(tmp_path):
    """``--reuse SWEEP_DIR``: the run a compare sweep trained from exactly a claims run's resolved config is copied
    (same weights, not trained), the others are trained."""
    from tests.helpers import normlab

    cache = tmp_path / "cache"
    b = get_budget("tiny")
    lr = b.grid_lrs[0]
    base = variant_config("grid_pre", b, 0, lr)
    base.pop("seed")
    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump({"name": "one", "base": base, "seeds": [0]}))
    sweep_dir = tmp_path / "sweep"
    normlab("compare", str(f), "--out", str(sweep_dir), "--workers", "1", "--json", cache=cache, check=True)
    out = tmp_path / "claims"
    p = run_inproc("claims", "--budget", "tiny", "--seeds", "1", "--only", "zloss-logit-divergence", "--out",
                   str(out), "--reuse", str(sweep_dir), "--json", cache=cache, check=True)
    rep = json.loads(p.stdout)
    n = 2 * len(b.grid_lrs)
    assert rep["trained_runs"] == n - 1 and rep["reused_runs"] == 1, p.stderr
    assert "copied 1 of 1 run(s)" in p.stderr
    copied = Path(rep["claims"][0]["runs"][0]["grid_pre"][f"{lr:g}"])
    src = sweep_dir / "runs" / Store(sweep_dir / "results.sqlite").runs()[0]["run_id"]
    assert (copied / "model.safetensors").read_bytes() == (src / "model.safetensors").read_bytes()
    assert Store(out / "results.sqlite").get(copied.name)["train_calls"] == 0
    # the store orders the runs as the whole sweep does, not as the part trained first (report order, positions)
    assert sorted(r["position"] for r in Store(out / "results.sqlite").runs()) == list(range(n))


@pytest.mark.parametrize("inherited", [signal.SIG_DFL, signal.SIG_IGN], ids=["sigint-default", "sigint-ignored"])
def test_claims_ctrl_c_stops_resumably_and_measures_nothing(tmp_path, inherited):
    """SIGINT while the runs train: exit 130, a JSON status on stdout, no claims.json; the same command resumes.
    Also when the process starts with SIGINT ignored (as under a background shell, e.g. CI) and whether the signal
    lands during a run's training or between runs (the in-process runner installs its own handler)."""
    out, cache = tmp_path / "claims", tmp_path / "cache"
    proc = subprocess.Popen([sys.executable, "-m", "normlab.cli", *ARGS, "--out", str(out)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=cli_env(cache),
                            preexec_fn=lambda: signal.signal(signal.SIGINT, inherited))
    deadline = time.time() + 300  # a loaded machine can take a while to start the first worker
    while time.time() < deadline and proc.poll() is None and not list((out / "logs").glob("*.log")):
        time.sleep(0.05)
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr[-2000:]
    assert json.loads(stdout)["status"] == "interrupted" and "Re-run the same command" in json.loads(stdout)["error"]
    assert not (out / "claims.json").exists()
    rows = Store(out / "results.sqlite").runs()
    assert any(r["status"] != "completed" for r in rows) or len(rows) < 2
    again = run_inproc(*ARGS, "--out", str(out), cache=cache, check=True)
    rep = json.loads(again.stdout)
    assert rep["claims"][0]["n"] == 1 and (out / "claims.json").is_file()
    assert all(r["status"] == "completed" for r in Store(out / "results.sqlite").runs())

