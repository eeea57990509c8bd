"""Measurements of the claims from the seed-literature issue (31; docs/claims.md): AdaGC, StableMax / Softmax
Collapse, Token Embedding Variability, residual sinks, Norm Tweaking, HIGGS grids and the linearity theorem.

Learning-rate grid measurements take, per grid variant, one seed's runs as ``{lr: run directory}`` (as
``measures_lr``); the others take single run directories. Surgery measurements are cached in the run directory
(``claims_literature.json``, keyed by what was measured and with which settings), so re-measuring is cheap.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from normlab.diagnostics.analyze import sample_sequences
from normlab.diagnostics.capture import capture_stream
from normlab.diagnostics.residual_sinks import ablate_residual_sinks, residual_sinks_by_block
from normlab.experiments.claims.measure_registry import register_measure
from normlab.experiments.claims.measures_lr import seed_grid
from normlab.io import read_json, write_json
from normlab.rundir.files import METRICS_FILE
from normlab.rundir.readers import load_run, read_metrics
from normlab.surgery.run_quantize import quantize_model

CACHE = "claims_literature.json"


def _tokens(ctx: Any) -> int:
    return ctx.budget.measure_tokens


def last_value(run_dir: Path, key: str) -> float | None:
    """The value of ``key`` at the last step that recorded it in ``metrics.jsonl`` (None if never)."""

    pts = [(s, v) for s, k, v in read_metrics(run_dir / METRICS_FILE) if k == key and math.isfinite(v)]
    return max(pts)[1] if pts else None


def _spikes(ctx: Any, grid: dict[float, Path]) -> int:
    """Loss spikes summed over a variant's grid runs (summary.json ``loss_spikes.count``)."""
    return sum(int((ctx.summary(r).get("loss_spikes") or {}).get("count") or 0) for r in grid.values())


@register_measure("spike_diff")
def m_spike_diff(ctx: Any, runs: dict[str, Any], a: str, b: str) -> tuple[float | None, dict]:
    """Loss spikes over the whole learning-rate grid: ``count(a) - count(b)``."""
    sa, sb = _spikes(ctx, runs[a]), _spikes(ctx, runs[b])
    return float(sa - sb), {f"spikes_{a}": sa, f"spikes_{b}": sb}


def grid_gain(grid: dict[float, Path]) -> dict[str, float | None]:
    """``diag/hc_gain_fwd`` at the last diagnostic step of each learning rate's run (a diverged run: its last one
    before it diverged), keyed ``f"{lr:g}"``."""
    return {f"{lr:g}": last_value(r, "diag/hc_gain_fwd") for lr, r in sorted(grid.items())}


@register_measure("composite_gain")
def m_composite_gain(ctx: Any, runs: dict[str, Any], a: str, b: str) -> tuple[float | None, dict]:
    """The mHC paper's composite residual gain (normlab.diagnostics.streams, ``diag/hc_gain_fwd``: the largest
    absolute row sum of the product of H_res over depth, max over tokens), per variant the largest over the grid's
    learning rates at each run's last diagnostic step: ``log10 gain(a) - log10 gain(b)``."""
    ga, gb = grid_gain(runs[a]), grid_gain(runs[b])
    top = {v: max((x for x in g.values() if x is not None and x > 0), default=None) for v, g in ((a, ga), (b, gb))}
    det = {f"gain_{a}": ga, f"gain_{b}": gb, f"max_gain_{a}": top[a], f"max_gain_{b}": top[b]}
    if top[a] is None or top[b] is None:
        return None, {**det, "reason": "no diag/hc_gain_fwd recorded (diag.every = 0, or not a stream model)"}
    return math.log10(top[a]) - math.log10(top[b]), det


@register_measure("collapse")
def m_collapse(ctx: Any, runs: dict[str, Any]) -> tuple[float | None, dict]:
    """Softmax-Collapse fraction (``diag/softmax_collapse``, last diagnostic step) at the grid's highest learning
    rate: softmax (``grid_pre``) minus StableMax (``grid_pre_stablemax``); the largest over the grid beside it."""
    top = max(ctx.budget.grid_lrs)
    a, b = last_value(runs["grid_pre"][top], "diag/softmax_collapse"), last_value(
        runs["grid_pre_stablemax"][top], "diag/softmax_collapse")
    if a is None or b is None:
        return None, {"reason": "no diag/softmax_collapse recorded (diag.every = 0, or the run diverged first)"}
    peak = {v: max((last_value(r, "diag/softmax_collapse") or 0.0) for r in runs[v].values())
            for v in ("grid_pre", "grid_pre_stablemax")}
    return a - b, {"collapse_softmax": a, "collapse_stablemax": b, "lr": top, "max_over_grid": peak}


