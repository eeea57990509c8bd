"""Claims about operating on trained models (issue 13; normlab.surgery, docs/surgery.md): LayerNorm removal by
fine-tuning, Hadamard rotation before 4-bit quantization, quantization robustness of Peri-LN, and label-free scores.

Each measurement is cached in the run directory (``claims_removal.json``, ``quant_robustness.json``,
``label_free.json``), so re-measuring is cheap. Per budget: fine-tuning steps per removal stage and the number of
validation tokens scored.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from normlab.io import read_json

REMOVAL_STEPS = {"tiny": 2, "quick": 10, "full": 30}
EVAL_TOKENS = {"tiny": 512, "quick": 8192, "full": 16384}
RANK_VARIANTS = ("ln", "dyt", "powernorm", "deep_pre", "deep_peri")


def _budget_name(ctx) -> str:
    return ctx.budget.name if ctx.budget.name in EVAL_TOKENS else "quick"


def _completed(ctx, run_dir: Path) -> bool:
    return ctx.summary(run_dir).get("status") == "completed"


def m_removal(ctx, runs: dict[str, Path]) -> tuple[float | None, dict]:
    """Loss (nats/token) of the LN-free model minus the LayerNorm model fine-tuned for the same total steps."""
    import shutil

    from normlab.io import write_json
    from normlab.surgery.remove_norm import remove_norm_run

    run = runs["ln"]
    if not _completed(ctx, run):
        return None, {"reason": f"{run} did not complete"}
    b = _budget_name(ctx)
    settings = {"steps": REMOVAL_STEPS[b], "max_tokens": EVAL_TOKENS[b], "lr": ctx.budget.lr / 10}
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
    from normlab.surgery.robustness import quant_robustness

    if not _completed(ctx, run):
        return None
    return quant_robustness(run, max_tokens=EVAL_TOKENS[_budget_name(ctx)])


def m_hadamard(ctx, runs: dict[str, Path]) -> tuple[float | None, dict]:
    q = _quant(ctx, runs["ln"])
    if q is None or q["w4_hadamard"] is None:
        return None, {"reason": "run did not complete" if q is None else q["hadamard_error"]}
    return q["w4_rtn"] - q["w4_hadamard"], {"w4_rtn_bpb_increase": q["w4_rtn"],
                                            "w4_hadamard_bpb_increase": q["w4_hadamard"], "bpb": q["bpb"]}


def m_peri_quant(ctx, runs: dict[str, Path]) -> tuple[float | None, dict]:
    a, b = _quant(ctx, runs["deep_pre"]), _quant(ctx, runs["deep_peri"])
    if a is None or b is None:
        return None, {"reason": "a run did not complete"}
    return a["w4_rtn"] - b["w4_rtn"], {"w4_rtn_pre": a["w4_rtn"], "w4_rtn_peri": b["w4_rtn"],
                                       "act_outlier_ratio_pre": a["max_act_outlier_ratio"],
                                       "act_outlier_ratio_peri": b["max_act_outlier_ratio"]}


def m_rank(score: str):
    def m(ctx, runs: dict[str, Path]) -> tuple[float | None, dict]:
        from normlab.surgery.robustness import label_free, spearman

        xs, ys, names = [], [], []
        for v, run in runs.items():
            if _completed(ctx, run):
                lf = label_free(run, max_tokens=EVAL_TOKENS[_budget_name(ctx)])
                xs.append(lf[score])
                ys.append(lf["loss"])
                names.append(v)
        rho = spearman(xs, ys)
        return rho, {f"{score}.{n}": x for n, x in zip(names, xs)} | {f"loss.{n}": y for n, y in zip(names, ys)}
    return m


def surgery_claims(Claim) -> list:
    """The claims, built with the suite's ``Claim`` class (passed in to avoid an import cycle)."""
    return [
        Claim("ln-removal", "LayerNorm can be removed by fine-tuning at a small loss increase",
              "Heimersheim 2024 (arXiv:2409.13710); Baroni et al. 2025 (arXiv:2507.02559): +0.03 nats for GPT-2 XL",
              "val loss of the LN-free model - LN model fine-tuned for the same steps (nats/token)", "< 0.05",
              "less", ("ln",), m_removal, null=0.05,
              meaning="normlab remove-norm on each seed's Pre-LN run (group schedule: MLP-input norms, attention-input "
                      "norms, final norm; each site's scale from the average per-token std on training windows; "
                      "fine-tuning steps per stage per budget: tiny 2, quick 10, full 30; lr = budget lr / 10), "
                      "against the control: the same LayerNorm model fine-tuned alike for 3x the steps. Positive = "
                      "removal costs loss. 'Small' is taken as below 0.05 nats/token; the paper's GPT-2 XL number "
                      "is +0.03."),
        Claim("hadamard-w4", "A randomized Hadamard rotation of the residual stream reduces the 4-bit quantization "
              "loss", "Ashkboos et al. 2024, QuaRot (arXiv:2404.00456)",
              "Δbpb(W4 RTN) - Δbpb(W4 RTN after Hadamard rotation), Pre-LN (bits/byte)", "> 0", "greater", ("ln",),
              m_hadamard,
              meaning="Simulated W4 round-to-nearest, symmetric, per output channel, on every linear inside the "
                      "blocks (embeddings and head in fp32); the rotated model is the exact Pre-RMSNorm conversion "
                      "with a randomized Hadamard rotation fused into the weights (checked to 1e-4 before "
                      "quantization). Positive = the rotation lowers the bits/byte increase."),
        Claim("peri-quant", "Peri-LN (smaller massive activations) loses less under 4-bit quantization than Pre-LN",
              "Kim et al. 2025, Peri-LN (arXiv:2502.02732); Sun et al. 2024, Massive Activations",
              "Δbpb(W4 RTN) of Pre-LN - of Peri-LN, deep models (bits/byte)", "> 0", "greater",
              ("deep_pre", "deep_peri"), m_peri_quant,
              meaning="Same W4 RTN as hadamard-w4, no rotation, on the deep Pre-LN and Peri-LN runs of "
                      "peri-massive. Positive = Peri-LN loses less."),
        Claim("mano-rank", "The label-free MaNo score ranks runs like their loss (higher MaNo, lower loss)",
              "Xie et al. 2024, MaNo (NeurIPS 2024, arXiv:2405.18979)",
              "Spearman rho(MaNo, val loss) over the runs of one seed", "< 0", "less", RANK_VARIANTS, m_rank("mano"),
              meaning="Per seed, MaNo (softmax-normalised logits, p = 4) and the loss on the same validation tokens "
                      "for the runs " + ", ".join(RANK_VARIANTS) + "; value = Spearman rank correlation; -1 = "
                      "the same ranking as the loss."),
        Claim("mnn-rank", "The Matrix Nuclear-Norm ranks runs like their loss (lower MNN, lower loss)",
              "Li et al. 2024, Matrix Nuclear-Norm (arXiv:2410.10672)",
              "Spearman rho(MNN, val loss) over the runs of one seed", "> 0", "greater", RANK_VARIANTS,
              m_rank("matrix_nuclear_norm"),
              meaning="As mano-rank with the Matrix Nuclear-Norm of the LM head's input hidden states (authors' "
                      "code: column-centred, row-normalised, sum of the largest column norms / T). The expected "
                      "sign follows the paper's reading (lower = better compression)."),
    ]
