"""Calibration metrics against hand-computed values (ECE: Guo et al. 2017, 15 bins; Brier; NLL), temperature
scaling recovering a known temperature, and ``normlab calibrate`` / ``normlab generate`` end to end."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from normlab.eval.calibration import calibration_stats, fit_temperature, reliability_diagram
from tests.helpers import assert_bad_input, run_inproc as normlab

SHORT = ["--set", "train.steps=4", "--set", "train.eval_every=4", "--set", "train.checkpoint_every=4",
         "--set", "train.eval_batches=1"]
_SHARED: dict[str, tuple[Path, Path]] = {}


pytestmark = pytest.mark.usefixtures("one_thread")


def tiny_run(tmp_path_factory) -> tuple[Path, Path]:
    """One short ``tiny`` run shared by the calibration, extrapolation and generation CLI tests: (run_dir, cache)."""
    if "tiny" not in _SHARED:
        cache = tmp_path_factory.mktemp("cache")
        out = tmp_path_factory.mktemp("runs") / "tiny"
        normlab("train", "tiny", *SHORT, "--out", str(out), cache=cache, check=True)
        _SHARED["tiny"] = (out, cache)
    return _SHARED["tiny"]


def hand_example():
    # (probabilities, target): confidences .9 (right), .9 (wrong), .7 (right), .62 (right)
    probs = torch.tensor([[0.9, 0.1], [0.9, 0.1], [0.3, 0.7], [0.62, 0.38]], dtype=torch.float64)
    return probs.log(), torch.tensor([0, 1, 1, 0])


def test_ece_nll_brier_hand_example():
    z, y = hand_example()
    s = calibration_stats(z, y)
    # bins of width 1/15: .9 -> (13/15, 14/15], .7 -> (10/15, 11/15], .62 -> (9/15, 10/15]
    # ECE = 2/4 |0.5 - 0.9| + 1/4 |1 - 0.7| + 1/4 |1 - 0.62| = 0.2 + 0.075 + 0.095
    assert s["ece"] == pytest.approx(0.37, abs=1e-9)
    assert s["nll"] == pytest.approx(-(math.log(0.9) + math.log(0.1) + math.log(0.7) + math.log(0.62)) / 4)
    # Brier: (.1^2 + .1^2) + (.9^2 + .9^2) + (.3^2 + .3^2) + (.38^2 + .38^2), mean over the 4 tokens
    assert s["brier"] == pytest.approx((0.02 + 1.62 + 0.18 + 0.2888) / 4)
    assert s["accuracy"] == 0.75
    counts = [b["count"] for b in s["bins"]]
    assert len(counts) == 15 and counts[13] == 2 and counts[10] == 1 and counts[9] == 1 and sum(counts) == 4
    assert s["bins"][13]["accuracy"] == 0.5 and s["bins"][13]["confidence"] == pytest.approx(0.9)


def test_perfectly_calibrated_and_confident_cases():
    z = torch.tensor([[10.0, -10.0], [-10.0, 10.0]])
    s = calibration_stats(z, torch.tensor([0, 1]))
    assert s["ece"] == pytest.approx(0.0, abs=1e-8) and s["brier"] == pytest.approx(0.0, abs=1e-8)
    assert s["bins"][14]["count"] == 2  # confidence ~1 lands in the last bin (14/15, 1]


@pytest.mark.parametrize("t0", [0.5, 2.0])
def test_temperature_scaling_recovers_known_temperature(t0):
    g = torch.Generator().manual_seed(0)
    z = torch.randn(20000, 50, generator=g) * 3.0
    y = torch.multinomial(torch.softmax(z / t0, dim=-1), 1, generator=g).squeeze(1)
    t = fit_temperature(z, y)
    assert t == pytest.approx(t0, rel=0.03)
    # the fit is a minimum of the NLL: nearby temperatures are worse, and it beats T = 1

    def nll(temp):
        return calibration_stats(z, y, temp)["nll"]

    assert nll(t) <= min(nll(t * 1.05), nll(t / 1.05), nll(1.0))
    assert calibration_stats(z, y, t)["ece"] < calibration_stats(z, y, 1.0)["ece"]


def test_fit_temperature_float32_input_and_bounds():
    z = torch.tensor([[5.0, 0.0], [0.0, 5.0]], dtype=torch.float32)
    y = torch.tensor([0, 1])
    t = fit_temperature(z, y)  # always right: the NLL decreases as T -> 0 until it is 0 in float64
    assert 0.01 <= t < 0.5 and calibration_stats(z, y, t)["nll"] < 1e-12
    z = torch.tensor([[1.0, 0.0], [1.0, 0.0]])  # half right at any T: optimum T -> infinity, clamped to 100
    assert fit_temperature(z, y) == pytest.approx(100.0)


def test_reliability_png(tmp_path):
    z, y = hand_example()
    s = calibration_stats(z, y)
    path = tmp_path / "r.png"
    reliability_diagram(s, s, path, temperature=1.0, title="hand")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_temperature_that_raises_ece_says_so():
    """Issue 29 item 7. Fit half: overconfident logits (NLL wants T > 1); held-out half: exactly calibrated at
    T = 1 (two classes, confidence 0.8, right 80% of the time), so the fitted T raises its ECE from 0 (closed form)."""
    from normlab.eval.calibration import ece_note

    z_fit = torch.tensor([[3.0, 0.0]] * 10, dtype=torch.float64)
    y_fit = torch.tensor([0] * 7 + [1] * 3)
    p = 0.8
    z_held = torch.tensor([[math.log(p / (1 - p)), 0.0]] * 10, dtype=torch.float64)
    y_held = torch.tensor([0] * 8 + [1] * 2)
    t = fit_temperature(z_fit, y_fit)
    before, after = calibration_stats(z_held, y_held, 1.0), calibration_stats(z_held, y_held, t)
    assert t > 1 and before["ece"] == pytest.approx(0.0, abs=1e-12) and after["ece"] > 0.01
    note = ece_note(before, after, t)
    assert note.startswith(f"temperature scaling raised the held-out ECE (0.0000 -> {after['ece']:.4f})")
    assert "did not lower the held-out NLL" in note  # NLL at T = 1 is optimal on a calibrated half
    assert ece_note(after, before, 1.0) is None  # lowered: nothing to say


def test_calibrate_cli(tmp_path_factory):
    run, cache = tiny_run(tmp_path_factory)
    r = normlab("calibrate", str(run), "--max-tokens", "2000", "--json", cache=cache, check=True)
    m = json.loads(r.stdout)
    for k in ("ece_before", "ece_after", "temperature", "nll_before", "nll_after", "brier_before", "brier_after"):
        assert isinstance(m[k], float) and math.isfinite(m[k]), k
    assert m["fit_tokens"] == 1000 and m["eval_tokens"] == 1000 and m["temperature"] > 0
    assert m["nll_before"] == pytest.approx(m["nll_before"])
    assert json.loads((run / "calibration.json").read_text())["temperature"] == m["temperature"]
    assert (run / "reliability.png").read_bytes()[:4] == b"\x89PNG"
    assert ("ece_note" in m) == (m["ece_after"] > m["ece_before"])  # said exactly when scaling raised ECE
    assert_bad_input(normlab("calibrate", str(run), "--max-tokens", "1", cache=cache), "--max-tokens")
    assert_bad_input(normlab("calibrate", str(run / "nope"), cache=cache), "does not exist")


def test_generate_cli(tmp_path_factory):
    run, cache = tiny_run(tmp_path_factory)
    args = ["generate", str(run), "--prompt", "abc", "--max-new-tokens", "6", "--top-nsigma", "1.0", "--seed", "3"]
    m = json.loads(normlab(*args, "--json", cache=cache, check=True).stdout)
    assert m["prompt"] == "abc" and len(m["tokens"]) == 6 and m["seed"] == 3 and m["top_nsigma"] == 1.0
    assert bytes(m["tokens"]).decode("utf-8", errors="replace") == m["text"]  # bytes tokenizer: id == byte
    streamed = normlab(*args, cache=cache, check=True).stdout  # same seed: same tokens, streamed after the prompt
    assert streamed == "abc" + m["text"] + "\n"
    for bad, frag in [(["--top-p", "1.5"], "--top-p"), (["--temperature", "-1"], "--temperature"),
                      (["--max-new-tokens", "-3"], "--max-new-tokens"), (["--top-k", "0"], "--top-k"),
                      (["--top-k", "x"], "--top-k"), (["--min-p", "2"], "--min-p"), (["--prompt", ""], "--prompt")]:
        assert_bad_input(normlab("generate", str(run), "--prompt", "a", *bad, cache=cache), frag)
    assert_bad_input(normlab("generate", str(run / "nope"), "--prompt", "a", cache=cache), "does not exist")
