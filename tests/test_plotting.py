"""normlab.plotting.quiet_drawing: warnings raised while a report's figures are drawn stay off the terminal."""

from __future__ import annotations

import warnings

from normlab.plotting import pyplot, quiet_drawing


def _empty_legend() -> None:
    """A real matplotlib warning: a legend on an axes with no labelled artist."""
    plt = pyplot()
    fig, ax = plt.subplots()
    ax.legend()
    plt.close(fig)


def test_a_drawing_warning_is_kept_off_the_terminal_and_others_are_not():
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        _empty_legend()
    assert any("No artists with labels" in str(w.message) for w in seen)  # it does warn unguarded
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with quiet_drawing():
            _empty_legend()
        warnings.warn("after the drawing", DeprecationWarning)
    assert [str(w.message) for w in seen] == ["after the drawing"]  # the guard ends with the drawing


def test_write_report_draws_quietly(tmp_path, monkeypatch, capfd):
    """``normlab report`` on a sweep whose figures warn: the report is written and stderr holds no warning."""
    from normlab.report import render
    from tests.helpers import run_inproc
    from tests.report_fakes import fake_grid

    (tmp_path / "s").mkdir()
    d = fake_grid(tmp_path / "s", ["A", "B"], [0, 1], [0.001, 0.01], lambda v, s, lr: 3.0 + s * 0.1 + lr)
    real = render.build

    def build(rep):
        _empty_legend()
        return real(rep)

    monkeypatch.setattr(render, "build", build)
    with warnings.catch_warnings(record=True) as seen:  # what would reach the terminal (pytest's capture aside)
        warnings.simplefilter("always")
        r = run_inproc("report", str(d), cache=tmp_path / "cache")
    assert r.returncode == 0, r.stderr
    assert (d / "report.html").is_file()
    assert not seen and "Warning" not in r.stderr + capfd.readouterr().err
