"""Token Embedding Variability (Chung et al. 2024) and the output layer's operator norms (Filatov et al. 2025;
normlab.diagnostics.weightnorms) against direct computations of their definitions; recorded during training,
in summary.json, and drawn beside the loss in the report."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from normlab.config import DiagConfig
from normlab.diagnostics.training import TrainDiagnostics
from normlab.diagnostics.weightnorms import (
    rms_to_inf_norm,
    spectral_norm,
    token_embedding_variability,
    weight_norm_record,
)
from normlab.model import ModelConfig, build_model
from normlab.experiments.lrgrid import GridRun, analyze
from normlab.report.lrplots import loss_and_signal_vs_step_png
from tests.helpers import run_inproc, summary, weights


def test_tev_matches_its_definition():
    g = torch.Generator().manual_seed(0)
    E = torch.randn(7, 5, generator=g) * torch.arange(1, 8).float()[:, None] + 3.0
    tev = []
    for row in E.tolist():  # TEV_i = sqrt(1/d sum_j (e_ij - mean_i)^2)
        m = sum(row) / len(row)
        tev.append(math.sqrt(sum((x - m) ** 2 for x in row) / len(row)))
    mean, std = token_embedding_variability(E)
    assert mean == pytest.approx(float(np.mean(tev)), rel=1e-6)
    assert std == pytest.approx(float(np.std(tev)), rel=1e-6)


def test_operator_norms_match_their_definitions():
    g = torch.Generator().manual_seed(1)
    W = torch.randn(9, 4, generator=g, dtype=torch.float64)
    assert spectral_norm(W) == pytest.approx(float(torch.linalg.matrix_norm(W, ord=2)), rel=1e-12)
    assert spectral_norm(W) == pytest.approx(float(np.linalg.svd(W.numpy(), compute_uv=False)[0]), rel=1e-12)
    # RMS -> inf: sup_x ||W x||_inf / ||x||_RMS, attained at x = the row of largest norm
    r = rms_to_inf_norm(W)
    rms = lambda x: float(x.pow(2).mean().sqrt())
    best = W[int(W.norm(dim=1).argmax())]
    assert float((W @ best).abs().max()) / rms(best) == pytest.approx(r, rel=1e-12)
    for _ in range(200):  # no direction does better
        x = torch.randn(4, generator=g, dtype=torch.float64)
        assert float((W @ x).abs().max()) / rms(x) <= r * (1 + 1e-12)
    # non-finite weights (a run that diverged between two read points and trained on): NaN, dropped from the record
    W[2, 1] = math.nan
    assert math.isnan(spectral_norm(W))


def test_training_diagnostics_and_summary_record_them(tmp_path):
    torch.manual_seed(0)
    model = build_model(ModelConfig(vocab_size=20, context=8, width=16, depth=1, heads=2))
    diag = TrainDiagnostics(model, DiagConfig(every=1))
    diag.start_step(0)
    model(torch.randint(0, 20, (2, 8))).sum().backward()
    diag.after_backward(0, 1.0)
    rec = diag.collect()
    E = model.tok_emb.weight
    assert rec["diag/tev_mean"] == pytest.approx(float(E.detach().std(1, correction=0).mean()), rel=1e-6)
    assert rec["diag/head_spectral_norm"] == pytest.approx(float(torch.linalg.matrix_norm(E.detach(), 2)), rel=1e-5)
    # end to end: metrics every diag.every steps and the final weights' values in summary.json
    run = tmp_path / "run"
    run_inproc("train", "tiny", "--set", "train.steps=8", "--set", "diag.every=4", "--set", "train.eval_every=8",
               "--out", str(run), cache=tmp_path / "cache", check=True)
    recs = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs if "diag/tev_mean" in r] == [4, 8]
    w = weights(run)
    head = w.get("lm_head.weight", w["tok_emb.weight"])
    s = summary(run)["weight_norms"]
    assert s["head_spectral_norm"] == pytest.approx(float(torch.linalg.matrix_norm(head.double(), 2)), rel=1e-6)
    assert s["tev_mean"] == pytest.approx(token_embedding_variability(w["tok_emb.weight"])[0], rel=1e-9)
    assert set(s) == {k.split("/")[1] for k in weight_norm_record(build_model(ModelConfig()))}


def test_report_draws_tev_beside_the_loss():
    curves = {"loss": [(5, 3.0), (10, 2.5)], "diag/tev_mean": [(5, 0.02), (10, 0.03)]}
    runs = [GridRun("Pre-LN", lr, 0, "completed", 4.0, 8.0, f"r{lr}", curves) for lr in (1e-3, 1e-2)]
    png = loss_and_signal_vs_step_png(analyze(runs), "tev_mean")
    assert png is not None and png.startswith(b"\x89PNG")
    assert loss_and_signal_vs_step_png(analyze([GridRun("a", 1e-3, 0, "completed", 4.0, 8.0, "x", {})]),
                                       "tev_mean") is None


def test_scaling_shows_the_head_norm_at_each_sizes_best_learning_rate(tmp_path):
    from tests.report.test_scaling import make_size_sweep

    d = tmp_path / "sizes"
    finals = make_size_sweep(d)
    want: dict[tuple[str, str], list[float]] = {}
    for i, (rid, (variant, size, seed, final, n)) in enumerate(sorted(finals.items())):
        path = d / "runs" / rid / "summary.json"
        s = json.loads(path.read_text()) if path.is_file() else {"status": "completed", "val_bpb": final}
        s["weight_norms"] = {"head_rms_inf_norm": 10.0 + i, "head_spectral_norm": 1.0}
        path.write_text(json.dumps(s))
        want.setdefault((variant, size), []).append(10.0 + i)
    proc = run_inproc("scaling", str(d), "--json", cache=tmp_path / "c")
    assert proc.returncode == 0, proc.stderr
    for v in json.loads(proc.stdout)["variants"]:
        for p in v["points"]:
            vals = want[(v["variant"], p["size"])]
            assert p["head_rms_inf_norm"] == pytest.approx(sum(vals) / len(vals))
    text = run_inproc("scaling", str(d), cache=tmp_path / "c").stdout
    assert "Each size at its best learning rate" in text and "head RMS->inf" in text, text
