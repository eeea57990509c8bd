"""The claims' measurements: plain functions ``m_<name>(ctx, runs, *args) -> (value | None, details)`` turning one
seed's run directories (``runs``: variant -> run directory) into the number a claim's verdict is computed from
(None when a run did not complete), plus the ``Context`` they share (the budget, loaded data, cached
diagnostics). Each is registered by name (``measure_registry.register_measure``; a claim definition names it);
importing this module registers them all (``MEASURES``): the learning-rate grid's measurements are in
``measures_lr.py``, the model-surgery ones in ``measures_surgery.py``, the seed literature's in
``measures_literature.py``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from normlab.attention import set_eval_options
from normlab.convert.exact import convert_model
from normlab.convert.run import max_logit_diff
from normlab.diagnostics.analyze import sample_sequences, training_records
from normlab.diagnostics.capture import capture_stream
from normlab.diagnostics.depth import variance_by_depth
from normlab.diagnostics.massive import massive_by_block
from normlab.eval.extrapolation import extrapolate
from normlab.experiments.claims.budgets import Budget
from normlab.experiments.claims import measures_literature, measures_lr, measures_surgery  # noqa: F401 (registers)
from normlab.decide.guard import LEARN_KEY
from normlab.experiments.claims.measure_registry import MEASURES, get_measure, register_measure  # noqa: F401
from normlab.experiments.claims.measures_lr import unigram_bpb
from normlab.io import read_json, write_json
from normlab.model import build_model
from normlab.names import block_grad_norms
from normlab.rundir.files import SUMMARY_FILE
from normlab.rundir.readers import load_data, load_run, open_config
from normlab.stats.learning import DID_NOT_LEARN_MARGIN, collapsed


class Context:
    """Shared state of one suite run: the budget, loaded data per source, and cached per-run diagnostics."""

    def __init__(self, budget: Budget):
        self.budget = budget
        self._data: dict[str, Any] = {}
        self._diag: dict[str, dict] = {}

    def data(self, cfg) -> Any:

        key = cfg.data.source
        if key not in self._data:
            self._data[key] = load_data(cfg)
        return self._data[key]

    def summary(self, run_dir: Path) -> dict:
        return read_json(run_dir / SUMMARY_FILE, "summary")

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


            run = load_run(run_dir)
            model = run.model
            if at_init:

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

    vocab = ctx.data(open_config(run_dir)).vocab_size
    return math.log2(vocab), {"status": s.get("status"), "diverged_at": s.get("step")}


# --------------------------------------------------------------------------------------------- measurements
@register_measure("exact")
def m_exact(ctx: Context, runs: dict[str, Path]) -> tuple[float | None, dict]:

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


@register_measure("growth")
def m_growth(ctx: Context, runs: dict[str, Path]) -> tuple[float | None, dict]:
    """The slope of ln(var) over depth of deep Pre-LN at the end of training; details: the same slope at the
    run's own seeded initialisation (``slope_init_pre``) and what training changed (``pre_slope_change``, the
    claim's observability rule: a state present at initialisation is not evidence about training)."""
    s = _slope(ctx, runs["deep_pre"])
    init = ctx.diagnostics(runs["deep_pre"], at_init=True)
    if s is None or init is None:
        return s, {"slope_pre": s}
    s0 = init["variance"]["log_var_slope_blocks"]
    return s, {"slope_pre": s, "slope_init_pre": s0, "pre_slope_change": s - s0}


@register_measure("diff_slope")
def m_diff_slope(ctx: Context, runs: dict[str, Path], other: str) -> tuple[float | None, dict]:
    """``slope(deep_pre) - slope(other)`` of ln(var) over depth; details: the same difference at the runs' own
    seeded initialisation (``diff_init``: a state claim is judged on what training changed, normlab.decide)."""
    a, b = _slope(ctx, runs["deep_pre"]), _slope(ctx, runs[other])
    det: dict[str, Any] = {"slope_pre": a, f"slope_{other}": b}
    ia, ib = ctx.diagnostics(runs["deep_pre"], at_init=True), ctx.diagnostics(runs[other], at_init=True)
    if ia is not None and ib is not None:
        det["slope_init_pre"] = ia["variance"]["log_var_slope_blocks"]
        det[f"slope_init_{other}"] = ib["variance"]["log_var_slope_blocks"]
        det["diff_init"] = det["slope_init_pre"] - det[f"slope_init_{other}"]
    return (None if a is None or b is None else a - b), det


