"""The runs the claims suite trains: each variant a named config (``Variant``: its depth class and its model and
train overrides, by keyword), and the full config of one run.

- ``VARIANTS``: the single-learning-rate runs (``depth`` ``shallow``: Pre-LN LayerNorm softmax with RoPE at
  ``Budget.depth`` blocks; ``deep``: ``Budget.deep_depth`` blocks);
- ``GRID_VARIANTS``: the learning-rate sweep runs (Wortsman et al. 2023, arXiv:2309.14322), each trained at every
  ``Budget.grid_lrs`` with ``Budget.grid_depth`` blocks (``depth`` ``grid``).

A model override may be a function of the budget (PowerNorm's groups = the budget's heads); ``recipe`` evaluates
it on the ``full`` budget for a claim's spec hash.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from normlab.config import planned_config
from normlab.experiments.claims.budgets import BUDGETS, Budget
from normlab.model.flops import count_flops

DEPTHS = ("shallow", "deep", "grid")


@dataclass(frozen=True)
class Variant:
    """One named run config of the suite: ``depth`` one of ``DEPTHS``; ``model`` / ``train``: overrides of the
    suite's base config (``model.*`` / ``train.*`` keys; a value may be a function of the ``Budget``)."""

    name: str
    depth: str
    model: dict[str, Any] = field(default_factory=dict)
    train: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.depth not in DEPTHS:
            raise ValueError(f"variant {self.name}: depth must be one of {DEPTHS}, got {self.depth!r}")

    def model_overrides(self, budget: Budget) -> dict[str, Any]:
        """The model overrides with every budget-dependent value evaluated on ``budget`` (copies)."""
        return {k: (v(budget) if callable(v) else copy.deepcopy(v)) for k, v in self.model.items()}

    def train_overrides(self, budget: Budget) -> dict[str, Any]:
        """The train overrides with every budget-dependent value evaluated on ``budget`` (nGPT's quarter of the
        grid's steps)."""
        return {k: (v(budget) if callable(v) else copy.deepcopy(v)) for k, v in self.train.items()}


# DyT, the authors' LLaMA recipe (jiachenzhu/DyT other_tasks/LLaMA/fms_fsdp/models/llama.py and README): untied LM
# head (tie_heads False), no DyT bias, per-site alpha init set for the model's width as the paper recommends
# (alpha_init: auto, Zhu et al. 2025 Tables 10-11: 1.0 / 1.0 at width <= 1024, their 7B's 0.8 / 0.2 at 4096), and a
# learnable scalar after the token embedding (shared_scale) initialised to sqrt(d) at their d = 4096, i.e. 64: with
# N(0, 0.02) embeddings the stream starts at RMS 1.28 as theirs (sqrt(64) = 8 would start it at 0.16). Its baseline
# is the same model with LayerNorm (untied head, no embedding scale).
DYT_LLAMA = {"norm": "dyt", "tie_embeddings": False, "embed_scale": "learnable", "embed_scale_init": 64.0,
             "norm_options": {"bias": False, "alpha_init": "auto"}}
MIX_LN = {"placement": "mix", "mix_alpha": 0.25}
# the residual-stream papers (docs/streams.md): hyper-connections with 4 streams, dynamic (Zhu et al. 2025,
# their LM runs: n = 4, DHC), mHC with the paper's 20 Sinkhorn iterations; nGPT with what it requires (no norm at any
# site, untied head) and its recipe's training side: no weight decay, no warm-up (NVIDIA/ngpt train.py)
HC = {"residual": "hc", "streams": 4}
MHC = {"residual": "mhc", "streams": 4, "sinkhorn_iters": 20}
NGPT = {"residual": "ngpt", "norm": "none", "tie_embeddings": False}
NGPT_TRAIN = {"weight_decay": 0.0, "warmup_steps": 0}


