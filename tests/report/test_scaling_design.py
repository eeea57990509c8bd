"""Confound detection of a size sweep's design (normlab.report.scaling_design) on three designs."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from normlab.report.scaling_design import TOKENS_PER_PARAM_LEVEL, confound_text, confounds


@dataclass
class P:
    width: int
    depth: int
    params: int
    tokens: int
    lr: float
    lrs_tried: int = 1


def _n(w: int, d: int) -> int:
    return 12 * w * w * d   # attention + MLP weights per block: the non-embedding count's leading term


def kinds(points, **kw) -> list[str]:
    return [c["kind"] for c in confounds(points, **kw)]


def test_the_old_scaling_preset_has_all_three_confounds():
    # widths 32-192 at aspect 32 (depth 1-6), one lr 3e-3, the same 409,600 tokens at every size
    pts = [P(w, max(1, round(w / 32)), _n(w, max(1, round(w / 32))), 409_600, 3e-3) for w in (32, 64, 96, 128, 192)]
    found = confounds(pts, lr_rule="fixed: the same train.lr at every size")
    assert [c["kind"] for c in found] == ["depth_with_width", "one_lr", "low_tokens_per_param",
                                          "tokens_per_param_varies"]
    by = {c["kind"]: c for c in found}
    assert by["depth_with_width"]["depths"] == [1, 2, 3, 4, 6]
    assert by["one_lr"]["lr"] == 3e-3
    assert by["low_tokens_per_param"]["min"] == pytest.approx(409_600 / _n(192, 6))
    assert by["tokens_per_param_varies"]["max"] / by["tokens_per_param_varies"]["min"] == pytest.approx(
        _n(192, 6) / _n(32, 1))
    assert confound_text(found).startswith("confounded with size: depth varies with width (1-6 blocks")


def test_fixed_depth_best_of_grid_constant_tokens_per_param_keeps_only_the_stated_level():
    # the redesigned preset: depth 4, lr best-of-grid (3 rates per cell), 2 tokens per parameter everywhere
    pts = [P(w, 4, _n(w, 4), 2 * _n(w, 4), 3e-3, lrs_tried=3) for w in (32, 48, 64, 96)]
    assert kinds(pts, lr_rule="best-of-grid: ...") == ["low_tokens_per_param"]
    # at the compute-optimal ratio nothing is confounded
    pts = [P(w, 4, _n(w, 4), int(TOKENS_PER_PARAM_LEVEL * _n(w, 4)), 3e-3, lrs_tried=3) for w in (32, 48, 64, 96)]
    assert kinds(pts) == [] and confound_text([]) == ""


def test_one_learning_rate_is_a_confound_unless_transferred_per_width():
    # fixed depth and 20 tokens per parameter, but one lr: only the learning rate is named
    pts = [P(w, 4, _n(w, 4), 20 * _n(w, 4), 1e-2) for w in (32, 64, 128)]
    assert kinds(pts) == ["one_lr"]
    # lr_transfer gives each width its own rate: not one fixed rate
    moved = [P(w, 4, _n(w, 4), 20 * _n(w, 4), 1e-2 * 32 / w) for w in (32, 64, 128)]
    assert kinds(moved, lr_rule="transferred: train.lr x (32 / width)^1") == []
    # depth varying at one width (a depth sweep) is not 'depth with width'
    deep = [P(64, d, _n(64, d), 20 * _n(64, d), 1e-2, 3) for d in (2, 4, 8)]
    assert kinds(deep) == []


def test_the_scaling_preset_is_confounded_only_by_its_stated_tokens_per_parameter():
    """The redesigned preset: fixed depth, a learning-rate grid per size, the same tokens per parameter; its
    design (the sweep's expanded runs, N counted on the meta device) names only the stated low ratio."""
    from normlab.experiments.sizes import count_params, run_tokens
    from normlab.experiments.sweep import load_sweep

    sweep = load_sweep(preset="scaling")
    cells: dict[tuple, P] = {}
    lrs: dict[tuple, set] = {}
    for r in sweep.runs:
        m, lr = r.config["model"], r.config["train"]["lr"]
        key = (m["placement"], m["width"])
        lrs.setdefault(key, set()).add(lr)
        if key not in cells:
            cells[key] = P(m["width"], m["depth"], count_params(r.config), run_tokens(r.config), lr)
    for key, p in cells.items():
        p.lrs_tried = len(lrs[key])
    found = confounds(cells.values(), lr_rule="best-of-grid")
    assert [c["kind"] for c in found] == ["low_tokens_per_param"]
    assert found[0]["min"] == pytest.approx(2.0, rel=0.02) and found[0]["max"] == pytest.approx(2.0, rel=0.02)
    assert {p.depth for p in cells.values()} == {4} and {p.lrs_tried for p in cells.values()} == {3}