@register_measure("massive")
def m_massive(ctx: Context, runs: dict[str, Path]) -> tuple[float | None, dict]:
    """log10 of the Pre-LN / Peri-LN massive-activation ratio the authors' way (per sequence: top-1 |h| and median
    |h| averaged over the sequences; the largest mean-top-1 / mean-median over blocks); the pooled ratio (max over
    the whole sample / pooled median) is kept as a second number in the details."""
    a, b = ctx.diagnostics(runs["deep_pre"]), ctx.diagnostics(runs["deep_peri"])
    if a is None or b is None or not a["massive"]["max_ratio_per_seq"] or not b["massive"]["max_ratio_per_seq"]:
        return None, {}
    ra, rb = a["massive"]["max_ratio_per_seq"], b["massive"]["max_ratio_per_seq"]
    pa, pb = a["massive"]["max_ratio"], b["massive"]["max_ratio"]
    ia, ib = ctx.diagnostics(runs["deep_pre"], at_init=True), ctx.diagnostics(runs["deep_peri"], at_init=True)
    init = {}  # the same log ratio at the runs' own seeded initialisation (a state claim: normlab.decide)
    if ia is not None and ib is not None and ia["massive"]["max_ratio_per_seq"] and ib["massive"]["max_ratio_per_seq"]:
        init = {"log10_ratio_init": math.log10(ia["massive"]["max_ratio_per_seq"] / ib["massive"]["max_ratio_per_seq"])}
    return math.log10(ra / rb), {**init, "ratio_per_seq_pre": ra, "ratio_per_seq_peri": rb,
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


@register_measure("peri_variance_depth")
def m_peri_variance_depth(ctx: Context, runs: dict[str, Path]) -> tuple[float | None, dict]:
    """How much training steepened the growth of the hidden-state variance with depth, Pre-LN minus Peri-LN: per
    model ``slope_end - slope_init`` of ln(var) of the block outputs against the block index (same validation
    windows; init = the run's own seeded initialisation), nats/block. Details: ``pre_slope_change`` (Pre-LN's
    own change: the claim's observability rule, the phenomenon is present only when it is positive), the at-init
    and end slopes and their differences, and :func:`m_peri_variance`'s growth of the last block's variance and
    the final magnitude."""
    value, det = m_peri_variance(ctx, runs)
    if value is None:
        return None, det
    det["growth_last_block_diff"] = value
    det["pre_slope_change"] = det["slope_end_pre"] - det["slope_init_pre"]
    det["peri_slope_change"] = det["slope_end_peri"] - det["slope_init_peri"]
    return det["pre_slope_change"] - det["peri_slope_change"], det


@register_measure("collapse_diff")
def m_collapse_diff(ctx: Context, runs: dict[str, Path], a: str, b: str) -> tuple[float | None, dict]:
    """A split outcome: each run has collapsed (diverged, or did not learn: its final bits/byte at or above the
    unigram bits/byte of the training split minus the one margin, normlab.stats.learning.collapsed) or trained.
    Value: ``bpb(a) - bpb(b)`` when neither collapsed, else None;
    details ``collapsed_<v>`` (0/1) per run, which the collapse rates are counted from."""

    level = unigram_bpb(ctx, open_config(runs[a]))
    det: dict[str, Any] = {"unigram_bpb": level, "collapse_above_bpb": level - DID_NOT_LEARN_MARGIN}
    vals = {}
    for v in (a, b):
        x, d = final_bpb(ctx, runs[v])
        det[f"bpb_{v}"] = x
        det[f"collapsed_{v}"] = int(bool(collapsed(x, level, finished=d["status"] == "completed")))
        vals[v] = x
    if det[f"collapsed_{a}"] or det[f"collapsed_{b}"]:
        return None, det
    return vals[a] - vals[b], det


@register_measure("peri_magnitude")
def m_peri_magnitude(ctx: Context, runs: dict[str, Path]) -> tuple[float | None, dict]:
    """log10(var Pre-LN / var Peri-LN) of the last block's output at the end of training (validation windows);
    positive = Peri-LN's hidden states have the smaller variance, as the paper reports."""
    a, b = ctx.diagnostics(runs["deep_pre"]), ctx.diagnostics(runs["deep_peri"])
    if a is None or b is None:
        return None, {}
    va, vb = a["variance"]["var"][-1], b["variance"]["var"][-1]
    det = {"var_end_pre": va, "var_end_peri": vb, "max_var_pre": max(a["variance"]["var"][1:]),
           "max_var_peri": max(b["variance"]["var"][1:])}
    ia, ib = ctx.diagnostics(runs["deep_pre"], at_init=True), ctx.diagnostics(runs["deep_peri"], at_init=True)
    if ia is not None and ib is not None:  # the same ratio at initialisation, and what training changed
        det["var_init_pre"], det["var_init_peri"] = ia["variance"]["var"][-1], ib["variance"]["var"][-1]
        det["magnitude_init"] = math.log10(det["var_init_pre"] / det["var_init_peri"])
        det["magnitude_change"] = math.log10(va / vb) - det["magnitude_init"]
    return math.log10(va / vb), det


def grad_cv(run_dir: Path) -> float | None:
    """Mean over the training-time diagnostic records of the coefficient of variation (std / mean, population
    std) across blocks of the per-block gradient norm (``normlab.names.block_grad_norms``: attention, MLP and
    norm-site parameters of each block)."""

    cvs = []
    for rec in training_records(run_dir):
        per = block_grad_norms(rec)
        if len(per) >= 2 and all(math.isfinite(v) for v in per):
            mu = sum(per) / len(per)
            if mu > 0:
                cvs.append(math.sqrt(sum((v - mu) ** 2 for v in per) / len(per)) / mu)
    return sum(cvs) / len(cvs) if cvs else None


@register_measure("mix")
def m_mix(ctx: Context, runs: dict[str, Path]) -> tuple[float | None, dict]:
    a, b = grad_cv(runs["deep_pre"]), grad_cv(runs["deep_mix"])
    return (None if a is None or b is None else a - b), {"grad_cv_pre": a, "grad_cv_mix": b}


@register_measure("bpb_diff")
def m_bpb_diff(ctx: Context, runs: dict[str, Path], a: str, b: str) -> tuple[float | None, dict]:
    """``bpb(a) - bpb(b)``."""
    x, dx = final_bpb(ctx, runs[a])
    y, dy = final_bpb(ctx, runs[b])
    return x - y, {f"bpb_{a}": x, f"bpb_{b}": y, f"status_{a}": dx["status"], f"status_{b}": dy["status"]}


@register_measure("linear")
def m_linear(ctx: Context, runs: dict[str, Path]) -> tuple[float | None, dict]:
    x, dx = final_bpb(ctx, runs["linear_conv"])
    y, dy = final_bpb(ctx, runs["ln"])
    return x / y - 1.0, {"bpb_linear_conv": x, "bpb_softmax": y,
                         "params_linear_conv": ctx.summary(runs["linear_conv"]).get("params"),
                         "params_softmax": ctx.summary(runs["ln"]).get("params"), "status_linear_conv": dx["status"]}


def _degradation(ctx: Context, run_dir: Path, reweight: bool | None) -> tuple[float | None, dict]:
    """``(loss(max factor) - loss(1x), {factor: loss})`` in nats/token of one run on the budget's extrapolation
    windows; ``reweight`` (softplus runs) sets ``model.lssa_reweight`` for this evaluation (None: as trained)."""

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


def _extrap_diff(ctx: Context, runs: dict[str, Path], rows: tuple[tuple[str, str, bool | None], ...],
                 against: str) -> tuple[float | None, dict]:
    """``degradation(softmax) - degradation(against)`` over ``rows`` ``(name, variant, LSSAR at evaluation)``
    (None: as trained); every row's losses and degradation are in the details."""
    out, deg = {}, {}
    for name, run, reweight in rows:
        deg[name], losses = _degradation(ctx, runs[run], reweight)
        if deg[name] is None:
            return None, losses
        out[f"loss_{name}"] = losses
    return deg["softmax"] - deg[against], {**out, "degradation": deg, "max_factor": max(ctx.budget.extrap_factors)}


@register_measure("extrap")
def m_extrap(ctx: Context, runs: dict[str, Path]) -> tuple[float | None, dict]:
    """Loss degradation ``loss(max factor) - loss(1x)`` (nats/token) of softmax minus that of softplus attention
    trained with LSSAR re-weighting on (as the paper trains it), on the same validation tokens."""
    return _extrap_diff(ctx, runs, (("softmax", "ln", None), ("softplus_lssar", "softplus_lssar", None)),
                        "softplus_lssar")


@register_measure("extrap_eval_only")
def m_extrap_eval_only(ctx: Context, runs: dict[str, Path]) -> tuple[float | None, dict]:
    """As :func:`m_extrap` with softplus attention trained WITHOUT re-weighting and LSSAR switched on only at
    evaluation (no fine-tuning); the softplus model without re-weighting is reported too."""
    return _extrap_diff(ctx, runs, (("softmax", "ln", None), ("softplus", "softplus", False),
                                    ("softplus_lssar_eval", "softplus", True)), "softplus_lssar_eval")


def measure(claim: Any, ctx: Context, runs: dict[str, Path]) -> tuple[float | None, dict]:
    """One seed's value and details of ``claim`` (a ``specs.Claim``): its registered measure with its args, and for
    every claim (normlab.decide.guard, not opt-in) the final bits/byte of every model it trains (``learn_bpb``: a
    grid variant's best over its learning rates; None where every run diverged) with the training split's unigram
    bits/byte (``unigram_bpb``), so the one did-not-learn guard can be applied whichever claims a run measures."""
    value, details = get_measure(claim.measure)(ctx, runs, *claim.args)
    if not isinstance(details, dict):
        return value, details
    first = next(iter(runs.values()))  # a run directory, or lr -> run directory for a grid variant
    run_dir = first[min(first)] if isinstance(first, dict) else first
    extra: dict[str, Any] = {LEARN_KEY: {v: _final_loss(ctx, r) for v, r in runs.items()}}
    if "unigram_bpb" not in details:
        extra["unigram_bpb"] = unigram_bpb(ctx, open_config(run_dir))
    return value, {**details, **extra}


def _final_loss(ctx: Context, run: Any) -> float | None:
    """A model's final validation bits/byte (a grid variant: the best of its completed runs); None if none
    completed with a finite loss."""
    dirs = list(run.values()) if isinstance(run, dict) else [run]
    xs = []
    for d in dirs:
        s = ctx.summary(d)
        v = s.get("val_bpb")
        if s.get("status") == "completed" and isinstance(v, (int, float)) and math.isfinite(v):
            xs.append(float(v))
    return min(xs) if xs else None