def _quarter_steps(b: Budget) -> int:
    return max(1, b.grid_steps // 4)  # Mix-LN (Li et al. 2024): Post-LN in the first quarter of blocks


def _equal_flops_steps(b: Budget) -> int:
    """HC's steps at Pre-LN's training FLOPs: ``round(grid_steps * F(Pre-LN) / F(HC))``, F the training FLOPs per
    token of each grid model (``normlab.model.flops.count_flops``: HC's stream mixing and dynamic maps counted) --
    the same batch and context, so the same tokens per step, fewer steps."""
    def training_flops(model: dict[str, Any]) -> float:
        cfg = planned_config({"data": {"source": b.source, "tokenizer": "bytes"},
                                "model": {"context": b.context, "width": b.width, "heads": b.heads,
                                          "depth": b.grid_depth, "norm": "layernorm", "placement": "pre", **model}})
        return count_flops(cfg.model).training

    return max(1, round(b.grid_steps * training_flops({}) / training_flops(HC)))


def _heads_groups(b: Budget) -> dict[str, int]:
    return {"groups": b.heads}


_SINGLE = (
    Variant("ln", "shallow"),
    Variant("ln_untied", "shallow", model={"tie_embeddings": False}),
    Variant("dyt", "shallow", model=DYT_LLAMA),
    # PowerNorm as in the authors' transformer (sIncerass/powernorm fairseq/modules/norm_select.py:
    # MaskPowerNorm(embed_dim, group_num=head_num, ...)): group scaling with groups = attention heads
    Variant("powernorm", "shallow", model={"norm": "powernorm", "norm_options": _heads_groups}),
    # LINA's locality branch: causal depthwise conv of the attention input (techmonsterwang/LINA dw_conv)
    Variant("linear_conv", "shallow", model={"attention": "linear", "linear_conv": 4, "linear_conv_source": "input"}),
    Variant("softplus", "shallow", model={"attention": "softplus"}),
    # division-normalised linear attention without extras vs TransNormer's NormAttention (Qin et al. 2022)
    Variant("linear", "shallow", model={"attention": "linear"}),
    Variant("transnormer", "shallow", model={"attention": "transnormer"}),
    # softplus attention trained with LSSAR re-weighting on, as the paper trains it
    Variant("softplus_lssar", "shallow", model={"attention": "softplus", "lssa_reweight": True}),
    Variant("deep_pre", "deep"),
    Variant("deep_lns", "deep", model={"layernorm_scaling": True}),
    Variant("deep_peri", "deep", model={"placement": "peri"}),
    Variant("deep_mix", "deep", model=MIX_LN),
    Variant("deep_pre_nowarm", "deep", train={"warmup_steps": 0}),
    Variant("deep_post_nowarm", "deep", model={"placement": "post"}, train={"warmup_steps": 0}),
    # DeepNorm (Wang et al. 2022): the deep Post-LN model with alpha / beta, under the same no-warm-up stress
    Variant("deep_deepnorm_nowarm", "deep", model={"placement": "deepnorm"}, train={"warmup_steps": 0}),
)
_GRID = (
    Variant("grid_pre", "grid"),
    Variant("grid_pre_qk", "grid", model={"qk_norm": True}),
    Variant("grid_pre_z", "grid", train={"z_loss": 1e-4}),
    Variant("grid_pre_nowarm", "grid", train={"warmup_steps": 0}),
    Variant("grid_post", "grid", model={"placement": "post"}),
    Variant("grid_peri", "grid", model={"placement": "peri"}),
    Variant("grid_mix", "grid", model=MIX_LN),
    # dyt-vs-ln at each model's own best learning rate (the authors tune it per model): DyT with the authors'
    # LLaMA recipe and alpha0 of their width class closest to ours (7B, d = 4096: attention 0.8, FFN / final 0.2),
    # against LayerNorm with the same untied head
    Variant("grid_dyt", "grid", model=DYT_LLAMA),
    Variant("grid_ln_untied", "grid", model={"tie_embeddings": False}),
    Variant("grid_pre_adagc", "grid", train={"clip": "adagc"}),  # AdaGC (Wang et al. 2025) instead of global clipping
    Variant("grid_pre_stablemax", "grid", model={"output": "stablemax"}),  # StableMax (Prieto et al. 2025)
    Variant("grid_hc", "grid", model=HC),
    Variant("grid_mhc", "grid", model=MHC),
    # HC at Pre-LN's training FLOPs: fewer steps of the same batch (its stream mixing and dynamic maps cost more per
    # token), warm-up and cosine schedule over its own steps
    Variant("grid_hc_flops", "grid", model=HC, train={"steps": _equal_flops_steps}),
    # nGPT trained for a quarter of the grid's steps (the paper: the same loss in 4-20x fewer steps)
    Variant("grid_ngpt_quarter", "grid", model=NGPT, train={**NGPT_TRAIN, "steps": _quarter_steps}),
    # Derf and DyT in the Derf authors' GPT-2 recipe (zlab-princeton/Derf, language model/model_derf.patch): tied
    # head, bias, alpha 1.0 at every site, a learnable scalar on the embeddings (embed_scale auto); only the
    # function differs
    Variant("grid_derf", "grid", model={"norm": "derf"}),
    Variant("grid_dyt_gpt2", "grid", model={"norm": "dyt", "norm_options": {"alpha_init": 1.0}}),
)
VARIANTS: dict[str, Variant] = {v.name: v for v in _SINGLE}
GRID_VARIANTS: dict[str, Variant] = {v.name: v for v in _GRID}
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
    v = VARIANTS[variant]
    b = budget
    deep = v.depth == "deep"
    cfg = {
        "seed": seed,
        "data": {"source": b.source, "tokenizer": "bytes"},
        "model": {"context": b.context, "width": b.width, "heads": b.heads,
                  "depth": b.deep_depth if deep else b.depth, "norm": "layernorm", "placement": "pre",
                  **v.model_overrides(b)},
        "train": {"steps": b.steps, "batch_size": b.batch_size, "lr": b.lr, "warmup_steps": b.warmup_steps,
                  "eval_every": b.steps, "eval_batches": b.eval_batches, "log_every": max(1, b.steps // 10),
                  "checkpoint_every": b.steps, "keep_checkpoints": 1, "threads": 1, **v.train_overrides(b)},
        "diag": {"every": b.diag_every if deep else 0},
    }
    return {**cfg, "device": b.device} if b.device else cfg


def grid_config(variant: str, budget: Budget, seed: int, lr: float) -> dict[str, Any]:
    """The config dict of one grid run (the suite's ``variant_config`` with the grid's depth, steps and lr); no
    ``train.threads`` (the claims workers set one thread themselves), as in a ``normlab compare`` sweep, so
    ``--reuse`` can match a sweep's run of the same resolved config."""
    v = GRID_VARIANTS[variant]
    b = budget
    train = v.train_overrides(b)
    steps = train.get("steps", b.grid_steps)
    return {
        "seed": seed,
        "data": {"source": b.source, "tokenizer": "bytes"},
        "model": {"context": b.context, "width": b.width, "heads": b.heads, "depth": b.grid_depth,
                  "norm": "layernorm", "placement": "pre", **v.model_overrides(b)},
        "train": {"steps": steps, "batch_size": b.batch_size, "lr": lr, "warmup_steps": b.grid_warmup,
                  "eval_every": steps, "eval_batches": b.grid_eval_batches, "log_every": max(1, steps // 12),
                  "checkpoint_every": steps, "keep_checkpoints": 1, **train},
        "diag": {"every": max(1, steps // 6)},
        **({"device": b.device} if b.device else {}),
    }


_RUN_FIELDS = ("source", "steps", "batch_size", "context", "width", "heads", "warmup_steps", "lr", "eval_batches",
               "diag_every", "sample_sequences", "extrap_factors", "extrap_windows")
_GRID_FIELDS = ("source", "batch_size", "context", "width", "heads", "grid_lrs", "grid_depth", "grid_steps",
                "grid_warmup", "grid_eval_batches")


def recipe(variant: str) -> dict[str, Any]:
    """A variant's recipe as data, for a claim's pre-registered spec (``specs.spec_hash``): its overrides (a
    budget-dependent override evaluated on the ``full`` budget) and the ``full`` budget's fields its runs and
    measurements use (named explicitly, so a new budget field changes no hash)."""
    b = BUDGETS["full"]
    v = GRID_VARIANTS.get(variant) or VARIANTS[variant]
    if v.depth == "grid":
        return {"kind": "grid", "model": v.model_overrides(b), "train": v.train_overrides(b),
                "budget": {k: getattr(b, k) for k in _GRID_FIELDS}}
    return {"kind": v.depth, "model": v.model_overrides(b), "train": v.train_overrides(b),
            "budget": {**{k: getattr(b, k) for k in _RUN_FIELDS}, "depth": b.deep_depth if v.depth == "deep"
                       else b.depth}}