@register_measure("tev")
def m_tev(ctx: Any, runs: dict[str, Any]) -> tuple[float | None, dict]:
    """TEV (``diag/tev_mean``, last diagnostic step) of Pre-LN at the grid's highest learning rate minus at its
    best learning rate (the lowest final loss)."""

    _, _, best_lr, det = seed_grid(ctx, runs["grid_pre"])
    top = max(ctx.budget.grid_lrs)
    a, b = last_value(runs["grid_pre"][top], "diag/tev_mean"), last_value(runs["grid_pre"][best_lr], "diag/tev_mean")
    if a is None or b is None:
        return None, {"reason": "no diag/tev_mean recorded"}
    per = {f"{lr:g}": last_value(r, "diag/tev_mean") for lr, r in sorted(runs["grid_pre"].items())}
    return a - b, {"tev_top_lr": a, "tev_best_lr": b, "top_lr": top, "best_lr": best_lr, "tev_by_lr": per,
                   "status": det["status"]}


def _cached(run_dir: Path, key: str, settings: dict, compute) -> dict:
    path = run_dir / CACHE
    cache = read_json(path, "claims cache") if path.is_file() else {}
    hit = cache.get(key)
    if isinstance(hit, dict) and hit.get("settings") == settings:
        return hit["value"]
    value = compute()
    cache[key] = {"settings": settings, "value": value}
    write_json(path, cache)
    return value


@register_measure("residual_sinks")
def m_residual_sinks(ctx: Any, runs: dict[str, Path]) -> tuple[float | None, dict]:
    """Deep Pre-LN: loss increase (nats/token) when the residual-sink dims are clipped to the median scale minus
    the increase when as many other dims are (normlab.diagnostics.residual_sinks), on the validation sample."""
    run = runs["deep_pre"]
    if ctx.summary(run).get("status") != "completed":
        return None, {"reason": f"{run} did not complete"}

    def compute() -> dict:

        r = load_run(run)
        idx, tgt, _ = sample_sequences(ctx.data(r.cfg).val, ctx.budget.sample_sequences, r.cfg.model.context)
        sinks = residual_sinks_by_block(capture_stream(r.model, idx).hidden[1:])
        ab = ablate_residual_sinks(r.model, idx, tgt, sinks)
        return {"dims": sinks["dims"], "max_rms_share": sinks["max_rms_share"], **ab}

    out = _cached(run, "residual_sinks", {"sequences": ctx.budget.sample_sequences}, compute)
    if not out["dims"]:
        return 0.0, {**out, "note": "no residual sink found: nothing to clip"}
    return out["increase"] - out["control_increase"], out


def _quant(ctx: Any, run: Path, **kw: Any) -> dict:
    """``bpb_increase`` (and the Norm Tweaking / linearity records) of ``normlab quantize`` on ``run`` in memory."""
    settings = {"max_tokens": _tokens(ctx), **kw}

    def compute() -> dict:

        r = load_run(run)
        _, _, rec = quantize_model(r.model, r.cfg, ctx.data(r.cfg), max_tokens=_tokens(ctx), **kw)
        return {k: rec[k] for k in ("bpb_before", "bpb_increase", "mean_rel_err", "norm_tweak", "linearity")}

    key = "quant:" + ",".join(f"{k}={v}" for k, v in sorted(kw.items()))
    return _cached(run, key, settings, compute)


@register_measure("quant_diff")
def m_quant_diff(ctx: Any, runs: dict[str, Path], bits: int, other: str) -> tuple[float | None, dict]:
    """Pre-LN (``ln``): bits/byte increase of W``bits`` RTN minus that of W``bits`` with ``other`` (``higgs``: the
    HIGGS grid instead of RTN; ``tweak``: RTN then Norm Tweaking). Positive = ``other`` loses less."""
    run = runs["ln"]
    if ctx.summary(run).get("status") != "completed":
        return None, {"reason": f"{run} did not complete"}
    base = _quant(ctx, run, weights=bits)
    alt = _quant(ctx, run, weights=bits, grid="higgs") if other == "higgs" else _quant(ctx, run, weights=bits,
                                                                                      tweak=True)
    det: dict[str, Any] = {"rtn_bpb_increase": base["bpb_increase"], f"{other}_bpb_increase": alt["bpb_increase"],
                           "bpb": base["bpb_before"]}
    if other == "tweak":
        det["output_error"] = alt["norm_tweak"]["output_error"]
    return base["bpb_increase"] - alt["bpb_increase"], det


@register_measure("linearity")
def m_linearity(ctx: Any, runs: dict[str, Path], bits: int) -> tuple[float | None, dict]:
    """log2(predicted / measured) bits/byte increase at W``bits`` RTN (HIGGS linearity theorem, coefficients from
    per-layer noise); None when the measured increase is not positive (no ratio)."""
    run = runs["ln"]
    if ctx.summary(run).get("status") != "completed":
        return None, {"reason": f"{run} did not complete"}
    lin = _quant(ctx, run, weights=bits, linearity=True)["linearity"]
    row = next(r for r in lin["rows"] if r["bits"] == bits)
    det = {"rows": lin["rows"], "noise_rel_err": lin["noise_rel_err"]}
    if row["measured"] <= 0 or row["predicted"] <= 0:
        return None, {**det, "reason": "measured or predicted increase not positive at this budget"}
    return math.log2(row["predicted"] / row["measured"]), det

