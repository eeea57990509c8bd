"""Learning-rate grids (normlab.experiments.grid, ``lr_grid:`` in sweep files): expansion, log spacing, crossing
with variants and seeds, bad input."""

from __future__ import annotations

import math

import pytest

from normlab.errors import NormlabError
from normlab.experiments.sweep import parse_sweep
from normlab.experiments.grid import expand_grid, log_grid, round_sig


def test_log_spacing_closed_form():
    # 1e-3 .. 1e-1 in 5 points: 10^(-3 + i/2), rounded to 3 significant digits
    assert expand_grid({"min": 1e-3, "max": 1e-1, "points": 5}) == [0.001, 0.00316, 0.01, 0.0316, 0.1]
    # the paper's range 3e-4 .. 3e-1 in 4 points: ratio 10 between neighbours
    assert expand_grid({"min": 3e-4, "max": 3e-1, "points": 4}) == [0.0003, 0.003, 0.03, 0.3]
    g = log_grid(2.0, 50.0, 7, digits=12)
    ratios = [b / a for a, b in zip(g, g[1:])]
    assert all(math.isclose(r, 25 ** (1 / 6), rel_tol=1e-9) for r in ratios)
    assert expand_grid({"min": 0.01, "max": 0.01, "points": 1}) == [0.01]
    assert round_sig(0.0031622776) == 0.00316 and round_sig(123456.0, 2) == 120000.0
    # a list is taken as given; integer grids (model sizes) round and drop duplicates
    assert expand_grid([0.1, 0.003]) == [0.1, 0.003]
    assert expand_grid({"min": 64, "max": 512, "points": 4}, integer=True) == [64, 128, 256, 512]
    assert expand_grid({"min": 1, "max": 2, "points": 4}, integer=True) == [1, 2]


@pytest.mark.parametrize("spec, fragment", [
    ({"min": 1e-3, "max": 1e-1}, "missing points"),
    ({"min": 1e-3, "max": 1e-1, "points": 0}, "points must be an integer in [1, 1000]"),
    ({"min": 1e-1, "max": 1e-3, "points": 3}, "must be >= min"),
    ({"min": 0, "max": 1e-3, "points": 3}, "min must be a number > 0"),
    ({"min": 1e-3, "max": 1e-1, "points": 3, "step": 2}, "unknown key 'step'"),
    ({"min": 1e-3, "max": 1e-3, "points": 3}, "gives one value"),
    ([], "is empty"),
    ([0.1, -1], "value must be a number > 0"),
    ([0.1, 0.1], "duplicate"),
    ("1e-3", "must be {min"),
])
def test_bad_grid_specs(spec, fragment):
    with pytest.raises(NormlabError, match=None) as e:
        expand_grid(spec)
    assert fragment in str(e.value) and "\n" not in str(e.value)


def test_lr_grid_crossed_with_variants_and_seeds():
    sweep = parse_sweep({
        "name": "g", "base": "tiny", "lr_grid": {"min": 1e-3, "max": 1e-1, "points": 3},
        "variants": [{"name": "Post-LN", "set": {"model.placement": "post"}},
                     {"name": "Pre-LN", "set": {"model.placement": "pre"}}],
        "seeds": [0, 1],
    })
    assert sweep.lr_grid == [0.001, 0.01, 0.1] and sweep.spec["lr_grid"] == [0.001, 0.01, 0.1]
    assert len(sweep.runs) == 2 * 3 * 2 and len({r.run_id for r in sweep.runs}) == 12
    assert sweep.variants == ["Post-LN · lr=0.001", "Post-LN · lr=0.01", "Post-LN · lr=0.1",
                              "Pre-LN · lr=0.001", "Pre-LN · lr=0.01", "Pre-LN · lr=0.1"]
    for r in sweep.runs:
        assert r.config["train"]["lr"] == r.axes["train.lr"] and r.axes["grid_group"] == r.axes["variant"]
        assert r.config["model"]["placement"] == {"Post-LN": "post", "Pre-LN": "pre"}[r.axes["variant"]]
    cells = {(r.axes["grid_group"], r.axes["train.lr"], r.seed) for r in sweep.runs}
    assert len(cells) == 12
    # with another axis, the group keeps it and drops only the learning rate
    s2 = parse_sweep({"base": "tiny", "axes": {"model.depth": [1, 2]}, "lr_grid": [0.01, 0.03]})
    assert [r.axes["grid_group"] for r in s2.runs] == ["depth=1", "depth=1", "depth=2", "depth=2"]
    # a sweep without lr_grid keeps its hash and has no grid keys
    plain = parse_sweep({"base": "tiny", "seeds": [0]})
    assert plain.lr_grid is None and "lr_grid" not in plain.spec and "grid_group" not in plain.runs[0].axes


@pytest.mark.parametrize("extra", [{"set": {"train.lr": 0.01}}, {"axes": {"train.lr": [0.01, 0.1]}},
                                   {"variants": [{"name": "A", "set": {"train.lr": 0.01}}]}])
def test_lr_grid_conflicts_with_a_fixed_lr(extra):
    with pytest.raises(NormlabError, match="lr_grid already sweeps it"):
        parse_sweep({"base": "tiny", "lr_grid": [0.01, 0.1], **extra})


def test_baseline_must_name_a_variant():
    spec = {"base": "tiny", "lr_grid": [0.01, 0.1], "variants": [{"name": "A", "set": {"model.placement": "pre"}},
                                                                {"name": "B", "set": {"model.placement": "post"}}]}
    assert parse_sweep({**spec, "baseline": "B"}).spec["baseline"] == "B"
    with pytest.raises(NormlabError, match="baseline 'C' is not a variant"):
        parse_sweep({**spec, "baseline": "C"})


def test_demo_preset_is_a_grid_reaching_the_unstable_region():
    from normlab.experiments.sweep import list_presets, load_sweep

    quick = load_sweep(preset="quick")
    groups = {r.axes["grid_group"] for r in quick.runs}
    assert len(groups) == 4 and quick.spec["baseline"] in groups
    assert quick.lr_grid[0] <= 1e-3 and quick.lr_grid[-1] >= 0.3  # the paper's range reaches 3e-1
    assert {r.config["model"]["depth"] for r in quick.runs} == {6}
    assert sorted({r.seed for r in quick.runs}) == [1000, 1001, 1002, 1003]
    assert len(quick.runs) == len(groups) * len(quick.lr_grid) * 4
    assert "quick-1lr" in list_presets() and load_sweep(preset="quick-1lr").lr_grid is None
