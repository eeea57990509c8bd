"""HIGGS grids and the linearity theorem (normlab.surgery.higgs), Norm Tweaking (normlab.surgery.norm_tweak) and
their ``normlab quantize`` flags: the Lloyd-Max levels against Max's published values and the centroid condition,
the HIGGS quantizer against its definition, the linearity check against a loss that is exactly linear, and Norm
Tweaking lowering the float-vs-quantized output error on its calibration set and a held-out one."""

from __future__ import annotations

import copy
import itertools
import json
import math

import pytest
import torch
from scipy import integrate
from scipy.stats import norm as normal

from normlab.model import ModelConfig, build_model
from normlab.surgery.higgs import higgs_quantize, linearity_check, lloyd_max, quantize_layers
from normlab.surgery.norm_tweak import dist_loss, norm_tweak, output_error
from normlab.surgery.quantize import quantized_linears, rtn
from normlab.surgery.rotate import sylvester
from tests.helpers import run_inproc

MAX_1960 = {1: [0.7979], 2: [0.4528, 1.5104], 3: [0.2451, 0.7560, 1.3440, 2.1520]}  # positive levels


@pytest.mark.parametrize("bits", [1, 2, 3])
def test_lloyd_max_levels_are_the_known_gaussian_ones(bits):
    levels = lloyd_max(bits)
    assert len(levels) == 2 ** bits
    assert levels[2 ** (bits - 1):] == pytest.approx(MAX_1960[bits], abs=1e-3)
    assert levels[: 2 ** (bits - 1)] == pytest.approx([-v for v in reversed(MAX_1960[bits])], abs=1e-3)
    # each level is the centroid of its cell (numerical integration, independent of the closed form used)
    t = [-math.inf] + [(a + b) / 2 for a, b in itertools.pairwise(levels)] + [math.inf]
    for i, y in enumerate(levels):
        mass = normal.cdf(t[i + 1]) - normal.cdf(t[i])
        mean = integrate.quad(lambda x: x * normal.pdf(x), t[i], t[i + 1])[0] / mass
        assert y == pytest.approx(mean, abs=1e-8)
    assert lloyd_max(1)[1] == pytest.approx(math.sqrt(2 / math.pi), abs=1e-10)


def test_higgs_quantizer_puts_the_rotated_scaled_groups_on_the_grid():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(6, 32, generator=g, dtype=torch.float64) * 0.05
    q = higgs_quantize(w, 3, group=16, seed=4)
    H = torch.from_numpy(sylvester(16)).double() / 4.0
    s = torch.randint(0, 2, (16,), generator=torch.Generator().manual_seed(4)).double() * 2 - 1
    levels = torch.tensor(lloyd_max(3), dtype=torch.float64)
    for grp in range(2):
        y = (w[:, grp * 16:(grp + 1) * 16] * s) @ H
        sigma = y.pow(2).mean(-1, keepdim=True).sqrt()
        yq = (q[:, grp * 16:(grp + 1) * 16] * s) @ H / sigma
        dist = (yq[..., None] - levels).abs().min(-1).values
        assert float(dist.max()) < 1e-10  # every rotated, scaled entry is a grid level
        want = levels[((y / sigma)[..., None] - levels).abs().argmin(-1)]  # and the nearest one
        torch.testing.assert_close(yq, want)
    # on Gaussian weights the MSE-optimal grid beats round-to-nearest at 3 bits
    big = torch.randn(64, 256, generator=g, dtype=torch.float64)
    assert (big - higgs_quantize(big, 3)).pow(2).mean() < (big - rtn(big, 3)).pow(2).mean()


def test_linearity_check_is_exact_for_a_loss_that_is_linear_in_the_relative_errors():
    torch.manual_seed(0)
    model = build_model(ModelConfig(vocab_size=20, context=8, width=16, depth=2, heads=2)).double()
    w0 = {n: m.weight.detach().clone() for n, m in quantized_linears(model).items()}
    c = {n: 0.5 + i for i, n in enumerate(w0)}

    def score(m):  # a "loss" exactly linear in each layer's relative squared error
        return sum(c[n] * float((lin.weight - w0[n]).pow(2).sum() / w0[n].pow(2).sum())
                   for n, lin in quantized_linears(m).items())

    out = linearity_check(model, score, (8, 4, 3), grid="higgs")
    assert out["coefficients"] == pytest.approx(c, rel=1e-9)
    for row in out["rows"]:
        assert row["predicted"] == pytest.approx(row["measured"], rel=1e-9)
    assert out["rows"][0]["measured"] < out["rows"][1]["measured"] < out["rows"][2]["measured"]


