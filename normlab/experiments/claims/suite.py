"""The claims suite: each published claim as data (text, paper, metric, expected direction, the runs it needs)
plus a small function turning one seed's runs into one number. ``run_suite`` trains what is missing (reusing
complete runs in ``OUT/runs/<variant>/seed<k>``), measures every claim per seed and returns the verdicts.

Runs are shared between claims: e.g. the Pre-LN baseline ``ln`` serves the conversion, DyT, PowerNorm, linear
attention and extrapolation claims. Every run directory holds ``claims_spec.json`` (the exact config dict it was
trained from); a run is reused only when that spec matches and ``summary.json`` says completed or diverged.
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
# name -> (deep?, model overrides, train overrides). The shallow baseline is Pre-LN softmax with RoPE.
VARIANTS: dict[str, tuple[bool, dict, dict]] = {
    "ln": (False, {}, {}),
    "dyt": (False, {"norm": "dyt"}, {}),
    "powernorm": (False, {"norm": "powernorm"}, {}),
    "linear_conv": (False, {"attention": "linear", "linear_conv": 4}, {}),
    "softplus": (False, {"attention": "softplus"}, {}),
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
    requires: Callable[[], str | None] = lambda: None   # reason the claim cannot run yet, or None
    meaning: str = ""    # longer explanation for docs/claims.md


class Context:
    """Shared state of one suite run: the budget, loaded data per source, and cached per-run diagnostics."""

    def __init__(self, budget: Budget):
        self.budget = budget
        self._data: dict[str, Any] = {}
        self._diag: dict[str, dict] = {}

    def data(self, cfg) -> Any:
        from normlab.train.loop import load_data

        key = cfg.data.source
        if key not in self._data:
            self._data[key] = load_data(cfg)
        return self._data[key]

    def summary(self, run_dir: Path) -> dict:
        return read_json(run_dir / "summary.json", "summary")

    def diagnostics(self, run_dir: Path) -> dict | None:
        """Variance-by-depth and massive-activation statistics of a completed run on a fixed validation sample
        (normlab.diagnostics); cached in ``RUN_DIR/claims_diag.json``. None for a run that did not complete."""
        key = str(run_dir)
        if key in self._diag:
            return self._diag[key]
        if self.summary(run_dir).get("status") != "completed":
            return None
        path = run_dir / "claims_diag.json"
        if path.is_file():
            out = read_json(path, "claims diagnostics")
        else:
            from normlab.diagnostics.analyze import sample_sequences
            from normlab.diagnostics.capture import capture_stream
            from normlab.diagnostics.depth import variance_by_depth
            from normlab.diagnostics.massive import massive_by_block
            from normlab.rundir import load_run

            run = load_run(run_dir)
            data = self.data(run.cfg)
            idx, _, _ = sample_sequences(data.val, self.budget.sample_sequences, run.cfg.model.context)
            hidden = capture_stream(run.model, idx).hidden
            var = variance_by_depth(hidden)
            mas = massive_by_block(hidden)
            out = {"variance": var, "massive": {k: mas[k] for k in ("max_ratio", "max_abs", "any_flagged")},
                   "massive_ratio_by_block": [b["ratio"] for b in mas["blocks"]]}
            write_json(path, out)
        self._diag[key] = out
        return out


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
    from normlab.convert.crms_model import load_any_run
    from normlab.convert.exact import convert_model
    from normlab.convert.run import max_logit_diff

    src = load_any_run(runs["ln"])
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
    a, b = ctx.diagnostics(runs["deep_pre"]), ctx.diagnostics(runs["deep_peri"])
    if a is None or b is None or not a["massive"]["max_ratio"] or not b["massive"]["max_ratio"]:
        return None, {}
    ra, rb = a["massive"]["max_ratio"], b["massive"]["max_ratio"]
    return math.log10(ra / rb), {"max_ratio_pre": ra, "max_ratio_peri": rb,
                                 "max_abs_pre": a["massive"]["max_abs"], "max_abs_peri": b["massive"]["max_abs"]}


def grad_cv(run_dir: Path) -> float | None:
    """Mean over the training-time diagnostic records of the coefficient of variation (std / mean, population
    std) across blocks of the per-block gradient norm ``sqrt(|g_attn|^2 + |g_mlp|^2)``."""
    from normlab.diagnostics.analyze import training_records

    cvs = []
    for rec in training_records(run_dir):
        per = []
        l = 0
        while f"diag/grad_norm/attn/{l}" in rec or f"diag/grad_norm/mlp/{l}" in rec:
            per.append(math.sqrt(rec.get(f"diag/grad_norm/attn/{l}", 0.0) ** 2
                                 + rec.get(f"diag/grad_norm/mlp/{l}", 0.0) ** 2))
            l += 1
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


def m_extrap(ctx: Context, runs: dict[str, Path]) -> tuple[float | None, dict]:
    """Loss degradation ``loss(max factor) - loss(1x)`` (nats/token) of softmax minus that of softplus attention
    with LSSAR re-weighting switched on at evaluation (no fine-tuning), on the same validation tokens."""
    from normlab.attention import set_eval_options
    from normlab.eval.extrapolation import extrapolate
    from normlab.rundir import load_run

    b = ctx.budget
    fmax = max(b.extrap_factors)
    out, deg = {}, {}
    for name, reweight in (("softmax", None), ("softplus", False), ("softplus_lssar", True)):
        run_dir = runs["ln" if name == "softmax" else "softplus"]
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
                          max_tokens=int(mc.context * fmax * b.extrap_windows), batch_size=4)
        losses = {str(r["factor"]): r["loss"] for r in rep["results"]}
        out[f"loss_{name}"] = losses
        deg[name] = losses[str(rep["results"][-1]["factor"])] - losses[str(rep["results"][0]["factor"])]
    return deg["softmax"] - deg["softplus_lssar"], {**out, "degradation": deg, "max_factor": fmax}


def _need_attention(kind: str, key: str | None = None) -> Callable[[], str | None]:
    def check() -> str | None:
        from dataclasses import fields as dfields

        from normlab.model.config import ATTENTIONS, ModelConfig

        if kind not in ATTENTIONS:
            return f"model.attention '{kind}' is not implemented yet"
        if key and key not in {f.name for f in dfields(ModelConfig)}:
            return f"config key model.{key} does not exist yet"
        return None
    return check


CLAIMS: list[Claim] = [
    Claim("exact-conversion", "Pre-LN, Pre-RMSNorm and Pre-CRMSNorm compute the same function",
          "Jiang et al. 2023 (arXiv:2305.14858)", "max |logit diff| after converting a trained Pre-LN run to "
          "Pre-RMSNorm and Pre-CRMSNorm (fp32, 4 validation windows)", "<= 1e-4", "exact", ("ln",), m_exact,
          tolerance=1e-4, meaning="Each seed's trained Pre-LN model is converted in memory (normlab.convert."
          "convert_model) to Pre-RMSNorm and to Pre-CRMSNorm; the value is the larger of the two max |logit "
          "differences|. Held when every seed is within the tolerance 1e-4."),
    Claim("cod-growth", "In Pre-LN the residual-stream variance grows with depth",
          "Sun et al. 2025, The Curse of Depth (arXiv:2502.05795)", "slope of ln(var) of block outputs vs block "
          "index, deep Pre-LN (nats/block)", "> 0", "greater", ("deep_pre",), m_growth,
          meaning="Least-squares slope of ln(variance of the residual stream after block l) against l, pooled over "
                  "a fixed validation sample (normlab.diagnostics.depth, log_var_slope_blocks). exp(slope) is the "
                  "growth factor per block."),
    Claim("cod-lns", "LayerNorm Scaling reduces the variance growth of Pre-LN",
          "Sun et al. 2025, The Curse of Depth (arXiv:2502.05795)", "slope(Pre-LN) - slope(Pre-LN + LayerNorm "
          "Scaling), deep models (nats/block)", "> 0", "greater", ("deep_pre", "deep_lns"), m_diff_slope("deep_lns"),
          meaning="Same slope as cod-growth, Pre-LN minus Pre-LN with 1/sqrt(l) on input-norm outputs; positive = "
                  "LayerNorm Scaling grows more slowly."),
    Claim("peri-massive", "Peri-LN shows smaller massive activations than Pre-LN",
          "Kim et al. 2025, Peri-LN (arXiv:2502.02732)", "log10(max_l top|h|/median|h| of Pre-LN / of Peri-LN), deep "
          "models", "> 0", "greater", ("deep_pre", "deep_peri"), m_massive,
          meaning="Massive-activation ratio (Sun et al. 2024: top |h| over median |h| of a block output; "
                  "normlab.diagnostics.massive), the largest over blocks; value = log10(Pre-LN ratio / Peri-LN "
                  "ratio); positive = Peri-LN smaller."),
    Claim("peri-variance", "Peri-LN has more even (slower) variance growth with depth than Pre-LN",
          "Kim et al. 2025, Peri-LN (arXiv:2502.02732)", "slope(Pre-LN) - slope(Peri-LN) of ln(var) vs block "
          "(nats/block)", "> 0", "greater", ("deep_pre", "deep_peri"), m_diff_slope("deep_peri"),
          meaning="As cod-lns with Peri-LN (input and output norms around each sublayer) in place of LayerNorm "
                  "Scaling."),
    Claim("mixln-grad", "Mix-LN makes gradient norms more uniform across depth than Pre-LN",
          "Li et al. 2024, Mix-LN (arXiv:2412.13795)", "CV across blocks of per-block grad norm: Pre-LN - Mix-LN "
          "(mean over training)", "> 0", "greater", ("deep_pre", "deep_mix"), m_mix,
          meaning="Per-block gradient norm sqrt(|g_attn|^2 + |g_mlp|^2) recorded during training every diag.every "
                  "steps (before clipping); coefficient of variation (std/mean) across blocks, averaged over the "
                  "records; value = CV(Pre-LN) - CV(Mix-LN, alpha 0.25); positive = Mix-LN more uniform."),
    Claim("postln-warmup", "Deep Post-LN without warm-up trains worse (or diverges) where Pre-LN does not",
          "Xiong et al. 2020, On Layer Normalization in the Transformer Architecture (arXiv:2002.04745)",
          "val bpb(Post-LN) - bpb(Pre-LN), deep, no LR warm-up (diverged = 8 bpb)", "> 0", "greater",
          ("deep_post_nowarm", "deep_pre_nowarm"), m_bpb_diff("deep_post_nowarm", "deep_pre_nowarm"),
          meaning="Both deep models trained with train.warmup_steps=0 at the same peak LR; final validation "
                  "bits/byte difference. A diverged run scores the uniform model (log2 vocab = 8 bits/byte)."),
    Claim("dyt-vs-ln", "DyT reaches the loss of LayerNorm within a small margin",
          "Zhu et al. 2025, Transformers without Normalization (arXiv:2503.10622)", "val bpb(DyT) - bpb(LayerNorm), "
          "Pre placement", "|Δ| < 0.05", "within", ("ln", "dyt"), m_bpb_diff("dyt", "ln"), margin=0.05,
          meaning="Equivalence test: held when the whole 95% CI of bpb(DyT) - bpb(LN) lies inside ±0.05 bits/byte; "
                  "not held when it lies entirely outside. DyT with the library defaults (alpha init 0.5, learnable "
                  "embedding scale from 1/init_std; docs/norms.md measures the final DyT as the remaining gap)."),
    Claim("lssar-extrapolation", "Softplus attention with re-weighting keeps loss flatter than softmax up to 16x the "
          "training length", "Gao & Huang 2025, Softplus Attention with Re-weighting (repo iminfine/freeatten)",
          "loss(16x) - loss(1x) [nats/token]: softmax - softplus+LSSAR", "> 0", "greater", ("ln", "softplus"),
          m_extrap, requires=_need_attention("softplus", "lssa_reweight"),
          meaning="Both models trained at the same context with RoPE; evaluated on the same validation tokens with "
                  "non-overlapping windows of 1x and 16x the training context (normlab.eval.extrapolation); the "
                  "softplus model with model.lssa_reweight=true at evaluation only. Value = softmax degradation "
                  "minus softplus+LSSAR degradation; positive = flatter with LSSAR."),
    Claim("powernorm-lm", "PowerNorm gives lower loss than LayerNorm on language modelling",
          "Shen et al. 2020, PowerNorm (arXiv:2003.07845)", "val bpb(LayerNorm) - bpb(PowerNorm)", "> 0", "greater",
          ("ln", "powernorm"), m_bpb_diff("ln", "powernorm"),
          meaning="Final validation bits/byte; positive = PowerNorm better (the paper reports lower perplexity)."),
    Claim("linear-attention", "Causal linear attention with division normalisation and a value conv is "
          "competitive with softmax at equal parameters", "Wang et al. 2026, LINA",
          "bpb(linear+conv) / bpb(softmax) - 1", "< 0.05", "less", ("ln", "linear_conv"), m_linear, null=0.05,
          requires=_need_attention("linear", "linear_conv"),
          meaning="Linear attention (relu kernel, division normalisation, causal prefix sums) with a depthwise "
                  "causal value conv of size 4 vs softmax at the same width/depth (the conv adds 4 x width "
                  "parameters per block, reported); competitive = relative bpb gap below 5%: held when the CI's "
                  "upper end is below 0.05, not held when its lower end is above."),
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


def is_complete(run_dir: Path, cfg: dict) -> bool:
    spec, summ = run_dir / "claims_spec.json", run_dir / "summary.json"
    if not (spec.is_file() and summ.is_file()):
        return False
    try:
        return (json.loads(spec.read_text()) == spec_record(cfg)
                and json.loads(summ.read_text()).get("status") in ("completed", "diverged"))
    except (OSError, json.JSONDecodeError):
        return False


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
            reuse: Path | None = None) -> None:
    """Train ``jobs`` ``(variant, seed, cfg, run_dir)`` with ``workers`` processes (1 = in this process); with
    ``reuse`` (a sweep directory) runs it holds are copied (waited for while that sweep trains them), and the
    jobs it does not hold are trained first."""
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
              reuse: Path | None = None) -> dict:
    """Train what is missing, measure every claim per seed, return ``{claims: [...], ...}`` (also written to
    ``OUT/claims.json``)."""
    import torch

    n_seeds = seeds if seeds is not None else budget.seeds
    if n_seeds < 1:
        raise NormlabError(f"--seeds must be >= 1, got {n_seeds}")
    t0 = time.time()
    out.mkdir(parents=True, exist_ok=True)
    skipped = {c.name: c.requires() for c in claims}
    needed = sorted({v for c in claims if not skipped[c.name] for v in c.variants})
    jobs, reused = [], 0
    for seed in range(n_seeds):
        for v in needed:
            for lr in (budget.grid_lrs if v in GRID_VARIANTS else (None,)):
                cfg = variant_config(v, budget, seed, lr)
                rd = run_dir_for(out, v, seed, lr)
                if is_complete(rd, cfg):
                    reused += 1
                else:
                    jobs.append((v if lr is None else f"{v}@lr{lr:g}", seed, cfg, rd))
    log(f"claims ({budget.name}): {len(claims)} claim(s), {n_seeds} seed(s), {len(jobs)} run(s) to train, "
        f"{reused} reused, {workers} worker(s) -> {out}")
    t_train = time.time()
    execute(jobs, workers, log, reuse)
    train_s = time.time() - t_train
    torch.set_num_threads(1)
    ctx = Context(budget)
    results = []
    for c in claims:
        base = {"name": c.name, "claim": c.claim, "paper": c.paper, "metric": c.metric, "expected": c.expected}
        if skipped[c.name]:
            results.append({**base, "measured": None, "ci": None, "verdict": "inconclusive", "n": 0,
                            "reason": skipped[c.name], "values": [], "seeds": [], "details": [], "runs": []})
            continue
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
