"""normlab.experiments.estimate: a CUDA sweep on a machine without CUDA is refused in one line with its estimated
time; the ``scale`` preset asks ``quick``'s declared question at a larger scale."""

from __future__ import annotations

from pathlib import Path

import pytest

from normlab.errors import NormlabError
from normlab.experiments import estimate as E
from normlab.experiments.sweep import load_sweep
from tests.helpers import assert_bad_input, run_inproc


def test_the_scale_preset_asks_quicks_question_at_scale():
    scale, quick = load_sweep(preset="scale"), load_sweep(preset="quick")
    for key in ("baseline", "primary", "family", "alpha", "correction", "lr_grid", "variants"):
        assert scale.spec[key] == quick.spec[key], key
    m, t = scale.runs[0].config["model"], scale.runs[0].config["train"]
    assert m["depth"] == 12 and 256 <= m["width"] <= 384 and m["context"] == 256 and t["steps"] >= 2000
    seeds = {r.seed for r in scale.runs}
    assert len(seeds) >= 8 and not seeds & {r.seed for r in quick.runs}  # (all blocks: tests/experiments/test_sweep.py)
    assert {r.config["device"] for r in scale.runs} == {"cuda"}


def test_a_cuda_sweep_without_cuda_is_refused_with_its_estimate(monkeypatch):
    """The estimate is steps x (6 N + 12 L d T) x tokens per step summed over runs, over the given rate; written out
    here from the model's shape (N: the matrices of the blocks and the head) as an independent check."""
    monkeypatch.setattr(E, "cuda_present", lambda: False)
    cfg = {"device": "cuda", "model": {"width": 64, "depth": 2, "context": 32, "heads": 2, "vocab_size": 256},
           "train": {"steps": 100, "batch_size": 4}}
    from normlab.config import config_from_dict

    c = config_from_dict(cfg)
    d, L, T, V = 64, 2, 32, c.model.vocab_size
    hidden = c.model.mlp_hidden or int(c.model.mlp_ratio * d)
    n = L * (4 * d * d + 2 * d * hidden) + d * V
    by_hand = 100 * (6 * n + 12 * L * d * T) * 4 * 32
    assert E.sweep_flops([cfg, cfg]) == pytest.approx(2 * by_hand, rel=1e-9)
    with pytest.raises(NormlabError) as e:
        E.check_device("s", [cfg, {**cfg, "device": "cpu"}], rate=2 * by_hand / 7200)
    msg = str(e.value)
    assert "\n" not in msg and "device: cuda (1 of 2 runs)" in msg and "at least 2 h 0 min" in msg
    assert "GFLOP/s" in msg and "6N + 12LdT" in msg
    E.check_device("s", [{**cfg, "device": "cpu"}])  # no CUDA run: nothing to refuse
    monkeypatch.setattr(E, "cuda_present", lambda: True)
    E.check_device("s", [cfg])  # a CUDA device: no refusal


def test_human_time_and_the_matmul_rate():
    assert [E.human_time(s) for s in (20, 45 * 60, 3 * 3600 + 20 * 60, 50 * 3600)] == [
        "1 min", "45 min", "3 h 20 min", "2 d 2 h"]
    assert 1e6 < E.matmul_rate(seconds=0.05, n=64) < 1e15


@pytest.mark.skipif(any(Path("/dev").glob("nvidia[0-9]*")), reason="this machine may have a CUDA device")
def test_compare_preset_scale_refuses_on_a_cpu_only_machine(tmp_path, cache):
    out = tmp_path / "scale"
    proc = run_inproc("compare", "--preset", "scale", "--out", str(out), cache=cache)
    assert_bad_input(proc, "sweep 'scale' asks for device: cuda", "would take at least", "GFLOP/s")
    assert not out.exists()
