"""Learning-rate sweep claims (Wortsman et al. 2023, "Small-scale proxies for large-scale Transformer training
instabilities", arXiv:2309.14322), measured the paper's way: every variant trained at each learning rate of the
budget's grid (``Budget.grid_lrs``), one number per seed from the whole grid.

- LR sensitivity (normlab.report.lrgrid): ``mean_lr [min(L(lr), L_init) - L*]`` in bits/byte, ``L`` the final
  validation bits/byte, ``L_init`` the validation bits/byte at initialisation (``init_val_bpb`` in summary.json),
  a diverged run scoring ``L_init``.
- Output logit divergence: ``|mean logsumexp(logits)|`` (``diag/output_lse``) at the last diagnostic step of the run
  at the grid's highest learning rate (normlab.diagnostics.instability).

Run directories: ``OUT/runs/<variant>/seed<k>/lr<lr>``; a measurement gets ``OUT/runs/<variant>/seed<k>``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

# name -> (model overrides, train overrides); all Pre-LN LayerNorm unless overridden, depth Budget.grid_depth
GRID_VARIANTS: dict[str, tuple[dict, dict]] = {
    "grid_pre": ({}, {}),
    "grid_pre_qk": ({"qk_norm": True}, {}),
    "grid_pre_z": ({}, {"z_loss": 1e-4}),
    "grid_pre_nowarm": ({}, {"warmup_steps": 0}),
    "grid_post": ({"placement": "post"}, {}),
    "grid_peri": ({"placement": "peri"}, {}),
    "grid_mix": ({"placement": "mix", "mix_alpha": 0.25}, {}),
}


def lr_dir(seed_dir: Path, lr: float) -> Path:
    return seed_dir / f"lr{lr:g}"


def seed_grid(ctx: Any, seed_dir: Path) -> tuple[float, float, float, dict]:
    """``(LR sensitivity, best loss L*, best lr, details)`` of one variant and seed over ``ctx.budget.grid_lrs``."""
    from normlab.report.lrgrid import lr_sensitivity

    losses, inits, status = {}, [], {}
    for lr in ctx.budget.grid_lrs:
        s = ctx.summary(lr_dir(seed_dir, lr))
        status[f"{lr:g}"] = s.get("status")
        v = s.get("val_bpb")
        losses[lr] = float(v) if s.get("status") == "completed" and isinstance(v, (int, float)) else None
        if isinstance(s.get("init_val_bpb"), (int, float)):
            inits.append(float(s["init_val_bpb"]))
    init = sum(inits) / len(inits)
    sens, best, best_lr = lr_sensitivity(losses, init)
    return sens, best, best_lr, {"final_bpb": {f"{k:g}": v for k, v in losses.items()}, "init_bpb": init,
                                 "status": status}


def m_sens_diff(a: str, b: str) -> Callable:
    """``sensitivity(a) - sensitivity(b)``."""
    def m(ctx: Any, runs: dict[str, Path]) -> tuple[float | None, dict]:
        sa, ba, la, da = seed_grid(ctx, runs[a])
        sb, bb, lb, db = seed_grid(ctx, runs[b])
        return sa - sb, {f"sens_{a}": sa, f"sens_{b}": sb, f"best_lr_{a}": la, f"best_lr_{b}": lb,
                         f"bpb_{a}": da["final_bpb"], f"bpb_{b}": db["final_bpb"], "init_bpb": da["init_bpb"]}
    return m


def m_best_diff(a: str, b: str) -> Callable:
    """``L*(a) - L*(b)``: best-of-grid final validation bits/byte."""
    def m(ctx: Any, runs: dict[str, Path]) -> tuple[float | None, dict]:
        sa, ba, la, da = seed_grid(ctx, runs[a])
        sb, bb, lb, db = seed_grid(ctx, runs[b])
        return ba - bb, {f"best_{a}": ba, f"best_{b}": bb, f"best_lr_{a}": la, f"best_lr_{b}": lb}
    return m


def last_lse(run_dir: Path) -> float | None:
    from normlab.rundir import read_metrics

    pts = [(s, v) for s, k, v in read_metrics(run_dir / "metrics.jsonl") if k == "diag/output_lse"]
    return max(pts)[1] if pts else None


def m_zloss(ctx: Any, runs: dict[str, Path]) -> tuple[float | None, dict]:
    """``|log Z|(Pre-LN) - |log Z|(Pre-LN + z-loss)`` at the grid's highest learning rate."""
    top = max(ctx.budget.grid_lrs)
    a, b = last_lse(lr_dir(runs["grid_pre"], top)), last_lse(lr_dir(runs["grid_pre_z"], top))
    if a is None or b is None:
        return None, {"reason": "no diag/output_lse recorded (diag.every = 0?)"}
    return abs(a) - abs(b), {"lse_pre": a, "lse_pre_z": b, "lr": top}