def test_dist_loss_is_the_channelwise_mean_and_variance_distance():
    g = torch.Generator().manual_seed(0)
    f, q = torch.randn(7, 3, generator=g, dtype=torch.float64), torch.randn(7, 3, generator=g, dtype=torch.float64)
    want = sum(abs(float(f[:, c].mean() - q[:, c].mean())) + abs(float(f[:, c].var(unbiased=False)
                                                                     - q[:, c].var(unbiased=False)))
               for c in range(3)) / 3
    assert float(dist_loss(f, q)) == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("grid", ["rtn", "higgs"])
def test_norm_tweak_lowers_the_output_error_on_calibration_and_held_out_data(grid):
    torch.manual_seed(0)
    f = build_model(ModelConfig(vocab_size=40, context=16, width=32, depth=2, heads=2, init_std=0.1)).eval()
    g = torch.Generator().manual_seed(10)
    calib, held = torch.randint(0, 40, (16, 16), generator=g), torch.randint(0, 40, (16, 16), generator=g)
    q = copy.deepcopy(f)
    quantize_layers(q, 3, grid=grid)
    frozen = {n: p.detach().clone() for n, p in q.named_parameters()}
    before = output_error(f, q, calib), output_error(f, q, held)
    rep = norm_tweak(f, q, calib, lr=1e-3)
    after = output_error(f, q, calib), output_error(f, q, held)
    assert after[0] < before[0] and after[1] < before[1]
    assert all(b["loss_after"] < b["loss_before"] for b in rep["blocks"])
    changed = {n for n, p in q.named_parameters() if not torch.equal(p, frozen[n])}
    assert changed and all(".attn_in." in n or ".mlp_in." in n for n in changed)  # only the block norms moved


def test_quantize_cli_grid_tweak_and_linearity(tmp_path):
    cache = tmp_path / "cache"
    run = tmp_path / "run"
    run_inproc("train", "tiny", "--set", "train.steps=6", "--set", "train.eval_every=6", "--out", str(run),
               cache=cache, check=True)
    r = json.loads(run_inproc("quantize", str(run), "--weights", "4", "--grid", "higgs", "--norm-tweak",
                              "--tweak-samples", "4", "--linearity", "--max-tokens", "512", "--out",
                              str(tmp_path / "q"), "--json", cache=cache, check=True).stdout)
    assert r["grid"] == "higgs" and r["scheme"].startswith("HIGGS")
    assert r["norm_tweak"]["samples"] == 4 and set(r["norm_tweak"]["output_error"]) == {"calibration", "held_out"}
    assert [x["bits"] for x in r["linearity"]["rows"]] == [8, 4, 3]
    saved = json.loads((tmp_path / "q" / "quantization.json").read_text())
    assert saved["linearity"]["rows"] == r["linearity"]["rows"]
    bad = run_inproc("quantize", str(run), "--weights", "4", "--grid", "higgs", "--group", "48", "--out",
                     str(tmp_path / "q2"), cache=cache)
    assert bad.returncode == 2 and "power of two" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "q2").exists()


def test_quantize_table_keeps_whole_layer_names_at_80_columns(tmp_path, monkeypatch):
    """The per-layer table is as wide as its longest layer name needs (rich would cut names to fit an 80-column
    terminal), the scheme reads as English (no "input inputs"), and stderr names each stage as it starts."""
    cache = tmp_path / "cache"
    run = tmp_path / "run"
    run_inproc("train", "tiny", "--set", "train.steps=2", "--set", "train.eval_every=2", "--out", str(run),
               cache=cache, check=True)
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setattr("normlab.commands.stages.stages_visible", lambda: True)  # as on a terminal
    p = run_inproc("quantize", str(run), "--weights", "4", "--grid", "higgs", "--max-tokens", "128", "--out",
                   str(tmp_path / "q"), cache=cache, check=True)
    out = p.stdout
    stages = [ln.split("] ", 1)[1].rsplit(" (", 1)[0] for ln in p.stderr.splitlines() if ln.startswith("quantize [")]
    assert stages == ["scoring the float model", "quantizing the weights", "scoring the quantized model"], p.stderr
    names = list(json.loads((tmp_path / "q" / "quantization.json").read_text())["layers"])
    assert len(names) == 8 and all(f" {n} " in out for n in names), out
    assert "input inputs" not in " ".join(out.split()) and "divisor of the input size," in " ".join(out.split())
