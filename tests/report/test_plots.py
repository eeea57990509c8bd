"""normlab.report.plots: one colour per variant in every panel (a grid's learning-rate cells in their variant's
colour), a labelled dot plot where runs have too few evaluations for a curve, legends outside the data."""

from __future__ import annotations

import random

import pytest

from normlab.report import plots
from normlab.report.analysis import load
from tests.report_fakes import fake_grid

VARIANTS = ["Pre-LN", "Peri-LN", "Pre-LN + QK-norm", "Post-LN"]


@pytest.fixture()
def grid(tmp_path):
    rng = random.Random(0)
    d = tmp_path / "s"
    d.mkdir()
    return fake_grid(d, VARIANTS, [0, 1], [0.001, 0.01, 0.1],
                     lambda v, s, lr: 3.5 + VARIANTS.index(v) * 0.1 + lr + rng.random() * 0.05)


def _figures(monkeypatch):
    """Every matplotlib Figure the report draws, in order (the PNG writer wrapped)."""
    import normlab.report.lrplots as lrplots

    figs = []
    for mod in (plots, lrplots):
        real = mod.png
        monkeypatch.setattr(mod, "png", lambda fig, real=real: figs.append(fig) or real(fig))
    return figs


def test_each_variant_has_one_colour_in_every_panel(grid, monkeypatch):
    from matplotlib.colors import to_hex

    from normlab.report import write_report

    rep = load(grid)
    cmap = plots.variant_colors(rep)
    assert len({to_hex(cmap[v]) for v in VARIANTS}) == len(VARIANTS)  # distinct per variant
    for r in rep.runs:  # every learning-rate cell in its variant's colour
        assert to_hex(cmap[r.row["variant"]]) == to_hex(cmap[r.row["axes"]["grid_group"]])
    figs = _figures(monkeypatch)
    write_report(grid)
    seen: dict[str, set[str]] = {}
    for fig in figs:
        for ax in fig.axes:
            for ln in ax.get_lines():
                name = ln.get_label().split(" (")[0]
                if name in VARIANTS:
                    seen.setdefault(name, set()).add(to_hex(ln.get_color()))
    assert set(seen) == set(VARIANTS)
    assert all(len(c) == 1 and c == {to_hex(cmap[v])} for v, c in seen.items()), seen


def test_too_few_evaluations_give_a_labelled_dot_plot_and_enough_give_curves(grid, monkeypatch, tmp_path):
    rep = load(grid)  # one evaluation per run
    figs = _figures(monkeypatch)
    plots.curves_png(rep, plots.variant_colors(rep))
    ax = figs[-1].axes[0]
    assert ax.get_title().startswith("validation bits/byte: 1 evaluation per run, no curve")
    assert [t.get_text() for t in ax.get_yticklabels()][::-1] == [v.name for v in rep.variants]
    assert not ax.get_lines() and ax.get_legend() is None  # rows are labelled: no legend
    for r in rep.runs:  # three evaluations: curves
        r.curves["val_bpb"] = [(1, 5.0), (5, 4.5), (10, r.curves["val_bpb"][-1][1])]
        r.curves["loss"] = [(1, 3.0), (5, 2.5), (10, 2.4)]
    plots.curves_png(rep, plots.variant_colors(rep))
    ax_v, ax_t = figs[-1].axes[:2]
    assert ax_v.get_title().startswith("validation bits/byte (mean") and len(ax_v.get_lines()) == len(rep.variants)
    leg = ax_t.get_legend()  # one entry per variant, to the right of the last panel
    assert [t.get_text() for t in leg.get_texts()] == [f"{v} (3 learning rates)" for v in VARIANTS]
    assert leg.get_bbox_to_anchor().transformed(ax_t.transAxes.inverted()).x0 >= 1.0


def _old_band(runs_pts):
    """The list / dict implementation the arrays replaced, as it was."""
    common = sorted(set.intersection(*({s for s, _ in pts} for pts in runs_pts)))
    maps = [dict(pts) for pts in runs_pts]
    vals = [[m[s] for m in maps] for s in common]
    return common, [sum(v) / len(v) for v in vals], [min(v) for v in vals], [max(v) for v in vals]


def test_band_equals_the_list_implementation():
    from normlab.rundir.curves import Curve

    rng = random.Random(1)
    for trial in range(10):
        runs = []
        for _ in range(rng.randint(1, 4)):
            pts = [(s, rng.random()) for s in sorted(rng.sample(range(300), 200))]
            runs.append(Curve(pts) if trial % 2 else pts)
        got = plots._band(runs)
        want = _old_band(runs)
        assert got[0].tolist() == want[0] and got[2].tolist() == want[2] and got[3].tolist() == want[3]
        assert got[1].tolist() == pytest.approx(want[1], rel=1e-15)


def test_thinning_keeps_every_buckets_extremes():
    """A curve of more than 4 x PLOT_BUCKETS points is drawn through each bucket's first, last, least and greatest
    points: the drawn line reaches every bucket's minimum and maximum, so the figure shows the same range."""
    import numpy as np

    rng = np.random.default_rng(0)
    n = 100_003
    steps = np.arange(n)
    y = rng.normal(size=n)
    y[5000] = np.nan
    at = plots._thin(steps, y)
    assert plots._thin(steps[:4 * plots.PLOT_BUCKETS], y[:4 * plots.PLOT_BUCKETS]) == slice(None)
    assert len(at) <= 4 * plots.PLOT_BUCKETS and np.all(np.diff(at) > 0) and at[0] == 0 and at[-1] == n - 1
    size = -(-n // plots.PLOT_BUCKETS)
    kept = np.zeros(n, dtype=bool)
    kept[at] = True
    for start in range(0, n, size):
        block, mask = y[start:start + size], kept[start:start + size]
        assert np.nanmin(block[mask]) == np.nanmin(block) and np.nanmax(block[mask]) == np.nanmax(block)