def grid_claims(Claim: type) -> list:
    """The claims, built with the suite's ``Claim`` class (passed in to avoid a circular import)."""
    w = "Wortsman et al. 2023, Small-scale proxies for large-scale Transformer training instabilities (arXiv:2309.14322)"
    sens = ("LR sensitivity = mean over the learning-rate grid of min(L, L_init) - L* (bits/byte; L final validation "
            "bits/byte, L_init at initialisation, a diverged run scores L_init, L* the best of the grid), per seed.")
    return [
        Claim("qk-lr-sensitivity", "QK-norm lowers the learning-rate sensitivity of Pre-LN", w,
              "LR sensitivity(Pre-LN) - LR sensitivity(Pre-LN + QK-norm), bits/byte", "> 0", "greater",
              ("grid_pre", "grid_pre_qk"), m_sens_diff("grid_pre", "grid_pre_qk"),
              meaning=sens + " QK-norm: RMSNorm on queries and keys per head (model.qk_norm). Positive = QK-norm less "
                             "sensitive (the paper's attention-logit-growth fix)."),
        Claim("zloss-logit-divergence", "z-loss keeps the output logits from diverging at a high learning rate", w,
              "|mean logsumexp(logits)| at the end, highest grid lr: Pre-LN - Pre-LN + z-loss 1e-4", "> 0", "greater",
              ("grid_pre", "grid_pre_z"), m_zloss,
              meaning="Output logit divergence (paper section 3.2): log Z = logsumexp of the output logits drifts "
                      "away from 0; the z-loss 1e-4 log^2 Z (train.z_loss) holds it near 0. Value: |log Z| of "
                      "Pre-LN minus that of Pre-LN + z-loss, mean over positions at the last diagnostic step of "
                      "the run at the highest learning rate of the grid. Positive = z-loss keeps log Z nearer 0."),
        Claim("warmup-lr-sensitivity", "Learning-rate warm-up lowers the learning-rate sensitivity", w,
              "LR sensitivity(Pre-LN, no warm-up) - LR sensitivity(Pre-LN, warm-up 10% of steps), bits/byte", "> 0",
              "greater", ("grid_pre_nowarm", "grid_pre"), m_sens_diff("grid_pre_nowarm", "grid_pre"),
              meaning=sens + " Warm-up: linear over the first 10% of the steps (train.warmup_steps) vs none."),
        Claim("postln-lr-sensitivity", "Post-LN is more sensitive to the learning rate than Pre-LN",
              "Xiong et al. 2020, On Layer Normalization in the Transformer Architecture (arXiv:2002.04745)",
              "LR sensitivity(Post-LN) - LR sensitivity(Pre-LN), bits/byte", "> 0", "greater",
              ("grid_post", "grid_pre"), m_sens_diff("grid_post", "grid_pre"),
              meaning=sens + " The Post-LN vs Pre-LN claim re-measured over a learning-rate grid instead of one "
                             "learning rate without warm-up (postln-warmup)."),
        Claim("peri-lr-sensitivity", "Peri-LN is less sensitive to the learning rate than Pre-LN",
              "Kim et al. 2025, Peri-LN (arXiv:2502.02732)", "LR sensitivity(Pre-LN) - LR sensitivity(Peri-LN), "
              "bits/byte", "> 0", "greater", ("grid_pre", "grid_peri"), m_sens_diff("grid_pre", "grid_peri"),
              meaning=sens + " Peri-LN normalises each sublayer's input and output; the paper reports more stable "
                             "training across learning rates."),
        Claim("mixln-lr-best", "Mix-LN reaches a lower best-of-grid loss than Pre-LN",
              "Li et al. 2024, Mix-LN (arXiv:2412.13795)", "L*(Pre-LN) - L*(Mix-LN): best final validation bits/byte "
              "over the learning-rate grid", "> 0", "greater", ("grid_pre", "grid_mix"),
              m_best_diff("grid_pre", "grid_mix"),
              meaning="Best final validation bits/byte over the grid per seed (each variant at its own best learning "
                      "rate), Pre-LN minus Mix-LN (alpha 0.25: Post-LN in the first quarter of the blocks). "
                      "Positive = Mix-LN better, as the paper reports."),
    ]


def grid_claim_names() -> set[str]:
    from normlab.experiments.claims.suite import CLAIMS

    return {c.name for c in CLAIMS if any(v in GRID_VARIANTS for v in c.variants)}


def is_grid(variant: str) -> bool:
    return variant in GRID_VARIANTS


def grid_config(variant: str, budget: Any, seed: int, lr: float) -> dict[str, Any]:
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


# -- reusing a sweep's runs (normlab claims --reuse SWEEP_DIR) -----------------------------------------------------
def _resolved_key(cfg: dict[str, Any]) -> str:
    import copy
    import json

    from normlab.config import config_from_dict

    return json.dumps(config_from_dict(copy.deepcopy(cfg)).to_dict(), sort_keys=True)


def find_reusable(sweep_dir: Path, cfg: dict[str, Any], wait_s: float = 7200.0) -> Path | None:
    """The run directory in ``sweep_dir`` (a ``normlab compare`` directory) trained from exactly the resolved config
    of ``cfg`` that finished (completed or diverged), or None. A matching run that is still pending or running in a
    sweep that is in progress is waited for (polling its store, up to ``wait_s``), so a claims run can share the
    runs of a demo that has not finished yet instead of training them twice."""
    import fcntl
    import time

    from normlab.experiments.store import FINAL, Store

    store = Store(sweep_dir / "results.sqlite")
    key = _resolved_key(cfg)
    t0 = time.time()
    while True:
        match = [r for r in store.runs() if _resolved_key(r["config"]) == key]
        if not match:
            return None
        done = [r for r in match if r["status"] in FINAL]
        if done:
            from normlab.fingerprint import check_run

            src = sweep_dir / "runs" / done[0]["run_id"]
            return src if check_run(src) is None else None  # the current code would not reproduce it: train
        try:  # is a compare still running in that directory?
            with open(sweep_dir / ".compare.lock", "a+") as f:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                fcntl.flock(f, fcntl.LOCK_UN)
            return None  # nobody is training it: the caller trains
        except OSError:
            pass
        if time.time() - t0 > wait_s:
            return None
        time.sleep(10)


def registered_in(sweep_dir: Path, cfg: dict[str, Any]) -> bool:
    """Whether ``sweep_dir``'s store has a run (any status) with the resolved config of ``cfg``."""
    from normlab.experiments.store import Store

    key = _resolved_key(cfg)
    return any(_resolved_key(r["config"]) == key for r in Store(sweep_dir / "results.sqlite").runs())
