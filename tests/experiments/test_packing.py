"""Sweep packing (normlab.experiments.packing): candidate packings, the measured choice and its cache, one real
probe process, and the sweep throughput that compare reports."""

from __future__ import annotations

import json
import math

import pytest

from normlab.experiments import packing
from tests.helpers import normlab

TINY_CFG = {"data": {"source": "synthetic:markov?order=2&alphabet=16&length=300000&seed=0"},
            "model": {"context": 16, "width": 32, "depth": 1, "heads": 2}, "train": {"batch_size": 4}}


def test_candidates_fill_the_cores_without_more_workers_than_runs():
    assert packing.candidates(2, 14) == [(2, 1), (1, 2)]
    assert packing.candidates(4, 3) == [(2, 2), (1, 4)]
    assert packing.candidates(2, 1) == [(1, 2)]
    assert all(w * t == 6 for w, t in packing.candidates(6, 10))


def test_choice_is_the_measured_best_and_is_cached(tmp_path, monkeypatch):
    calls = []

    def fake(spec, packings):
        calls.append(packings)
        return {"2x1": 900.0, "1x2": 1200.0}

    monkeypatch.setattr(packing, "measure_packing", fake)
    assert packing.choose_packing(TINY_CFG, 5, 2, tmp_path, lambda s: None)[:2] == (1, 2)
    assert packing.choose_packing(TINY_CFG, 5, 2, tmp_path, lambda s: None) == (1, 2, {"2x1": 900.0, "1x2": 1200.0})
    assert len(calls) == 1, "the second sweep at the same shape re-measured instead of using the cache"
    other = json.loads(json.dumps(TINY_CFG))
    other["model"]["width"] = 64
    monkeypatch.setattr(packing, "measure_packing", lambda spec, p: {"2x1": 5.0, "1x2": 1.0})
    assert packing.choose_packing(other, 5, 2, tmp_path, lambda s: None)[:2] == (2, 1)  # another shape, measured
    assert packing.choose_packing(TINY_CFG, 1, 2, tmp_path, lambda s: None) == (1, 2, {})  # one run: nothing to pick


def test_probe_process_measures_training_steps(monkeypatch):
    monkeypatch.setattr(packing, "PROBE_S", 0.3)
    spec = packing._probe_spec(TINY_CFG)
    assert spec["seconds"] == 0.3 and spec["model"]["width"] == 32 and spec["batch_size"] == 4
    out = packing.measure_packing(spec, [(1, 1)])
    assert set(out) == {"1x1"} and math.isfinite(out["1x1"]) and out["1x1"] > 0


@pytest.mark.slow
def test_compare_reports_sweep_throughput(tmp_path, cache):
    sweep = tmp_path / "s.yaml"
    sweep.write_text("name: pack\nbase: tiny\nseeds: [0]\nset: {train.steps: 4, train.eval_every: 4, "
                     "train.eval_batches: 1, model.width: 32, model.context: 16, diag.every: 0}\n"
                     "variants:\n  - name: a\n  - name: b\n    set: {model.norm: rmsnorm}\n")
    r = normlab("compare", str(sweep), "--out", str(tmp_path / "out"), "--workers", "1", "--json", cache=cache)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    tokens = 2 * 4 * 8 * 16  # 2 runs x 4 steps x batch 8 x context 16
    runs = [json.loads(p.read_text()) for p in (tmp_path / "out" / "runs").glob("*/summary.json")]
    assert len(runs) == 2 and sum(s["tokens_seen"] for s in runs) == tokens
    # one worker runs them one after the other: the sweep is never faster than the runs' own training time
    assert 0 < res["sweep_tokens_per_s"] <= tokens / sum(s["elapsed_s"] for s in runs)
    assert res["packing"] == {} and res["workers"] == 1
