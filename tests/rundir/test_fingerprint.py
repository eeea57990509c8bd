"""normlab.rundir.fingerprint: what determines a run's numbers, recorded by every run and checked before a cached run
is reused (sweeps and claims retrain a run whose fingerprint changed, and say why); the initialisation the Peri-LN
growth metric rebuilds is the run's own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from tests.helpers import run_inproc

torch.set_num_threads(1)


class _Cfg:
    def identity_dict(self):
        return {"model": {"width": 4}}


class _AB(nn.Module):
    def __init__(self, first: str):
        super().__init__()
        for n in ((first, "b") if first == "a" else (first, "a")):
            setattr(self, n, nn.Linear(4, 4))


def test_fingerprint_changes_with_parameter_order_and_not_otherwise():
    from normlab.rundir.fingerprint import fingerprint_record

    torch.manual_seed(0)
    one = fingerprint_record(_Cfg(), _AB("a"))
    torch.manual_seed(1)
    same = fingerprint_record(_Cfg(), _AB("a"))  # other weights, same layout and config
    swapped = fingerprint_record(_Cfg(), _AB("b"))  # the same names and shapes, registered in the other order
    assert one["sha256"] == same["sha256"]
    assert swapped["sha256"] != one["sha256"]
    assert sorted((n, tuple(s)) for n, s in one["layout"]["parameters"]) == sorted(
        (n, tuple(s)) for n, s in swapped["layout"]["parameters"])


def _train_tiny(run_dir: Path) -> None:
    from normlab.config import load_config
    from normlab.train.loop import train

    cfg = load_config("tiny", ["train.steps=2", "train.eval_every=2", "train.checkpoint_every=2",
                               "train.eval_batches=1", "train.log_every=1"])
    train(cfg, run_dir, quiet=True)


def test_a_run_records_its_fingerprint_and_the_check_names_what_changed(tmp_path):
    from normlab.rundir.fingerprint import check_run

    run = tmp_path / "r"
    _train_tiny(run)
    rec = json.loads((run / "fingerprint.json").read_text())
    assert len(rec["sha256"]) == 64 and rec["torch"] == torch.__version__
    assert check_run(run) is None
    lay = rec["layout"]["parameters"]
    rec["layout"]["parameters"] = [lay[1], lay[0], *lay[2:]]
    rec["sha256"] = "0" * 64
    (run / "fingerprint.json").write_text(json.dumps(rec))
    assert check_run(run) == "model layout changed: parameters order changed"
    rec["torch"] = "1.0"
    (run / "fingerprint.json").write_text(json.dumps(rec))
    assert check_run(run).startswith("trained with torch 1.0")
    (run / "fingerprint.json").unlink()
    assert "no fingerprint" in check_run(run)


def test_initialisation_rebuilt_for_the_growth_metric_is_the_runs_own(tmp_path):
    """The Peri-LN growth metric compares a run with its own initialisation, rebuilt from config.yaml under the
    run's seed; the rebuilt model gives exactly the loss the training loop measured at step 0."""
    from normlab.model import build_model
    from normlab.rundir.readers import load_run
    from normlab.train.init_eval import initial_eval
    from normlab.rundir.readers import load_data

    run = tmp_path / "r"
    _train_tiny(run)
    cfg = load_run(run).cfg
    torch.manual_seed(cfg.seed)
    model = build_model(cfg.model)
    got = initial_eval(model, load_data(cfg), cfg)
    step0 = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    assert got["init_val_loss"] == pytest.approx(step0["init_val_loss"], abs=1e-6)


def test_claims_retrain_a_run_whose_fingerprint_changed_and_say_why(tmp_path):
    out, cache = tmp_path / "claims", tmp_path / "cache"
    first = run_inproc("claims", "--budget", "tiny", "--seeds", "1", "--only", "powernorm-lm", "--out", str(out),
                       "--json", cache=cache, check=True)
    fp = out / json.loads(first.stdout)["claims"][0]["runs"][0]["powernorm"] / "fingerprint.json"
    rec = json.loads(fp.read_text())
    rec["sha256"], rec["normlab"] = "0" * 64, "0.0.1"
    fp.write_text(json.dumps(rec))
    p = run_inproc("claims", "--budget", "tiny", "--seeds", "1", "--only", "powernorm-lm", "--out", str(out),
                   "--json", cache=cache, check=True)
    rep = json.loads(p.stdout)
    assert rep["trained_runs"] == 1 and rep["reused_runs"] == 1
    (why, names), = rep["retrained"].items()
    assert "normlab 0.0.1" in why and names == ["powernorm/seed0"]
    assert "retraining 1 run(s)" in p.stderr


def test_sweep_retrains_a_finished_run_whose_fingerprint_changed_and_keeps_the_old_one(tmp_path):
    from types import SimpleNamespace

    from normlab.experiments.sweepdir import _refingerprint

    sweep_dir = tmp_path / "sweep"
    _train_tiny(sweep_dir / "runs" / "a")
    sweep = SimpleNamespace(runs=[SimpleNamespace(run_id="a")])
    logs: list[str] = []
    assert _refingerprint(sweep, sweep_dir, {"a": {"status": "completed"}}, logs.append) == [] and logs == []
    fp = sweep_dir / "runs" / "a" / "fingerprint.json"
    rec = json.loads(fp.read_text())
    rec["sha256"], rec["torch"] = "0" * 64, "0.1"
    fp.write_text(json.dumps(rec))
    assert _refingerprint(sweep, sweep_dir, {"a": {"status": "completed"}}, logs.append) == sweep.runs
    assert not (sweep_dir / "runs" / "a").exists() and (sweep_dir / "stale" / "a-0" / "model.safetensors").is_file()
    assert "trained with torch 0.1" in logs[0]
