"""normlab.report.equal_flops: comparisons at equal steps and at equal training FLOPs against hand-computed
interpolations, a flipped verdict flagged, and the report's section."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from normlab.report import equal_flops as E
from normlab.report.document import section_html, section_md


def _run(fpt: float, tokens_per_step: int, pts, seed=0, variant="A"):
    step = pts[-1][0]
    return SimpleNamespace(curves={"val_bpb": list(pts)}, row={"variant": variant, "seed": seed, "status": "completed"},
                           summary={"step": step, "tokens_seen": step * tokens_per_step, "flops_per_token": fpt})


def test_equal_flops_reads_each_curve_at_the_common_cumulative_flops():
    a = _run(2.0, 1, [(10, 3.0), (20, 2.0)])  # twice the FLOPs per token
    b = _run(1.0, 1, [(10, 3.5), (20, 2.5)])
    r = E.equal_compute(a, b)
    assert r["step"] == 20 and r["steps_diff"] == pytest.approx(-0.5)
    # common FLOPs = min(20 * 2, 20 * 1) = 20: a at step 10 (3.0), b at step 20 (2.5)
    assert r["flops"] == 20 and r["flops_diff"] == pytest.approx(0.5)
    c = _run(1.5, 1, [(10, 3.0), (20, 2.0)])  # final 30 FLOPs; b's 20 lies between c's steps 10 (15) and 20 (30)
    assert E.equal_compute(c, b)["flops_diff"] == pytest.approx(3.0 + (2.0 - 3.0) * (20 - 15) / 15 - 2.5)
    no_flops = _run(1.0, 1, [(10, 3.5), (20, 2.5)])
    no_flops.summary.pop("flops_per_token")
    assert E.equal_compute(a, no_flops) is None and E.equal_compute(a, no_flops, lambda info: 1.0) == r


def flipping_runs():
    """3 seeds: "costly" (2x FLOPs/token) is lower at equal steps and higher at equal FLOPs than "cheap"."""
    runs = []
    for s, (da, db) in enumerate([(0.0, 0.0), (0.02, -0.01), (-0.01, 0.01)]):
        runs.append(_run(2.0, 1, [(10, 3.0 + da), (20, 2.0 + da)], s, "costly"))
        runs.append(_run(1.0, 1, [(10, 3.5 + db), (20, 2.5 + db)], s, "cheap"))
    return runs


def test_a_verdict_that_flips_at_equal_flops_is_flagged():
    out = E.compare_runs(flipping_runs(), "cheap")["comparisons"]
    assert [c["variant"] for c in out] == ["costly"] and out[0]["n"] == 3
    assert out[0]["equal_steps"]["diff"] == pytest.approx(-0.5 + (0.0 + 0.03 - 0.02) / 3)
    assert out[0]["equal_steps"]["reading"] == "lower" and out[0]["equal_flops"]["reading"] == "higher"
    assert out[0]["changed"]


def test_report_section_shows_the_flip():
    rep = SimpleNamespace(runs=flipping_runs(), grid=SimpleNamespace(baseline="cheap"))
    (section,) = E.sections(rep)
    text = "\n".join(section_md(section))
    assert "## At equal FLOPs" in text and "| costly | 3 |" in text and "| yes |" in text
    assert "<h2>At equal FLOPs</h2>" in section_html(section)
    assert E.sections(SimpleNamespace(runs=flipping_runs()[:1], grid=None)) == []
