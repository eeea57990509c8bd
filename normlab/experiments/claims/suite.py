"""The claims suite: each published claim as data (text, paper, metric, expected direction, the runs it needs)
plus a small function turning one seed's runs into one number. ``run_suite`` trains what is missing (reusing
complete runs in ``OUT/runs/<variant>/seed<k>``), measures every claim per seed and returns the verdicts.

Runs are shared between claims: e.g. the Pre-LN baseline ``ln`` serves the conversion, DyT, PowerNorm, linear
attention and extrapolation claims. Every run directory holds ``claims_spec.json`` (the exact config dict it was
trained from); a run is reused only when that spec matches, ``summary.json`` says completed or diverged, and its
fingerprint (``fingerprint.json``: resolved config, parameter names/shapes/order, normlab and torch versions) matches
what the current code builds (``reuse_reason`` says why not; the log and ``claims.json`` ``retrained`` list it).
"""

from __future__ import annotations

import copy
import json
import math
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from normlab.errors import NormlabError
from normlab.experiments.claims.budgets import Budget
from normlab.experiments.claims.lrclaims import GRID_VARIANTS, grid_claims, grid_config, lr_dir
from normlab.experiments.claims.stats import verdict
from normlab.io import read_json, write_json

# ---------------------------------------------------------------------------------------------------- variants
# name -> (deep?, model overrides, train overrides). The shallow baseline is Pre-LN softmax with RoPE. A model
# override may be a function of the budget (PowerNorm's groups = the budget's heads).
# DyT, the authors' LLaMA recipe (jiachenzhu/DyT other_tasks/LLaMA/fms_fsdp/models/llama.py and README): untied LM
# head (tie_heads False), no DyT bias, per-site alpha init (their smallest model, 7B: attention 0.8, FFN 0.2,
# final 0.2), and a learnable scalar after the token embedding (shared_scale) initialised to sqrt(d) at their
# d = 4096, i.e. 64: with N(0, 0.02) embeddings the stream starts at RMS 1.28 as theirs (sqrt(64) = 8 would start
# it at 0.16). Its baseline is the same model with LayerNorm (untied head, no embedding scale).
DYT_LLAMA = {"norm": "dyt", "tie_embeddings": False, "embed_scale": "learnable", "embed_scale_init": 64.0,
             "norm_options": {"bias": False, "alpha_init@attn": 0.8, "alpha_init@mlp": 0.2, "alpha_init@final": 0.2}}
VARIANTS: dict[str, tuple[bool, dict, dict]] = {
    "ln": (False, {}, {}),
    "ln_untied": (False, {"tie_embeddings": False}, {}),
    "dyt": (False, DYT_LLAMA, {}),
    # PowerNorm as in the authors' transformer (sIncerass/powernorm fairseq/modules/norm_select.py:
    # MaskPowerNorm(embed_dim, group_num=head_num, ...)): group scaling with groups = attention heads
    "powernorm": (False, {"norm": "powernorm", "norm_options": lambda b: {"groups": b.heads}}, {}),
    # LINA's locality branch: causal depthwise conv of the attention input (techmonsterwang/LINA dw_conv)
    "linear_conv": (False, {"attention": "linear", "linear_conv": 4, "linear_conv_source": "input"}, {}),
    "softplus": (False, {"attention": "softplus"}, {}),
    # softplus attention trained with LSSAR re-weighting on, as the paper trains it
    "softplus_lssar": (False, {"attention": "softplus", "lssa_reweight": True}, {}),
    "deep_pre": (True, {}, {}),
    "deep_lns": (True, {"layernorm_scaling": True}, {}),
    "deep_peri": (True, {"placement": "peri"}, {}),
    "deep_mix": (True, {"placement": "mix", "mix_alpha": 0.25}, {}),
    "deep_pre_nowarm": (True, {}, {"warmup_steps": 0}),
    "deep_post_nowarm": (True, {"placement": "post"}, {"warmup_steps": 0}),
}


