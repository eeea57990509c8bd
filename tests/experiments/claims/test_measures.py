"""normlab.experiments.claims.measures: the claims' per-seed values recomputed from the cached statistics (Peri-LN
growth, the authors' massive statistic, LSSAR trained vs switched at evaluation)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from tests.helpers import run_inproc

torch.set_num_threads(1)


@pytest.mark.slow
def test_changed_claims_tiny_end_to_end(tmp_path):
    """Peri-LN growth during training, the authors' massive statistic, LSSAR trained vs switched at evaluation:
    per-seed values recomputed from the cached statistics and the extrapolation details."""
    out, cache = tmp_path / "claims", tmp_path / "cache"
    p = run_inproc("claims", "--budget", "tiny", "--only",
                   "peri-variance,peri-variance-magnitude,peri-massive,lssar-extrapolation,"
                   "lssar-eval-only", "--out", str(out), "--json", cache=cache, check=True)
    rep = {c["name"]: c for c in json.loads(p.stdout)["claims"]}
    pv = rep["peri-variance"]
    for v, d, runs in zip(pv["values"], pv["details"], pv["runs"]):
        g = {}
        for name in ("deep_pre", "deep_peri"):
            end = json.loads((out / runs[name] / "claims_diag.json").read_text())["variance"]["var"][-1]
            init = json.loads((out / runs[name] / "claims_diag_init.json").read_text())["variance"]["var"][-1]
            g[name] = math.log(end / init)
        assert d["growth_last_block_diff"] == pytest.approx(g["deep_pre"] - g["deep_peri"], abs=1e-12)
        assert v == pytest.approx((d["slope_end_pre"] - d["slope_init_pre"])
                                  - (d["slope_end_peri"] - d["slope_init_peri"]), abs=1e-12)  # the slope measure
        assert d["slope_diff_init"] == pytest.approx(d["slope_init_pre"] - d["slope_init_peri"], abs=1e-12)
    for v, d in zip(rep["peri-variance-magnitude"]["values"], pv["details"]):
        assert v == pytest.approx(math.log10(d["var_end_pre"] / d["var_end_peri"]), abs=1e-12)
    pm = rep["peri-massive"]
    for v, d in zip(pm["values"], pm["details"]):
        assert v == pytest.approx(math.log10(d["ratio_per_seq_pre"] / d["ratio_per_seq_peri"]), abs=1e-12)
        assert d["pooled_log10_ratio"] == pytest.approx(math.log10(d["pooled_ratio_pre"] / d["pooled_ratio_peri"]))
    lt, le = rep["lssar-extrapolation"], rep["lssar-eval-only"]
    assert set(lt["runs"][0]) == {"ln", "softplus_lssar"} and set(le["runs"][0]) == {"ln", "softplus"}
    for d in lt["details"]:
        assert d["degradation"]["softmax"] == pytest.approx(d["loss_softmax"]["4"] - d["loss_softmax"]["1"])
    assert lt["details"][0]["loss_softmax"] == le["details"][0]["loss_softmax"]  # the same softmax run and tokens
