"""normlab.report.lrplots: what leaves the loss-vs-learning-rate range is marked on its edge, a signal that is the
same in every run is a sentence rather than a flat panel, and legends sit outside the data."""

from __future__ import annotations

import pytest

from normlab.report import lrplots, plots
from normlab.report.analysis import load
from tests.report_fakes import INIT, fake_grid


def _figures(monkeypatch):
    figs = []
    real = lrplots.png
    monkeypatch.setattr(lrplots, "png", lambda fig: figs.append(fig) or real(fig))
    return figs


@pytest.fixture()
def grid(tmp_path):
    """Post-LN collapses above its loss at initialisation at lr 0.1 (scored at L_init, far above the trained range)
    and diverges at 0.3 on seed 0; Pre-LN trains everywhere."""
    d = tmp_path / "s"
    d.mkdir()

    def final(v, s, lr):
        if v == "Post-LN" and lr == 0.1:
            return 20.0
        if v == "Post-LN" and lr == 0.3 and s == 0:
            return None
        return 3.5 + (0.2 if v == "Post-LN" else 0.0) + lr + 0.01 * s

    return fake_grid(d, ["Pre-LN", "Post-LN"], [0, 1], [0.001, 0.01, 0.1, 0.3], final)


def test_means_above_the_range_and_diverged_runs_are_marked_on_the_top_edge(grid, monkeypatch):
    rep = load(grid)
    gr = rep.grid
    cmap = plots.variant_colors(rep)
    figs = _figures(monkeypatch)
    lrplots.loss_vs_lr_png(gr, cmap)
    ax = figs[-1].axes[0]
    top = ax.get_ylim()[1]
    assert top < INIT  # the range is the trained losses', far below L_init
    post = next(g for g in gr.groups if g.name == "Post-LN")
    curve = post.mean_curve()
    above = sorted(lr for lr in curve if curve[lr][0] > top)
    assert above == [0.1, 0.3]  # the collapsed rate and the rate where one seed diverged (scored at L_init)
    marks = [c for c in ax.collections if c.get_offsets().shape[0] and not c.get_clip_on()]
    edge = sorted((float(x), float(y)) for c in marks for x, y in c.get_offsets())
    for lr in above:
        assert (lr, top) in edge  # on the edge, drawn unclipped
    assert "mean above the range" in ax.get_title() and "diverged" in ax.get_title()
    leg = ax.get_legend()
    assert leg.get_bbox_to_anchor().transformed(ax.transAxes.inverted()).x0 >= 1.0  # right of the data


def test_a_signal_the_same_in_every_run_is_a_sentence_not_a_panel(grid, monkeypatch):
    from normlab.report import lrsection
    from normlab.report.document import Note

    rep = load(grid)
    gr = rep.grid
    for g in gr.groups:
        for r in g.runs:
            r.curves["diag/softmax_collapse"] = [(5, 0.0), (10, 0.0)]
            r.curves["diag/output_lse"] = [(5, 5.0), (10, 5.0 + r.lr)]
    assert lrplots.flat_signals(gr) == {"softmax_collapse": 0.0}
    figs = _figures(monkeypatch)
    lrplots.signals_vs_lr_png(gr, plots.variant_colors(rep))
    titles = [ax.get_title() for ax in figs[-1].axes if ax.get_visible()]
    assert len(titles) == 1 and "logsumexp" in titles[0]
    (section,) = [s for s in lrsection.sections(gr, plots.variant_colors(rep)) if s.title == "Instability signals"]
    notes = [b.text for b in section.blocks if isinstance(b, Note)]
    assert any("Softmax Collapse" in n and ": 0" in n for n in notes), notes
