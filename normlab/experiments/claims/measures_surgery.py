"""Measurements of the claims about operating on trained models (normlab.surgery, docs/surgery.md):
LayerNorm removal by fine-tuning, Hadamard rotation before 4-bit quantization, quantization robustness of Peri-LN,
and label-free scores.

Each measurement is cached in the run directory (``claims_removal.json``, ``quant_robustness.json``,
``label_free.json``), so re-measuring is cheap. Per budget: fine-tuning steps per removal stage and the number of
validation tokens scored.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from normlab.experiments.claims.measure_registry import register_measure
from normlab.io import read_json, write_json
from normlab.surgery.remove_norm import remove_norm_run
from normlab.surgery.robustness import label_free, quant_robustness, spearman


def _completed(ctx, run_dir: Path) -> bool:
    return ctx.summary(run_dir).get("status") == "completed"


@register_measure("removal")
def m_removal(ctx, runs: dict[str, Path]) -> tuple[float | None, dict]:
    """Loss (nats/token) of the LN-free model minus the LayerNorm model fine-tuned for the same total steps."""
    run = runs["ln"]
    if not _completed(ctx, run):
        return None, {"reason": f"{run} did not complete"}
    settings = {"steps": ctx.budget.removal_steps, "max_tokens": ctx.budget.measure_tokens, "lr": ctx.budget.lr / 10}
    cache = run / "claims_removal.json"
    rec = read_json(cache, "cache") if cache.is_file() else None
    if not rec or rec.get("settings") != settings:
        out = run / "ln_removed"
        if out.exists():
            shutil.rmtree(out)
        r = remove_norm_run(run, out, steps=settings["steps"], lr=settings["lr"], max_tokens=settings["max_tokens"],
                            control=True)
        c = r["control"] or {}
        rec = {"settings": settings, "delta_nats_vs_original": r["delta_nats"],
               "delta_nats_vs_control": c.get("delta_nats_vs_control"),
               "delta_bpb_vs_control": c.get("delta_bpb_vs_control"), "loss_original": r["original"]["loss"],
               "loss_removed": r["final"]["loss"], "loss_control": c.get("loss"),
               "removal_only_nats": [s["removal_delta_nats"] for s in r["stages"]]}
        write_json(cache, rec)
    return rec["delta_nats_vs_control"], {k: v for k, v in rec.items() if k != "settings"}


def _quant(ctx, run: Path) -> dict[str, Any] | None:

    if not _completed(ctx, run):
        return None
    return quant_robustness(run, max_tokens=ctx.budget.measure_tokens)


@register_measure("hadamard")
def m_hadamard(ctx, runs: dict[str, Path]) -> tuple[float | None, dict]:
    q = _quant(ctx, runs["ln"])
    if q is None or q["w4_hadamard"] is None:
        return None, {"reason": "run did not complete" if q is None else q["hadamard_error"]}
    return q["w4_rtn"] - q["w4_hadamard"], {"w4_rtn_bpb_increase": q["w4_rtn"],
                                            "w4_hadamard_bpb_increase": q["w4_hadamard"], "bpb": q["bpb"]}


@register_measure("peri_quant")
def m_peri_quant(ctx, runs: dict[str, Path]) -> tuple[float | None, dict]:
    a, b = _quant(ctx, runs["deep_pre"]), _quant(ctx, runs["deep_peri"])
    if a is None or b is None:
        return None, {"reason": "a run did not complete"}
    return a["w4_rtn"] - b["w4_rtn"], {"w4_rtn_pre": a["w4_rtn"], "w4_rtn_peri": b["w4_rtn"],
                                       "act_outlier_ratio_pre": a["max_act_outlier_ratio"],
                                       "act_outlier_ratio_peri": b["max_act_outlier_ratio"]}


@register_measure("rank")
def m_rank(ctx, runs: dict[str, Path], score: str) -> tuple[float | None, dict]:
    """Spearman rho between the label-free ``score`` and the validation loss over the completed ``runs``."""

    xs, ys, names = [], [], []
    for v, run in runs.items():
        if _completed(ctx, run):
            lf = label_free(run, max_tokens=ctx.budget.measure_tokens)
            xs.append(lf[score])
            ys.append(lf["loss"])
            names.append(v)
    rho = spearman(xs, ys)
    return rho, {f"{score}.{n}": x for n, x in zip(names, xs)} | {f"loss.{n}": y for n, y in zip(names, ys)}
