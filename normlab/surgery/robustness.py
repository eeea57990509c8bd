"""Per-run surgery measurements shared by the sweep report (``normlab report --quantize --label-free``) and the
claims suite, cached in the run directory:

- ``quant_robustness.json``: bits/byte increase under W4 RTN per output channel, and under W4 after the exact
  conversion + randomized Hadamard rotation (None with the reason when the run cannot be converted: Post-LN,
  Peri-LN, DyT, ...); simulated fake-quant (normlab.surgery.run_quantize);
- ``label_free.json``: MaNo and Matrix Nuclear-Norm (normlab.surgery.label_free) with the loss and bits/byte on
  the same validation tokens.

Both are recomputed when their settings (``max_tokens``, ``format``) differ from the cached ones. Rank
correlations: Spearman's rho = Pearson's r of the ranks (ties get their average rank).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from normlab.errors import NormlabError
from normlab.io import read_json, write_json
from normlab.rundir.readers import load_run, run_data

QUANT_FILE = "quant_robustness.json"
LABEL_FREE_FILE = "label_free.json"
FORMAT = "normlab-surgery-robustness-v1"


def _cached(path: Path, settings: dict[str, Any]) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        old = read_json(path, "cache")
    except NormlabError:
        return None
    return old if isinstance(old, dict) and old.get("settings") == settings else None


def quant_robustness(run_dir: str | Path, *, max_tokens: int = 8192, bits: int = 4) -> dict[str, Any]:
    """``{bpb, w4_rtn, w4_hadamard, hadamard_error}`` (bits/byte increases) for a completed run; cached."""
    # torch: report/ reads the cached numbers through this module and stays torch-free
    from normlab.surgery.run_quantize import quantize_model

    run_dir = Path(run_dir)
    settings = {"format": FORMAT, "max_tokens": max_tokens, "bits": bits}
    hit = _cached(run_dir / QUANT_FILE, settings)
    if hit:
        return hit
    src = load_run(run_dir, final_only=True)
    data = run_data(run_dir, src.cfg)
    _, _, rtn = quantize_model(src.model, src.cfg, data, weights=bits, max_tokens=max_tokens)
    out: dict[str, Any] = {"settings": settings, "bpb": rtn["bpb_before"], "w4_rtn": rtn["bpb_increase"],
                           "w4_hadamard": None, "hadamard_error": None,
                           "max_act_outlier_ratio": rtn["max_act_outlier_ratio"]}
    try:
        _, _, had = quantize_model(src.model, src.cfg, data, weights=bits, rotate="hadamard", max_tokens=max_tokens)
        out["w4_hadamard"] = had["bpb_increase"]
    except NormlabError as e:
        out["hadamard_error"] = str(e)
    write_json(run_dir / QUANT_FILE, out)
    return out


def label_free(run_dir: str | Path, *, max_tokens: int = 8192, batch_size: int = 16) -> dict[str, Any]:
    """``{mano, matrix_nuclear_norm, loss, bpb, ...}`` on the first ``max_tokens`` validation tokens; cached."""
    from normlab.eval.lm import evaluate
    from normlab.surgery.label_free import label_free_scores

    run_dir = Path(run_dir)
    settings = {"format": FORMAT, "max_tokens": max_tokens}
    hit = _cached(run_dir / LABEL_FREE_FILE, settings)
    if hit:
        return hit
    src = load_run(run_dir, final_only=True)
    data = run_data(run_dir, src.cfg)
    ctx = src.cfg.model.context
    ev = evaluate(src.model, data.val, data.token_bytes, data.tokenizer.decode_bytes, context=ctx,
                  batch_size=batch_size, max_tokens=max_tokens)
    scores = label_free_scores(src.model, data.val, context=ctx, max_tokens=max_tokens, batch_size=batch_size)
    out = {"settings": settings, **scores, "loss": ev["loss"], "bpb": ev["bpb"]}
    write_json(run_dir / LABEL_FREE_FILE, out)
    return out


def _ranks(x: list[float]) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64)
    order = np.argsort(a, kind="mergesort")
    ranks = np.empty(len(a))
    ranks[order] = np.arange(1, len(a) + 1)
    for v in np.unique(a):  # ties: average rank
        m = a == v
        ranks[m] = ranks[m].mean()
    return ranks


def pearson(x: list[float], y: list[float]) -> float | None:
    """Pearson correlation; None for fewer than 3 points or a constant input."""
    if len(x) < 3:
        return None
    a, b = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    a, b = a - a.mean(), b - b.mean()
    den = math.sqrt(float((a * a).sum() * (b * b).sum()))
    return float((a * b).sum() / den) if den > 0 else None


def spearman(x: list[float], y: list[float]) -> float | None:
    """Spearman's rank correlation (Pearson of average ranks)."""
    return None if len(x) < 3 else pearson(list(_ranks(x)), list(_ranks(y)))