def variant_config(variant: str, budget: Budget, seed: int, lr: float | None = None) -> dict[str, Any]:
    """The full config dict (``normlab.config.config_from_dict`` input) of one run (``lr``: a grid variant's
    learning rate, normlab.experiments.claims.lrclaims)."""
    if variant in GRID_VARIANTS:
        return grid_config(variant, budget, seed, lr if lr is not None else budget.lr)
    deep, model_o, train_o = VARIANTS[variant]
    b = budget
    model_o = {k: (v(b) if callable(v) else copy.deepcopy(v)) for k, v in model_o.items()}
    cfg = {
        "seed": seed,
        "data": {"source": b.source, "tokenizer": "bytes"},
        "model": {"context": b.context, "width": b.width, "heads": b.heads,
                  "depth": b.deep_depth if deep else b.depth, "norm": "layernorm", "placement": "pre", **model_o},
        "train": {"steps": b.steps, "batch_size": b.batch_size, "lr": b.lr, "warmup_steps": b.warmup_steps,
                  "eval_every": b.steps, "eval_batches": b.eval_batches, "log_every": max(1, b.steps // 10),
                  "checkpoint_every": b.steps, "keep_checkpoints": 1, "threads": 1, **train_o},
        "diag": {"every": b.diag_every if deep else 0},
    }
    return cfg


# ------------------------------------------------------------------------------------------------ claim data
@dataclass
class Claim:
    name: str
    claim: str
    paper: str
    metric: str          # what one seed's value is
    expected: str        # human-readable expected direction
    direction: str       # stats.verdict direction
    variants: tuple[str, ...]
    measure: Callable[["Context", dict[str, Path]], tuple[float | None, dict]]
    null: float = 0.0
    margin: float | None = None
    tolerance: float | None = None
    meaning: str = ""    # longer explanation for docs/claims.md
    source: str = ""     # where the recipe / metric comes from (paper section, authors' script)
    deviations: str = ""  # what differs from the paper's setup, forced by scale or by choice, and why


class Context:
    """Shared state of one suite run: the budget, loaded data per source, and cached per-run diagnostics."""

    def __init__(self, budget: Budget):
        self.budget = budget
        self._data: dict[str, Any] = {}
        self._diag: dict[str, dict] = {}

    def data(self, cfg) -> Any:
        from normlab.rundir import load_data

        key = cfg.data.source
        if key not in self._data:
            self._data[key] = load_data(cfg)
        return self._data[key]

    def summary(self, run_dir: Path) -> dict:
        return read_json(run_dir / "summary.json", "summary")

    def diagnostics(self, run_dir: Path, at_init: bool = False) -> dict | None:
        """Variance-by-depth and massive-activation statistics of a completed run on a fixed validation sample
        (normlab.diagnostics); cached in ``RUN_DIR/claims_diag.json``. None for a run that did not complete.
        ``at_init``: the same statistics of the run's model at initialisation (rebuilt from its config under its
        seed, exactly as the training loop seeds and builds it), cached in ``RUN_DIR/claims_diag_init.json``."""
        key = f"{run_dir}{'@init' if at_init else ''}"
        if key in self._diag:
            return self._diag[key]
        if self.summary(run_dir).get("status") != "completed":
            return None
        path = run_dir / ("claims_diag_init.json" if at_init else "claims_diag.json")
        out = read_json(path, "claims diagnostics") if path.is_file() else None
        if out is None or out.get("format") != DIAG_FORMAT:
            import torch

            from normlab.diagnostics.analyze import sample_sequences
            from normlab.diagnostics.capture import capture_stream
            from normlab.diagnostics.depth import variance_by_depth
            from normlab.diagnostics.massive import massive_by_block
            from normlab.rundir import load_run

            run = load_run(run_dir)
            model = run.model
            if at_init:
                from normlab.model import build_model

                torch.manual_seed(run.cfg.seed)  # as normlab.train.loop: seed, then build
                model = build_model(run.cfg.model).eval()
            data = self.data(run.cfg)
            idx, _, _ = sample_sequences(data.val, self.budget.sample_sequences, run.cfg.model.context)
            hidden = capture_stream(model, idx).hidden
            var = variance_by_depth(hidden)
            mas = massive_by_block(hidden)
            out = {"format": DIAG_FORMAT, "variance": var,
                   "massive": {k: mas[k] for k in ("max_ratio", "max_ratio_per_seq", "max_abs", "max_top1_per_seq",
                                                   "any_flagged")},
                   "massive_ratio_by_block": [b["ratio"] for b in mas["blocks"]],
                   "massive_ratio_per_seq_by_block": [b["per_sequence"]["ratio"] for b in mas["blocks"]]}
            write_json(path, out)
        self._diag[key] = out
        return out


DIAG_FORMAT = 2  # claims_diag.json: 2 = with the authors' per-sequence massive-activation statistics


def final_bpb(ctx: Context, run_dir: Path) -> tuple[float, dict]:
    """Validation bits/byte at the end of a run; a diverged run scores the uniform model, ``log2(vocab)`` bits per
    token (= bits per byte with the bytes tokenizer), so divergence counts as the worst possible outcome."""
    s = ctx.summary(run_dir)
    if s.get("status") == "completed" and s.get("val_bpb") is not None:
        return float(s["val_bpb"]), {"status": "completed"}
    cfg = json.loads((run_dir / "claims_spec.json").read_text())
    from normlab.config import config_from_dict

    vocab = ctx.data(config_from_dict(copy.deepcopy(cfg))).vocab_size
    return math.log2(vocab), {"status": s.get("status"), "diverged_at": s.get("step")}


# --------------------------------------------------------------------------------------------- measurements
def m_exact(ctx: Context, runs: dict[str, Path]) -> tuple[float | None, dict]:
    from normlab.rundir import load_run
    from normlab.convert.exact import convert_model
    from normlab.convert.run import max_logit_diff

    src = load_run(runs["ln"], final_only=True)
    data = ctx.data(src.cfg)
    diffs = {}
    for kind in ("rmsnorm", "crmsnorm"):
        _, model, _ = convert_model(src.model, src.cfg, kind)
        diffs[kind] = max_logit_diff(src.model, model, data.val, src.cfg.model.context)
    return max(diffs.values()), {"max_abs_logit_diff": diffs}


def _slope(ctx: Context, run: Path) -> float | None:
    d = ctx.diagnostics(run)
    return None if d is None else d["variance"]["log_var_slope_blocks"]


def m_growth(ctx: Context, runs: dict[str, Path]) -> tuple[float | None, dict]:
    s = _slope(ctx, runs["deep_pre"])
    return s, {"slope_pre": s}


def m_diff_slope(other: str) -> Callable:
    def m(ctx: Context, runs: dict[str, Path]) -> tuple[float | None, dict]:
        a, b = _slope(ctx, runs["deep_pre"]), _slope(ctx, runs[other])
        return (None if a is None or b is None else a - b), {"slope_pre": a, f"slope_{other}": b}
    return m


def m_massive(ctx: Context, runs: dict[str, Path]) -> tuple[float | None, dict]:
    """log10 of the Pre-LN / Peri-LN massive-activation ratio the authors' way (per sequence: top-1 |h| and median
    |h| averaged over the sequences; the largest mean-top-1 / mean-median over blocks); the pooled ratio (max over
    the whole sample / pooled median) is kept as a second number in the details."""
    a, b = ctx.diagnostics(runs["deep_pre"]), ctx.diagnostics(runs["deep_peri"])
    if a is None or b is None or not a["massive"]["max_ratio_per_seq"] or not b["massive"]["max_ratio_per_seq"]:
        return None, {}
    ra, rb = a["massive"]["max_ratio_per_seq"], b["massive"]["max_ratio_per_seq"]
    pa, pb = a["massive"]["max_ratio"], b["massive"]["max_ratio"]
    return math.log10(ra / rb), {"ratio_per_seq_pre": ra, "ratio_per_seq_peri": rb,
                                 "pooled_log10_ratio": math.log10(pa / pb) if pa and pb else None,
                                 "pooled_ratio_pre": pa, "pooled_ratio_peri": pb,
                                 "top1_per_seq_pre": a["massive"]["max_top1_per_seq"],
                                 "top1_per_seq_peri": b["massive"]["max_top1_per_seq"]}


def m_peri_variance(ctx: Context, runs: dict[str, Path]) -> tuple[float | None, dict]:
    """Growth of the hidden-state variance during training, as Kim et al. 2025 measure it (the variance of the
    hidden states, which grows with training steps in Pre-LN and stays bounded with Peri-LN): for each model
    ``ln(var_end / var_init)`` of the last block's output on the same validation windows (init = the run's own
    seeded initialisation); value = growth(Pre-LN) - growth(Peri-LN), nats. Details: the magnitude at the end
    (``log10`` of the Pre-LN / Peri-LN variance of the last block's output) and the slopes of ln(var) over depth at
    initialisation and at the end (the earlier metric, reported beside it)."""
    det: dict[str, Any] = {}
    growth = {}
    for name in ("deep_pre", "deep_peri"):
        end, init = ctx.diagnostics(runs[name]), ctx.diagnostics(runs[name], at_init=True)
        if end is None or init is None:
            return None, {"reason": f"{runs[name]} did not complete"}
        v_end, v_init = end["variance"]["var"][-1], init["variance"]["var"][-1]
        tag = name.removeprefix("deep_")
        growth[tag] = math.log(v_end / v_init)
        det[f"growth_{tag}"] = growth[tag]
        det[f"var_end_{tag}"], det[f"var_init_{tag}"] = v_end, v_init
        det[f"slope_init_{tag}"] = init["variance"]["log_var_slope_blocks"]
        det[f"slope_end_{tag}"] = end["variance"]["log_var_slope_blocks"]
    det["magnitude_log10_pre_over_peri"] = math.log10(det["var_end_pre"] / det["var_end_peri"])
    det["slope_diff_init"] = det["slope_init_pre"] - det["slope_init_peri"]
    det["slope_diff_end"] = det["slope_end_pre"] - det["slope_end_peri"]
    return growth["pre"] - growth["peri"], det


def m_peri_magnitude(ctx: Context, runs: dict[str, Path]) -> tuple[float | None, dict]:
    """log10(var Pre-LN / var Peri-LN) of the last block's output at the end of training (validation windows);
    positive = Peri-LN's hidden states have the smaller variance, as the paper reports."""
    a, b = ctx.diagnostics(runs["deep_pre"]), ctx.diagnostics(runs["deep_peri"])
    if a is None or b is None:
        return None, {}
    va, vb = a["variance"]["var"][-1], b["variance"]["var"][-1]
    return math.log10(va / vb), {"var_end_pre": va, "var_end_peri": vb,
                                 "max_var_pre": max(a["variance"]["var"][1:]),
                                 "max_var_peri": max(b["variance"]["var"][1:])}


def grad_cv(run_dir: Path) -> float | None:
    """Mean over the training-time diagnostic records of the coefficient of variation (std / mean, population
    std) across blocks of the per-block gradient norm (``normlab.names.block_grad_norms``: attention, MLP and
    norm-site parameters of each block)."""
    from normlab.diagnostics.analyze import training_records
    from normlab.names import block_grad_norms

    cvs = []
    for rec in training_records(run_dir):
        per = block_grad_norms(rec)
        if len(per) >= 2 and all(math.isfinite(v) for v in per):
            mu = sum(per) / len(per)
            if mu > 0:
                cvs.append(math.sqrt(sum((v - mu) ** 2 for v in per) / len(per)) / mu)
    return sum(cvs) / len(cvs) if cvs else None


def m_mix(ctx: Context, runs: dict[str, Path]) -> tuple[float | None, dict]:
    a, b = grad_cv(runs["deep_pre"]), grad_cv(runs["deep_mix"])
    return (None if a is None or b is None else a - b), {"grad_cv_pre": a, "grad_cv_mix": b}


def m_bpb_diff(a: str, b: str) -> Callable:
    """``bpb(a) - bpb(b)``."""
    def m(ctx: Context, runs: dict[str, Path]) -> tuple[float | None, dict]:
        x, dx = final_bpb(ctx, runs[a])
        y, dy = final_bpb(ctx, runs[b])
        return x - y, {f"bpb_{a}": x, f"bpb_{b}": y, f"status_{a}": dx["status"], f"status_{b}": dy["status"]}
    return m


def m_linear(ctx: Context, runs: dict[str, Path]) -> tuple[float | None, dict]:
    x, dx = final_bpb(ctx, runs["linear_conv"])
    y, dy = final_bpb(ctx, runs["ln"])
    return x / y - 1.0, {"bpb_linear_conv": x, "bpb_softmax": y, "params_linear_conv": ctx.summary(runs["linear_conv"]).get("params"),
                         "params_softmax": ctx.summary(runs["ln"]).get("params"), "status_linear_conv": dx["status"]}


def _degradation(ctx: Context, run_dir: Path, reweight: bool | None) -> tuple[float | None, dict]:
    """``(loss(max factor) - loss(1x), {factor: loss})`` in nats/token of one run on the budget's extrapolation
    windows; ``reweight`` (softplus runs) sets ``model.lssa_reweight`` for this evaluation (None: as trained)."""
    from normlab.attention import set_eval_options
    from normlab.eval.extrapolation import extrapolate
    from normlab.rundir import load_run

    b = ctx.budget
    if ctx.summary(run_dir).get("status") != "completed":
        return None, {"reason": f"{run_dir} did not complete"}
    run = load_run(run_dir)
    mc = run.cfg.model
    if reweight is not None:
        mc.lssa_reweight = reweight
        set_eval_options(run.model, mc)
    data = ctx.data(run.cfg)
    rep = extrapolate(run.model, data.val, data.token_bytes, train_context=mc.context, factors=list(b.extrap_factors),
                      positions=mc.positions, attention=mc.attention,
                      max_tokens=int(mc.context * max(b.extrap_factors) * b.extrap_windows), batch_size=4)
    losses = {str(r["factor"]): r["loss"] for r in rep["results"]}
    return losses[str(rep["results"][-1]["factor"])] - losses[str(rep["results"][0]["factor"])], losses


def m_extrap(ctx: Context, runs: dict[str, Path]) -> tuple[float | None, dict]:
    """Loss degradation ``loss(max factor) - loss(1x)`` (nats/token) of softmax minus that of softplus attention
    trained with LSSAR re-weighting on (as the paper trains it), on the same validation tokens."""
    out, deg = {}, {}
    for name, run, reweight in (("softmax", "ln", None), ("softplus_lssar", "softplus_lssar", None)):
        deg[name], losses = _degradation(ctx, runs[run], reweight)
        if deg[name] is None:
            return None, losses
        out[f"loss_{name}"] = losses
    return deg["softmax"] - deg["softplus_lssar"], {**out, "degradation": deg,
                                                    "max_factor": max(ctx.budget.extrap_factors)}


def m_extrap_eval_only(ctx: Context, runs: dict[str, Path]) -> tuple[float | None, dict]:
    """As :func:`m_extrap` with softplus attention trained WITHOUT re-weighting and LSSAR switched on only at
    evaluation (no fine-tuning); the softplus model without re-weighting is reported too."""
    out, deg = {}, {}
    for name, run, reweight in (("softmax", "ln", None), ("softplus", "softplus", False),
                                ("softplus_lssar_eval", "softplus", True)):
        deg[name], losses = _degradation(ctx, runs[run], reweight)
        if deg[name] is None:
            return None, losses
        out[f"loss_{name}"] = losses
    return deg["softmax"] - deg["softplus_lssar_eval"], {**out, "degradation": deg,
                                                         "max_factor": max(ctx.budget.extrap_factors)}


CLAIMS: list[Claim] = [
    Claim("exact-conversion", "Pre-LN, Pre-RMSNorm and Pre-CRMSNorm compute the same function",
          "Jiang et al. 2023 (arXiv:2305.14858)", "max |logit diff| after converting a trained Pre-LN run to "
          "Pre-RMSNorm and Pre-CRMSNorm (fp32, 4 validation windows)", "<= 1e-4", "exact", ("ln",), m_exact,
          tolerance=1e-4, meaning="Each seed's trained Pre-LN model is converted in memory (normlab.convert."
          "convert_model) to Pre-RMSNorm and to Pre-CRMSNorm; the value is the larger of the two max |logit "
          "differences|. Held when every seed is within the tolerance 1e-4.",
          source="paper section 3 (the conversion) and repo ZixuanJiang/pre-rmsnorm-transformer",
          deviations="none in the method; a small GPT instead of their ViT / GPT-2 models."),
    Claim("cod-growth", "In Pre-LN the residual-stream variance grows with depth",
          "Sun et al. 2025, The Curse of Depth (arXiv:2502.05795)", "slope of ln(var) of block outputs vs block "
          "index, deep Pre-LN (nats/block)", "> 0", "greater", ("deep_pre",), m_growth,
          meaning="Least-squares slope of ln(variance of the residual stream after block l) against l, pooled over "
                  "a fixed validation sample (normlab.diagnostics.depth, log_var_slope_blocks). exp(slope) is the "
                  "growth factor per block.",
          source="paper section 3 (variance of the Pre-LN output grows with depth; their figure of the "
                 "per-layer variance) and repo lmsdss/LayerNorm-Scaling",
          deviations="12 blocks of width 64 for 500 steps instead of LLaMA-130M..1B trained on C4; the growth is "
                     "summarised by one log-slope."),
    Claim("cod-lns", "LayerNorm Scaling reduces the variance growth of Pre-LN",
          "Sun et al. 2025, The Curse of Depth (arXiv:2502.05795)", "slope(Pre-LN) - slope(Pre-LN + LayerNorm "
          "Scaling), deep models (nats/block)", "> 0", "greater", ("deep_pre", "deep_lns"), m_diff_slope("deep_lns"),
          meaning="Same slope as cod-growth, Pre-LN minus Pre-LN with 1/sqrt(l) on input-norm outputs; positive = "
                  "LayerNorm Scaling grows more slowly.",
          source="paper section 4 (LayerNorm Scaling: each input-norm output times 1/sqrt(l))",
          deviations="as cod-growth."),
    Claim("peri-massive", "Peri-LN shows smaller massive activations than Pre-LN",
          "Kim et al. 2025, Peri-LN (arXiv:2502.02732)", "log10(max_l mean top|h| / mean median|h| over sequences, "
          "Pre-LN / Peri-LN), deep models", "> 0", "greater", ("deep_pre", "deep_peri"), m_massive,
          meaning="Massive activations the authors' way (Sun et al. 2024, repo locuslab/massive-activations, "
                  "main_llm.py --exp2; normlab.diagnostics.massive.per_sequence): per validation sequence the top-1 "
                  "|h| and the median |h| of a block output, each averaged over the sequences; ratio = mean top-1 / "
                  "mean median, the largest over blocks; value = log10(Pre-LN ratio / Peri-LN ratio); positive = "
                  "Peri-LN smaller. The pooled ratio (max over all sequences / pooled median) is the second number "
                  "(pooled_log10_ratio).",
          source="Peri-LN section 4 (massive activations of Pre-LN vs Peri-LN); the statistic from Sun et al. 2024, "
                 "main_llm.py --exp2 and lib/plot_utils_llm.py plot_layer_ax (np.mean over sequences)",
          deviations="sequences are the budget's validation windows of 64 bytes (theirs: 10 sequences of 4096 "
                     "tokens); the |h| > 100 criterion is never met at this scale, so the ratio is compared."),
    Claim("peri-variance", "Peri-LN keeps the hidden-state variance from growing during training, where Pre-LN's "
          "grows", "Kim et al. 2025, Peri-LN (arXiv:2502.02732)", "ln(var_end / var_init) of the last block's "
          "output: Pre-LN - Peri-LN (nats)", "> 0", "greater", ("deep_pre", "deep_peri"), m_peri_variance,
          meaning="Growth of the hidden-state variance during training: for each model ln(var at the end / var at "
                  "initialisation) of the last block's output on the same validation windows (initialisation = the "
                  "run's own seeded init, rebuilt); value = growth(Pre-LN) - growth(Peri-LN); positive = Peri-LN "
                  "grows less. Beside it (details): the magnitude at the end, log10(var Pre-LN / var Peri-LN) of the "
                  "last block's output, and the slope of ln(var) over depth at init and at the end (the earlier "
                  "metric, which scored the architecture at initialisation: Peri-LN adds about unit variance per "
                  "block, so its at-init slope is already the larger).",
          source="Peri-LN section 4 (hidden-state variance across layers and its growth over training steps: "
                 "Pre-LN's grows by orders of magnitude, Peri-LN's stays small)",
          deviations="the growth is read at two points (init and end of the 500-step run) on the last block's "
                     "output, not as the paper's curves over all layers and checkpoints; 12 blocks of width 64 "
                     "instead of 400M-3.2B models."),
    Claim("peri-variance-magnitude", "Peri-LN's hidden states end training with a smaller variance than Pre-LN's",
          "Kim et al. 2025, Peri-LN (arXiv:2502.02732)", "log10(var Pre-LN / var Peri-LN) of the last block's output "
          "at the end of training", "> 0", "greater", ("deep_pre", "deep_peri"), m_peri_magnitude,
          meaning="The magnitude half of the Peri-LN variance claim: the variance of the residual stream after the "
                  "last block (the stream the final norm reads) on the fixed validation windows at the end of "
                  "training, Pre-LN over Peri-LN, log10; positive = Peri-LN smaller. Details: the largest variance "
                  "over the blocks of each model.",
          source="as peri-variance",
          deviations="as peri-variance; the magnitude is read at the end of the budget's run only."),
    Claim("mixln-grad", "Mix-LN makes gradient norms more uniform across depth than Pre-LN",
          "Li et al. 2024, Mix-LN (arXiv:2412.13795)", "CV across blocks of per-block grad norm: Pre-LN - Mix-LN "
          "(mean over training)", "> 0", "greater", ("deep_pre", "deep_mix"), m_mix,
          meaning="Per-block gradient norm sqrt(|g_attn|^2 + |g_mlp|^2 + |g_norm|^2) (normlab.names.block_grad_norms, "
                  "the report's definition too) recorded during training every diag.every "
                  "steps (before clipping); coefficient of variation (std/mean) across blocks, averaged over the "
                  "records; value = CV(Pre-LN) - CV(Mix-LN, alpha 0.25); positive = Mix-LN more uniform.",
          source="Mix-LN section 4 (gradient norms across layers) and repo pixeli99/MixLN (alpha 0.25)",
          deviations="the uniformity is summarised by one coefficient of variation; 12 blocks of width 64."),
    Claim("postln-warmup", "Deep Post-LN without warm-up trains worse (or diverges) where Pre-LN does not",
          "Xiong et al. 2020, On Layer Normalization in the Transformer Architecture (arXiv:2002.04745)",
          "val bpb(Post-LN) - bpb(Pre-LN), deep, no LR warm-up (diverged = 8 bpb)", "> 0", "greater",
          ("deep_post_nowarm", "deep_pre_nowarm"), m_bpb_diff("deep_post_nowarm", "deep_pre_nowarm"),
          meaning="Both deep models trained with train.warmup_steps=0 at the same peak LR; final validation "
                  "bits/byte difference. A diverged run scores the uniform model (log2 vocab = 8 bits/byte).",
          source="paper section 3 (Post-LN needs the warm-up stage; Pre-LN trains without it)",
          deviations="AdamW at the budget's peak LR 3e-3 (the paper: Adam on translation / BERT); 12 blocks."),
    Claim("dyt-vs-ln", "DyT (the authors' LLaMA recipe) reaches the loss of LayerNorm within a small margin",
          "Zhu et al. 2025, Transformers without Normalization (arXiv:2503.10622)", "val bpb(DyT) - bpb(LayerNorm), "
          "Pre placement, untied LM head", "|Δ| < 0.05", "within", ("ln_untied", "dyt"),
          m_bpb_diff("dyt", "ln_untied"), margin=0.05,
          meaning="Equivalence test: held when the whole 95% CI of bpb(DyT) - bpb(LN) lies inside ±0.05 bits/byte; "
                  "not held when it lies entirely outside. DyT with the authors' LLaMA recipe: untied LM head, no "
                  "DyT bias, alpha init 0.8 (attention input) / 0.2 (MLP input) / 0.2 (final), a learnable scalar "
                  "after the token embedding; the LayerNorm baseline has the same untied head.",
          source="paper section 5 (LLaMA 7B-70B) and the authors' script jiachenzhu/DyT other_tasks/LLaMA "
                 "(fms_fsdp/models/llama.py: tie_heads False, LayerNormParameterized = weight * tanh(alpha x) "
                 "without bias, shared_scale init sqrt(emb_dim); README: attn/ffn/dec alpha 0.8/0.2/0.2 for 7B)",
          deviations="the embedding scalar starts at sqrt(4096) = 64 (their d), not sqrt(64) = 8: with N(0, 0.02) "
                     "embeddings that starts the stream at RMS 1.28 as in their 7B, where sqrt(d) at d = 64 would "
                     "start it at 0.16 (docs/norms.md measures that variant far worse); alpha inits of their smallest "
                     "model (7B; smaller than theirs, ours might want larger); GELU MLP and LayerNorm baseline "
                     "instead of SwiGLU and RMSNorm; the budget's LR 3e-3 (theirs 3e-4) for both arms."),
    Claim("lssar-extrapolation", "Softplus attention with re-weighting keeps loss flatter than softmax up to 16x the "
          "training length", "Gao & Huang 2025, Softplus Attention with Re-weighting (repo iminfine/freeatten)",
          "loss(16x) - loss(1x) [nats/token]: softmax - softplus+LSSAR (trained with re-weighting)", "> 0",
          "greater", ("ln", "softplus_lssar"), m_extrap,
          meaning="Both models trained at the same context with RoPE, the softplus model with LSSAR re-weighting "
                  "on during training (model.lssa_reweight=true), as the paper trains it; evaluated on the same "
                  "validation tokens with non-overlapping windows of 1x..16x the training context "
                  "(normlab.eval.extrapolation). Value = softmax degradation minus softplus+LSSAR degradation; "
                  "positive = flatter with LSSAR. The eval-only switch is measured separately (lssar-eval-only).",
          source="paper section 3-4 (LSSA with re-weighting, power 15; length extrapolation to 16x) and repo "
                 "iminfine/freeatten",
          deviations="trained at context 64 and evaluated to 1,024 (theirs: GPT-2-size models on longer "
                     "contexts); the repo could not be fetched here, the formulas follow docs/attention.md."),
    Claim("lssar-eval-only", "Softplus attention trained without re-weighting, with LSSAR switched on only at "
          "evaluation, keeps loss flatter than softmax up to 16x", "Gao & Huang 2025, Softplus Attention with "
          "Re-weighting (repo iminfine/freeatten)", "loss(16x) - loss(1x) [nats/token]: softmax - softplus with "
          "LSSAR at evaluation only", "> 0", "greater", ("ln", "softplus"), m_extrap_eval_only,
          meaning="The earlier measurement, kept as a separate, labelled one: the softplus model trained without "
                  "re-weighting and evaluated with model.lssa_reweight=true (no fine-tuning), as lssar-extrapolation "
                  "otherwise. The switch raises the 1x loss of a model never trained with it; details give the "
                  "softplus model without re-weighting too.",
          source="as lssar-extrapolation",
          deviations="not the paper's protocol (it trains with re-weighting): a measurement of what the switch "
                     "alone does."),
    Claim("powernorm-lm", "PowerNorm gives lower loss than LayerNorm on language modelling",
          "Shen et al. 2020, PowerNorm (arXiv:2003.07845)", "val bpb(LayerNorm) - bpb(PowerNorm)", "> 0", "greater",
          ("ln", "powernorm"), m_bpb_diff("ln", "powernorm"),
          meaning="Final validation bits/byte; positive = PowerNorm better (the paper reports lower perplexity). "
                  "PowerNorm as the authors' transformer uses it: group scaling with groups = attention heads (4), "
                  "statistics warm-up = the LR warm-up.",
          source="paper section 5 (Wikitext-103 / PTB language modelling) and repo sIncerass/powernorm "
                 "(fairseq/modules/norm_select.py: MaskPowerNorm(embed_dim, group_num=head_num); "
                 "norms/mask_powernorm.py)",
          deviations="Pre-LN placement (the suite's baseline) and the budget's warm-up 50 steps as the statistics "
                     "warm-up (their NormSelect default 1000 updates); byte-level pystdlib instead of word-level "
                     "Wikitext-103 / PTB."),
    Claim("linear-attention", "Causal linear attention with division normalisation and LINA's input conv is "
          "competitive with softmax at equal parameters", "Wang et al. 2026, LINA",
          "bpb(linear+conv) / bpb(softmax) - 1", "< 0.05", "less", ("ln", "linear_conv"), m_linear, null=0.05,
          meaning="Linear attention (relu kernel, division normalisation, causal prefix sums) with LINA's locality "
                  "branch, a causal depthwise conv of size 4 of the attention input (model.linear_conv_source: "
                  "input), vs softmax at the same width/depth (the conv adds 5 x width parameters per block, "
                  "reported); competitive = relative bpb gap below 5%: held when the CI's upper end is below 0.05, "
                  "not held when its lower end is above.",
          source="LINA, repo techmonsterwang/LINA (diffnext/models/vision_transformer_linear_decouple1_kvscale1.py "
                 "LinearAttentionDecoder: dw_conv = Conv2d(dim, dim, 5, groups=dim) of the attention input x, "
                 "added to the attention output before proj)",
          deviations="their vision code is bidirectional with a 5x5 2-D conv; here causal prefix sums and a causal "
                     "1-D conv of size 4 (a causal LM); no KV gate."),
]
from normlab.experiments.claims.surgery import surgery_claims  # noqa: E402  (issue 13: model surgery)

CLAIMS += surgery_claims(Claim)
CLAIMS += grid_claims(Claim)
CLAIM_NAMES = [c.name for c in CLAIMS]


def select(only: str | None) -> list[Claim]:
    if not only:
        return list(CLAIMS)
    names = [n.strip() for n in only.split(",") if n.strip()]
    if not names:
        raise NormlabError(f"--only needs at least one claim name, got '{only}'; allowed: {', '.join(CLAIM_NAMES)}")
    for n in names:
        if n not in CLAIM_NAMES:
            from normlab.errors import did_you_mean

            raise NormlabError(f"unknown claim '{n}'{did_you_mean(n, CLAIM_NAMES)}; allowed: {', '.join(CLAIM_NAMES)}")
    return [c for c in CLAIMS if c.name in names]


# ------------------------------------------------------------------------------------------------------ runs
def run_dir_for(out: Path, variant: str, seed: int, lr: float | None = None) -> Path:
    """``OUT/runs/<variant>/seed<k>`` (a grid variant's runs are its ``lr<lr>`` subfolders)."""
    d = out / "runs" / variant / f"seed{seed}"
    return d if lr is None else lr_dir(d, lr)


def spec_record(cfg: dict) -> dict:
    """What ``claims_spec.json`` holds: the run's spec and the full config normlab resolves it to now. A run is
    reused only when both match, so a changed library default (a new config key, a new default value) retrains
    it instead of silently mixing old and new results."""
    from normlab.config import config_from_dict

    record = {"spec": cfg, "resolved": config_from_dict(copy.deepcopy(cfg)).to_dict()}
    return json.loads(json.dumps(record))  # as it reads back from disk (tuples -> lists)


def reuse_reason(run_dir: Path, cfg: dict) -> str | None:
    """None when the run in ``run_dir`` can be reused for ``cfg``: its ``claims_spec.json`` matches (spec and the
    config normlab resolves it to now), it finished (completed or diverged), and its fingerprint (resolved config,
    parameter names/shapes/order, normlab and torch versions; normlab.fingerprint) matches what the current code
    builds. Otherwise a short reason to train it (again)."""
    spec, summ = run_dir / "claims_spec.json", run_dir / "summary.json"
    if not (spec.is_file() and summ.is_file()):
        return "not trained yet" if not run_dir.exists() else "incomplete run directory"
    try:
        if json.loads(spec.read_text()) != spec_record(cfg):
            return "its spec or resolved config changed"
        status = json.loads(summ.read_text()).get("status")
    except (OSError, json.JSONDecodeError):
        return "unreadable claims_spec.json or summary.json"
    if status not in ("completed", "diverged"):
        return f"status {status}"
    from normlab.fingerprint import check_run

    return check_run(run_dir)


def is_complete(run_dir: Path, cfg: dict) -> bool:
    return reuse_reason(run_dir, cfg) is None


def train_job(cfg: dict, run_dir: str, reuse: str | None = None) -> dict:
    """Train one run (fresh directory); top-level so worker processes can pickle it. With ``reuse`` (a sweep
    directory) a finished run of that sweep with exactly this resolved config is copied instead of trained."""
    import torch

    from normlab.config import config_from_dict
    from normlab.experiments.claims.lrclaims import find_reusable
    from normlab.train.loop import train

    torch.set_num_threads(1)
    run_dir = Path(run_dir)
    if run_dir.exists():
        shutil.rmtree(run_dir)
    src = find_reusable(Path(reuse), cfg) if reuse else None
    if src is not None:
        shutil.copytree(src, run_dir, ignore=shutil.ignore_patterns("checkpoints"))
        write_json(run_dir / "claims_spec.json", spec_record(cfg))
        s = read_json(run_dir / "summary.json", "summary")
        return {"status": s["status"], "val_bpb": s.get("val_bpb"), "elapsed_s": 0.0, "tokens_per_s": None,
                "reused_from": str(src)}
    run_dir.mkdir(parents=True)
    write_json(run_dir / "claims_spec.json", spec_record(cfg))
    t0 = time.time()
    s = train(config_from_dict(copy.deepcopy(cfg)), run_dir, quiet=True)
    return {"status": s["status"], "val_bpb": s.get("val_bpb"), "elapsed_s": time.time() - t0,
            "tokens_per_s": s.get("tokens_per_s")}


def execute(jobs: list[tuple[str, int, dict, Path]], workers: int, log: Callable[[str], None],
            reuse: Path | None = None, ray: Any = None, out: Path | None = None) -> None:
    """Train ``jobs`` ``(variant, seed, cfg, run_dir)`` with ``workers`` processes (1 = in this process), or as
    Ray tasks when ``ray`` is a connected ``ray`` module (run directories under ``out``); with ``reuse`` (a sweep
    directory) runs it holds are copied (waited for while that sweep trains them), and the jobs it does not hold are
    trained first."""
    if not jobs:
        return
    n = len(jobs)
    rd = str(reuse) if reuse else None
    if reuse is not None:
        from normlab.experiments.claims.lrclaims import registered_in

        jobs = sorted(jobs, key=lambda j: registered_in(reuse, j[2]))

    def done(i: int, job, r: dict) -> None:
        bpb = "n/a" if r.get("val_bpb") is None else f"{r['val_bpb']:.4f}"
        how = f"copied from {r['reused_from']}" if r.get("reused_from") else (
            f"{r['elapsed_s']:.1f} s, {(r.get('tokens_per_s') or 0):,.0f} tok/s")
        log(f"[{i}/{n}] {job[0]} seed {job[1]}: {r['status']}, val bpb {bpb}, {how}")

    if ray is not None:
        from normlab.experiments.executors import run_ray_jobs

        if reuse is not None:  # runs the reused sweep holds are copied here, the rest go to the cluster
            held = [j for j in jobs if registered_in(reuse, j[2])]
            for i, job in enumerate(held, 1):
                done(i, job, train_job(job[2], str(job[3]), rd))
            jobs = [j for j in jobs if j not in held]
        run_ray_jobs(ray, jobs, out, done)
        return

    if workers <= 1:
        for i, job in enumerate(jobs, 1):
            done(i, job, train_job(job[2], str(job[3]), rd))
        return
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor, as_completed

    # deep runs first: the longest jobs start early so the two workers finish together (stable: keeps reuse order)
    order = sorted(jobs, key=lambda j: -j[2]["model"]["depth"]) if reuse is None else jobs
    env_old = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    os.environ.update({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
    try:
        with ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn")) as pool:
            futs = {pool.submit(train_job, j[2], str(j[3]), rd): j for j in order}
            for i, f in enumerate(as_completed(futs), 1):
                done(i, futs[f], f.result())
    finally:
        for k, v in env_old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run_suite(claims: list[Claim], budget: Budget, out: Path, *, seeds: int | None = None, workers: int = 1,
              log: Callable[[str], None] = lambda s: print(s, file=sys.stderr, flush=True),
              reuse: Path | None = None, executor: str = "local", address: str | None = None) -> dict:
    """Train what is missing, measure every claim per seed, return ``{claims: [...], ...}`` (also written to
    ``OUT/claims.json``)."""
    import torch

    n_seeds = seeds if seeds is not None else budget.seeds
    if n_seeds < 1:
        raise NormlabError(f"--seeds must be >= 1, got {n_seeds}")
    t0 = time.time()
    out.mkdir(parents=True, exist_ok=True)
    needed = sorted({v for c in claims for v in c.variants})
    jobs, reused, retrain = [], 0, {}
    for seed in range(n_seeds):
        for v in needed:
            for lr in (budget.grid_lrs if v in GRID_VARIANTS else (None,)):
                cfg = variant_config(v, budget, seed, lr)
                rd = run_dir_for(out, v, seed, lr)
                why = reuse_reason(rd, cfg)
                if why is None:
                    reused += 1
                else:
                    jobs.append((v if lr is None else f"{v}@lr{lr:g}", seed, cfg, rd))
                    if why != "not trained yet":
                        retrain.setdefault(why, []).append(f"{jobs[-1][0]}/seed{seed}")
    log(f"claims ({budget.name}): {len(claims)} claim(s), {n_seeds} seed(s), {len(jobs)} run(s) to train, "
        f"{reused} reused, {workers} worker(s) -> {out}")
    for why, names in retrain.items():  # say why a finished run is trained again
        log(f"retraining {len(names)} run(s) ({why}): {', '.join(names[:6])}{' ...' if len(names) > 6 else ''}")
    t_train = time.time()
    ray = None
    if executor == "ray" and jobs:
        from normlab.experiments.executors import connect

        ray = connect(address)
    execute(jobs, workers, log, reuse, ray, out)
    train_s = time.time() - t_train
    torch.set_num_threads(1)
    ctx = Context(budget)
    results = []
    for c in claims:
        base = {"name": c.name, "claim": c.claim, "paper": c.paper, "metric": c.metric, "expected": c.expected}
        t = time.time()
        values, details, runs = [], [], []
        for seed in range(n_seeds):
            rd = {v: run_dir_for(out, v, seed) for v in c.variants}
            val, det = c.measure(ctx, rd)
            values.append(val)
            details.append(det)
            runs.append({v: str(p) for v, p in rd.items()})
        v = verdict(values, c.direction, null=c.null, margin=c.margin, tolerance=c.tolerance)
        results.append({**base, "measured": v["measured"], "ci": v["ci"], "verdict": v["verdict"], "n": v["n"],
                        "reason": v["reason"], "direction": c.direction, "null": c.null, "margin": c.margin,
                        "tolerance": c.tolerance, "values": values, "seeds": list(range(n_seeds)),
                        "details": details, "runs": runs, "measure_s": time.time() - t})
        log(f"{c.name}: {v['verdict']} ({v['reason']})")
    report = {"format": "normlab-claims-v1", "budget": budget.name, "budget_spec": budget.to_dict(),
              "seeds": n_seeds, "out": str(out), "trained_runs": len(jobs), "reused_runs": reused,
              "retrained": {why: names for why, names in retrain.items()},
              "train_s": train_s, "elapsed_s": time.time() - t0, "claims": results}
    save_report(out / "claims.json", report)
    return report


def save_report(path: Path, report: dict) -> dict:
    """Write ``report`` to ``path``, keeping the other claims of an existing file with the same budget and seeds
    (so ``--only`` updates its claims without dropping the rest); returns what was written."""
    merged = dict(report)
    if path.is_file():
        try:
            old = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            old = None
        if old and old.get("budget") == report["budget"] and old.get("seeds") == report["seeds"]:
            new = {c["name"]: c for c in report["claims"]}
            have = {c["name"]: c for c in old.get("claims", [])}
            merged["claims"] = [new.get(n) or have[n] for n in CLAIM_NAMES if n in new or n in have]
            if len(merged["claims"]) > len(report["claims"]):
                merged["partial_update"] = sorted(new)
    write_json(path, merged)
    return merged
