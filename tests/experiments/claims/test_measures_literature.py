"""The seed-literature claims (issue 31; normlab.experiments.claims.measures_literature) end to end at the tiny
budget: every claim gets a verdict, and the per-seed values are what the run directories say (summary.json,
metrics.jsonl), recomputed here independently."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from normlab.decide.vocab import CLAIM_VERDICTS, NOT_DECIDED_DNL, NOT_OBSERVABLE
from tests.helpers import run_inproc

NAMES = ("adagc-lr-sensitivity,adagc-spikes,stablemax-collapse,tev-instability,transnormer-vs-linear,"
         "residual-sink-clipping,higgs-w3,norm-tweak-w3,linearity-w4")


def last(run: Path, key: str) -> float | None:
    vals = [(r["step"], r[key]) for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
            if key in r]
    return max(vals)[1] if vals else None


@pytest.mark.slow
def test_literature_claims_tiny_end_to_end(tmp_path):
    out = tmp_path / "claims"
    p = run_inproc("claims", "--budget", "tiny", "--only", NAMES, "--out", str(out), "--json",
                   cache=tmp_path / "cache", check=True)
    rep = {c["name"]: c for c in json.loads(p.stdout)["claims"]}
    assert set(rep) == set(NAMES.split(","))
    assert all(c["verdict"] in (*CLAIM_VERDICTS, NOT_DECIDED_DNL) for c in rep.values())
    for name, key in (("stablemax-collapse", "collapse_softmax"), ("residual-sink-clipping", "max_rms_share")):
        absent = all(d[key] == 0 for d in rep[name]["details"])  # the observability rule's details key
        if rep[name]["verdict"] != NOT_DECIDED_DNL:  # the guard comes first: a model that did not learn
            assert (rep[name]["verdict"] == NOT_OBSERVABLE) == absent
    summary = lambda d: json.loads((out / d / "summary.json").read_text())  # noqa: E731
    for seed, runs in enumerate(rep["transnormer-vs-linear"]["runs"]):
        want = summary(runs["linear"])["val_bpb"] - summary(runs["transnormer"])["val_bpb"]
        assert rep["transnormer-vs-linear"]["values"][seed] == pytest.approx(want, abs=1e-12)
    for seed, runs in enumerate(rep["adagc-spikes"]["runs"]):
        count = lambda v: sum(summary(d)["loss_spikes"]["count"] for d in runs[v].values())  # noqa: E731
        assert rep["adagc-spikes"]["values"][seed] == count("grid_pre") - count("grid_pre_adagc")
        assert all(summary(d).get("adagc_clipped") is not None for d in runs["grid_pre_adagc"].values()
                   if summary(d)["status"] == "completed")
    for seed, runs in enumerate(rep["stablemax-collapse"]["runs"]):
        top = max(runs["grid_pre"], key=float)
        want = (last(out / runs["grid_pre"][top], "diag/softmax_collapse")
                - last(out / runs["grid_pre_stablemax"][top], "diag/softmax_collapse"))
        assert rep["stablemax-collapse"]["values"][seed] == pytest.approx(want, abs=1e-12)
    for seed, det in enumerate(rep["tev-instability"]["details"]):
        runs = rep["tev-instability"]["runs"][seed]["grid_pre"]
        top = max(runs, key=float)
        assert det["tev_top_lr"] == pytest.approx(last(out / runs[top], "diag/tev_mean"))
    for det in rep["norm-tweak-w3"]["details"]:
        assert set(det["output_error"]) == {"calibration", "held_out"}


def test_composite_gain_measure_reads_the_largest_last_gain_over_the_grid(tmp_path):
    """``composite_gain``: per variant the largest over the grid of the last recorded ``diag/hc_gain_fwd``, then
    ``log10(a) - log10(b)``; a grid without the diagnostic is None with a reason."""
    import math

    from normlab.experiments.claims.measure_registry import get_measure

    def run(name, pts):
        d = tmp_path / name
        d.mkdir()
        (d / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "diag/hc_gain_fwd": v}) + "\n"
                                                 for s, v in pts))
        return d

    runs = {"a": {0.01: run("a1", [(10, 50.0), (20, 3.0)]), 0.1: run("a2", [(10, 2.0), (20, 40.0)])},
            "b": {0.01: run("b1", [(10, 1.0), (20, 1.0)]), 0.1: run("b2", [(10, 1.2), (20, 0.9)])}}
    value, det = get_measure("composite_gain")(None, runs, "a", "b")
    assert value == pytest.approx(math.log10(40.0) - math.log10(1.0))  # the last step, not the step-10 maximum
    assert det["gain_a"] == {"0.01": 3.0, "0.1": 40.0} and det["max_gain_b"] == 1.0
    empty = {"a": {0.01: run("c1", [])}, "b": runs["b"]}
    value, det = get_measure("composite_gain")(None, empty, "a", "b")
    assert value is None and "no diag/hc_gain_fwd" in det["reason"]
