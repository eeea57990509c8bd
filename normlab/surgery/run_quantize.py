"""``normlab quantize RUN_DIR --weights 8|4|3 [--group G] [--grid rtn|higgs] [--norm-tweak] [--linearity]
[--acts 8|none] [--rotate none|hadamard] --out DIR``.

1. load the run; bits/byte of the unquantized model on the first ``max_tokens`` validation tokens;
2. ``--rotate hadamard``: exact conversion to the parameter-free RMSNorm form (normlab.convert: ``rmsnorm`` for
   LayerNorm runs, ``folded`` for RMSNorm runs), then the randomized Hadamard rotation fused into the weights
   (normlab.surgery.rotate); the rotated fp32 model must match the original's logits to ``ROTATE_TOL`` on
   validation windows, else nothing is written;
3. input statistics of every linear that will be quantized (the outliers the rotation is meant to spread);
4. fake-quantization of the weights: RTN (normlab.surgery.quantize) or the HIGGS grid (normlab.surgery.higgs);
   ``--norm-tweak``: Norm Tweaking of the block norms on training-split windows (normlab.surgery.norm_tweak);
   optional per-token 8-bit activations;
5. bits/byte again; ``--linearity``: the HIGGS linearity-theorem check at 8, 4 and 3 bits; the output is a normal
   run directory (fp32 fake-quantized weights, the possibly converted
   config) plus ``quantization.json``. Simulated: nothing runs in low precision, and the written run does not
   carry the activation quantization (``quantization.json`` records it; re-evaluating the run directory scores
   the weight-only model).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np
import torch

from normlab.convert.exact import convert_model
from normlab.convert.run import max_logit_diff
from normlab.errors import NormlabError
from normlab.eval.lm import evaluate
from normlab.io import check_new_dir, read_json
from normlab.rundir.files import SUMMARY_FILE
from normlab.rundir.publish import publish_run
from normlab.rundir.readers import load_run, run_data
from normlab.surgery.higgs import GRIDS, linearity_check, quantize_layers
from normlab.surgery.norm_tweak import TWEAK_LR, norm_tweak, output_error
from normlab.surgery.quantize import ACT_BITS, WEIGHT_BITS, act_quant, activation_stats
from normlab.surgery.rotate import random_rotation, rotate_model

FORMAT = "normlab-quantization-v1"
ROTATE_TOL = 1e-4
ROTATIONS = ("none", "hadamard")
SIMULATED = ("simulated quantization: weights are rounded to the grid and stored in fp32 (fake-quant); "
             "activation quantization, when on, is applied by forward hooks inside this command only")


def _windows(tokens: np.ndarray, context: int, n: int) -> torch.Tensor:
    context = min(context, len(tokens))
    starts = np.linspace(0, len(tokens) - context, n).astype(np.int64)
    return torch.from_numpy(np.stack([tokens[s:s + context].astype(np.int64) for s in starts]))


def rotated_copy(model: torch.nn.Module, cfg, tokens: np.ndarray, seed: int = 0):
    """``(config, model, info)``: the exact parameter-free RMSNorm form of ``model`` with a randomized Hadamard
    rotation fused in, checked against ``model`` on ``tokens`` (max |logit diff| <= ROTATE_TOL)."""
    kinds = {"layernorm": "rmsnorm", "rmsnorm": "folded"}
    if cfg.model.norm not in kinds:
        raise NormlabError(f"--rotate hadamard needs a Pre-LN layernorm or rmsnorm model (got norm "
                           f"'{cfg.model.norm}'): the rotation commutes with a parameter-free RMSNorm only")
    new_cfg, conv, info = convert_model(copy.deepcopy(model), cfg, kinds[cfg.model.norm])
    q, kind = random_rotation(new_cfg.model.width, seed)
    rotate_model(conv, q)
    diff = max_logit_diff(model, conv, tokens, cfg.model.context)
    if not diff <= ROTATE_TOL:
        raise NormlabError(f"--rotate hadamard failed its check (max |logit diff| {diff:.3g} > {ROTATE_TOL:g}); "
                           "nothing written")
    return new_cfg, conv.eval(), {"rotation": kind, "conversion": kinds[cfg.model.norm], "seed": seed,
                                  "max_abs_logit_diff": diff, "tolerance": ROTATE_TOL, **info}


def quantize_stages(rotate: str = "none", tweak: bool = False, linearity: bool = False) -> list[str]:
    """The stages ``quantize_model`` reports through ``progress``, in order, for these options."""
    return (["scoring the float model"]
            + (["rotating (exact conversion, then Hadamard)"] if rotate == "hadamard" else [])
            + ["quantizing the weights"] + (["Norm Tweaking"] if tweak else []) + ["scoring the quantized model"]
            + ([f"linearity check ({len(WEIGHT_BITS)} widths, each scored)"] if linearity else []))


def quantize_model(model: torch.nn.Module, cfg, data, *, weights: int, group: int | None = None,
                   acts: int | None = None, rotate: str = "none", max_tokens: int = 8192, batch_size: int = 16,
                   seed: int = 0, stat_windows: int = 8, grid: str = "rtn", tweak: bool = False,
                   tweak_samples: int = 32, tweak_lr: float = TWEAK_LR,
                   linearity: bool = False, progress: Any = None) -> tuple[Any, torch.nn.Module, dict[str, Any]]:
    """Quantize a copy of ``model`` (built from ``cfg``; ``data`` its PreparedData); ``(config, model, record)``.
    ``progress``: called with each of ``quantize_stages(...)`` as it starts."""
    if weights not in WEIGHT_BITS:
        raise NormlabError(f"--weights {weights} is not supported; allowed: {', '.join(map(str, WEIGHT_BITS))}")
    if acts is not None and acts not in ACT_BITS:
        raise NormlabError(f"--acts {acts} is not supported; allowed: 8, none")
    if rotate not in ROTATIONS:
        raise NormlabError(f"--rotate {rotate} is not supported; allowed: {', '.join(ROTATIONS)}")
    if grid not in GRIDS:
        raise NormlabError(f"--grid {grid} is not supported; allowed: {', '.join(GRIDS)}")
    if grid == "higgs" and group is not None and group & (group - 1):
        raise NormlabError(f"--grid higgs needs --group to be a power of two (its Hadamard blocks), got {group}")
    if group is not None and (group < 1 or cfg.model.width % group):
        raise NormlabError(f"--group {group} must be >= 1 and divide the width {cfg.model.width}")
    ctx = cfg.model.context

    def score(m: torch.nn.Module) -> dict[str, float]:
        return evaluate(m, data.val, data.token_bytes, data.tokenizer.decode_bytes, context=ctx, batch_size=batch_size,
                        max_tokens=max_tokens)

    stages = iter(quantize_stages(rotate, tweak, linearity))
    say = (lambda: progress(next(stages))) if progress else (lambda: None)
    say()
    before = score(model)
    rot_info = None
    if rotate == "hadamard":
        say()
        cfg, work, rot_info = rotated_copy(model, cfg, data.val, seed)
    else:
        work = copy.deepcopy(model).eval()
    sample = _windows(data.val, ctx, stat_windows)
    acts_before = activation_stats(work, sample)
    ref = copy.deepcopy(work) if tweak or linearity else None  # the float model in the form being quantized
    say()
    layers = quantize_layers(work, weights, group, grid, seed)
    tweak_info = None
    if tweak:  # Norm Tweaking: calibration windows of the training split, held-out windows of the validation split
        say()
        calib, held = _windows(data.train, ctx, tweak_samples), _windows(data.val, ctx, tweak_samples)
        err0 = {"calibration": output_error(ref, work, calib), "held_out": output_error(ref, work, held)}
        tweak_info = norm_tweak(ref, work, calib, lr=tweak_lr)
        tweak_info["output_error"] = {k: {"before": v, "after": output_error(ref, work, x)}
                                      for (k, v), x in zip(err0.items(), (calib, held))}
    say()
    with act_quant(work, acts):
        after = score(work)
    lin = None
    if linearity:  # HIGGS linearity theorem: predicted vs measured bits/byte increase at every supported width
        say()
        lin = linearity_check(ref, lambda m: score(m)["bpb"], WEIGHT_BITS, grid=grid, group=group, seed=seed)
    for n, st in layers.items():
        st["act"] = acts_before.get(n)
    record = {
        "format": FORMAT, "simulated": True, "note": SIMULATED, "weights": weights, "group": group,
        "acts": acts, "rotate": rotate, "rotation": rot_info, "grid": grid,
        "scheme": ("RTN symmetric, per " + (f"group of {group} inputs" if group else "output channel")) if grid == "rtn"
        else ("HIGGS: randomized Hadamard per group of "
              + (f"{group} inputs" if group else "the largest power-of-two divisor of the input size")
              + ", Lloyd-Max Gaussian grid scaled by the group RMS"),
        "norm_tweak": tweak_info, "linearity": lin,
        "bpb_before": before["bpb"], "bpb_after": after["bpb"],
        "bpb_increase": after["bpb"] - before["bpb"],
        "loss_before": before["loss"], "loss_after": after["loss"], "loss_increase": after["loss"] - before["loss"],
        "eval_tokens": before["tokens"], "layers": layers,
        "mean_rel_err": float(np.mean([s["rel_err"] for s in layers.values()])) if layers else 0.0,
        "max_act_outlier_ratio": max((s["act"]["outlier_ratio"] for s in layers.values() if s["act"]), default=None),
        "mean_act_kurtosis": float(np.mean([s["act"]["kurtosis"] for s in layers.values() if s["act"]]))
        if layers else None,
    }
    return cfg, work, record


def quantize_run(run_dir: str | Path, out: str | Path, *, weights: int, group: int | None = None,
                 acts: int | None = None, rotate: str = "none", max_tokens: int = 8192, batch_size: int = 16,
                 seed: int = 0, grid: str = "rtn", tweak: bool = False, tweak_samples: int = 32,
                 tweak_lr: float = TWEAK_LR, linearity: bool = False, progress: Any = None) -> dict[str, Any]:
    """Quantize the run in ``run_dir`` and write it to ``out`` (whole or absent); returns the record. ``progress``:
    as ``quantize_model``'s."""
    if max_tokens < 1 or batch_size < 1:
        raise NormlabError("--max-tokens and --batch-size must be >= 1")
    if weights not in WEIGHT_BITS:  # before any work: bad input is refused at once
        raise NormlabError(f"--weights {weights} is not supported; allowed: {', '.join(map(str, WEIGHT_BITS))}")
    run_dir, out = Path(run_dir), Path(out)
    check_new_dir(out)
    src = load_run(run_dir, final_only=True)
    data = run_data(run_dir, src.cfg)  # the run's own tokenizer; a changed corpus is refused
    cfg, model, record = quantize_model(src.model, src.cfg, data, weights=weights, group=group, acts=acts,
                                        rotate=rotate, max_tokens=max_tokens, batch_size=batch_size, seed=seed,
                                        grid=grid, tweak=tweak, tweak_samples=tweak_samples, tweak_lr=tweak_lr,
                                        linearity=linearity, progress=progress)
    record.update({"source": str(run_dir), "source_config_hash": src.cfg.hash(), "config_hash": cfg.hash()})
    with publish_run(out, cfg, model, derived_from=run_dir) as pending:
        src_summary = read_json(run_dir / SUMMARY_FILE, "summary") if (run_dir / SUMMARY_FILE).is_file() else {}
        pending.records["quantization.json"] = record
        pending.summary = {
            "status": "completed", "step": src_summary.get("step"), "steps": src_summary.get("steps"),
            "quantized_from": str(run_dir), "val_loss": record["loss_after"], "val_bpb": record["bpb_after"],
            "bpb_before": record["bpb_before"], "bpb_increase": record["bpb_increase"],
            "eval_tokens": record["eval_tokens"], "entropy_floor_bpb": data.entropy_floor_bpb,
            "params": model.num_params(), "config_hash": cfg.hash(), "run_dir": str(out), "simulated": True,
        }
    return {**record, "out": str(out)}
