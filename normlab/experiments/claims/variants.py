"""The runs the claims suite trains: each variant's config overrides as data, and the full config of one run.

- ``VARIANTS``: name -> (deep?, model overrides, train overrides) of the single-learning-rate runs; the shallow
  baseline is Pre-LN LayerNorm softmax with RoPE, ``deep`` runs use ``Budget.deep_depth`` blocks.
- ``GRID_VARIANTS``: name -> (model overrides, train overrides) of the learning-rate sweep runs (Wortsman et al.
  2023), each trained at every ``Budget.grid_lrs`` with ``Budget.grid_depth`` blocks.

A model override may be a function of the budget (PowerNorm's groups = the budget's heads).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from normlab.experiments.claims.budgets import Budget

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
    # division-normalised linear attention without extras vs TransNormer's NormAttention (Qin et al. 2022)
    "linear": (False, {"attention": "linear"}, {}),
    "transnormer": (False, {"attention": "transnormer"}, {}),
    # softplus attention trained with LSSAR re-weighting on, as the paper trains it
    "softplus_lssar": (False, {"attention": "softplus", "lssa_reweight": True}, {}),
    "deep_pre": (True, {}, {}),
    "deep_lns": (True, {"layernorm_scaling": True}, {}),
    "deep_peri": (True, {"placement": "peri"}, {}),
    "deep_mix": (True, {"placement": "mix", "mix_alpha": 0.25}, {}),
    "deep_pre_nowarm": (True, {}, {"warmup_steps": 0}),
    "deep_post_nowarm": (True, {"placement": "post"}, {"warmup_steps": 0}),
}

# name -> (model overrides, train overrides); all Pre-LN LayerNorm unless overridden, depth Budget.grid_depth
GRID_VARIANTS: dict[str, tuple[dict, dict]] = {
    "grid_pre": ({}, {}),
    "grid_pre_qk": ({"qk_norm": True}, {}),
    "grid_pre_z": ({}, {"z_loss": 1e-4}),
    "grid_pre_nowarm": ({}, {"warmup_steps": 0}),
    "grid_post": ({"placement": "post"}, {}),
    "grid_peri": ({"placement": "peri"}, {}),
    "grid_mix": ({"placement": "mix", "mix_alpha": 0.25}, {}),
    # dyt-vs-ln at each model's own best learning rate (the authors tune it per model): DyT with the authors'
    # LLaMA recipe and alpha0 of their width class closest to ours (7B, d = 4096: attention 0.8, FFN / final 0.2),
    # against LayerNorm with the same untied head
    "grid_dyt": (DYT_LLAMA, {}),
    "grid_ln_untied": ({"tie_embeddings": False}, {}),
    "grid_pre_adagc": ({}, {"clip": "adagc"}),  # AdaGC (Wang et al. 2025) instead of global clipping
    "grid_pre_stablemax": ({"output": "stablemax"}, {}),  # StableMax (Prieto et al. 2025) instead of softmax
}


ALL_VARIANTS = (*VARIANTS, *GRID_VARIANTS)


def is_grid(variant: str) -> bool:
    return variant in GRID_VARIANTS


def lr_dir(seed_dir: Path, lr: float) -> Path:
    """``SEED_DIR/lr<lr>``: one grid run of a variant and seed."""
    return seed_dir / f"lr{lr:g}"


def variant_config(variant: str, budget: Budget, seed: int, lr: float | None = None) -> dict[str, Any]:
    """The full config dict (``normlab.config.config_from_dict`` input) of one run (``lr``: a grid variant's
    learning rate)."""
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


def grid_config(variant: str, budget: Budget, seed: int, lr: float) -> dict[str, Any]:
    """The config dict of one grid run (the suite's ``variant_config`` with the grid's depth, steps and lr). With
    the quick budget it is the config of the demo preset's run of the same variant, lr and seed (``--reuse``); no
    ``train.threads`` (the claims workers set one thread themselves), as in the demo."""
    model_o, train_o = GRID_VARIANTS[variant]
    b = budget
    steps = b.grid_steps
    return {
        "seed": seed,
        "data": {"source": b.source, "tokenizer": "bytes"},
        "model": {"context": b.context, "width": b.width, "heads": b.heads, "depth": b.grid_depth,
                  "norm": "layernorm", "placement": "pre", **model_o},
        "train": {"steps": steps, "batch_size": b.batch_size, "lr": lr, "warmup_steps": b.grid_warmup,
                  "eval_every": steps, "eval_batches": b.grid_eval_batches, "log_every": max(1, steps // 12),
                  "checkpoint_every": steps, "keep_checkpoints": 1, **train_o},
        "diag": {"every": max(1, steps // 6)},
    }


_RUN_FIELDS = ("source", "steps", "batch_size", "context", "width", "heads", "warmup_steps", "lr", "eval_batches",
               "diag_every", "sample_sequences", "extrap_factors", "extrap_windows")
_GRID_FIELDS = ("source", "batch_size", "context", "width", "heads", "grid_lrs", "grid_depth", "grid_steps",
                "grid_warmup", "grid_eval_batches")


def recipe(variant: str) -> dict[str, Any]:
    """A variant's recipe as data, for a claim's pre-registered spec (``specs.spec_hash``): its overrides (a
    budget-dependent override evaluated on the ``full`` budget) and the ``full`` budget's fields its runs and
    measurements use (named explicitly, so a new budget field changes no hash)."""
    from normlab.experiments.claims.budgets import BUDGETS

    b = BUDGETS["full"]
    if variant in GRID_VARIANTS:
        model_o, train_o = GRID_VARIANTS[variant]
        return {"kind": "grid", "model": copy.deepcopy(model_o), "train": copy.deepcopy(train_o),
                "budget": {k: getattr(b, k) for k in _GRID_FIELDS}}
    deep, model_o, train_o = VARIANTS[variant]
    model_o = {k: (v(b) if callable(v) else copy.deepcopy(v)) for k, v in model_o.items()}
    return {"kind": "deep" if deep else "shallow", "model": model_o, "train": copy.deepcopy(train_o),
            "budget": {**{k: getattr(b, k) for k in _RUN_FIELDS}, "depth": b.deep_depth if deep else b.depth}}
