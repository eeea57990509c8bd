"""Convert a run directory, check the result on real validation tokens, write it as a new run directory.

The check runs on the model *loaded back from the written files* (config.yaml + model.safetensors in a temp
directory), in fp32, against the original run's model:

- ``max_abs_logit_diff``: max |logits_before - logits_after| over ``LOGIT_WINDOWS`` validation windows
  ``[LOGIT_WINDOWS, context]`` (evenly spaced over the validation split); must be <= ``LOGIT_TOL``;
- ``bpb_before`` / ``bpb_after``: bits per byte (normlab.eval.lm.evaluate) on the first ``max_tokens`` validation
  tokens; must agree to ``BPB_TOL``.

Only then is the temp directory renamed to ``--out`` (whole or absent; an existing non-empty ``--out`` is refused).
Output layout: ``config.yaml``, ``model.safetensors``, ``summary.json`` (status completed + the check's numbers),
``conversion.json`` (what was done, with the numbers).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

from normlab.convert.exact import KINDS, PAPER, convert_model
from normlab.errors import NormlabError
from normlab.eval.lm import evaluate
from normlab.io import check_new_dir, read_json_object
from normlab.rundir.files import SUMMARY_FILE
from normlab.rundir.publish import publish_run
from normlab.rundir.readers import load_run, run_data

LOGIT_TOL = 1e-4
BPB_TOL = 1e-6
LOGIT_WINDOWS = 4
FORMAT = "normlab-conversion-v1"


@torch.no_grad()
def max_logit_diff(a: torch.nn.Module, b: torch.nn.Module, tokens: np.ndarray, context: int,
                   n_windows: int = LOGIT_WINDOWS) -> float:
    """Max |a(x) - b(x)| over ``n_windows`` windows ``x [n_windows, context]`` spread over ``tokens`` (fp32)."""
    context = min(context, len(tokens))
    starts = np.linspace(0, len(tokens) - context, n_windows).astype(np.int64)
    x = torch.from_numpy(np.stack([tokens[s : s + context].astype(np.int64) for s in starts]))
    a.eval(), b.eval()
    diff = (a(x).float() - b(x).float()).abs().max().item()
    return float("inf") if math.isnan(diff) else diff


def default_out(run_dir: Path, kind: str) -> Path:
    """``RUN_DIR-<kind>`` beside the source run."""
    return run_dir.parent / f"{run_dir.name}-{kind}"


def convert_run(run_dir: str | Path, kind: str, out: str | Path | None = None, *, max_tokens: int = 4096,
                batch_size: int = 16) -> dict[str, Any]:
    """Convert the run in ``run_dir`` to ``kind`` and write it to ``out``; returns the conversion record.

    Raises a one-line NormlabError (and writes nothing) for unsupported models or a failed check.
    """
    if kind not in KINDS:
        raise NormlabError(f"unknown conversion '{kind}'; allowed: {', '.join(KINDS)}")
    if max_tokens < 1:
        raise NormlabError(f"--max-tokens must be >= 1, got {max_tokens}")
    run_dir = Path(run_dir)
    out = Path(out) if out else default_out(run_dir, kind)
    check_new_dir(out)
    src = load_run(run_dir, final_only=True)
    cfg = src.cfg
    new_cfg, model, info = convert_model(src.model, cfg, kind)

    data = run_data(run_dir, cfg)  # the run's own tokenizer; a changed corpus is refused
    ctx = cfg.model.context

    def bpb(m: torch.nn.Module) -> tuple[float, int]:
        r = evaluate(m, data.val, data.token_bytes, data.tokenizer.decode_bytes, context=ctx, batch_size=batch_size,
                     max_tokens=max_tokens)
        return r["bpb"], r["tokens"]

    bpb_before, n_tokens = bpb(src.model)
    with publish_run(out, new_cfg, model, derived_from=run_dir) as pending:  # the converted run stays self-contained
        back = load_run(pending.path, final_only=True).model  # check what was written, not the in-memory copy
        diff = max_logit_diff(src.model, back, data.val, ctx)
        bpb_after, _ = bpb(back)
        if not diff <= LOGIT_TOL or not abs(bpb_after - bpb_before) <= BPB_TOL:
            raise NormlabError(
                f"conversion to {kind} failed its check (max |logit diff| {diff:.3g}, tolerance {LOGIT_TOL:g}; "
                f"bits/byte {bpb_before:.8f} -> {bpb_after:.8f}, tolerance {BPB_TOL:g}); nothing written"
            )
        record = {
            "format": FORMAT, "kind": kind, "paper": PAPER, "source": str(run_dir),
            "source_config_hash": cfg.hash(), "config_hash": new_cfg.hash(), **info,
            "max_abs_logit_diff": diff, "bpb_before": bpb_before, "bpb_after": bpb_after,
            "eval_split": "val", "eval_tokens": n_tokens, "logit_windows": [LOGIT_WINDOWS, min(ctx, len(data.val))],
            "tolerances": {"max_abs_logit_diff": LOGIT_TOL, "bpb": BPB_TOL}, "dtype": "float32",
            "params_before": src.model.num_params(), "params_after": back.num_params(),
        }
        src_summary = read_json_object(run_dir / SUMMARY_FILE, "summary") if (run_dir / SUMMARY_FILE).is_file() else {}
        summary = {
            "status": "completed", "step": src_summary.get("step"), "steps": src_summary.get("steps"),
            "converted_from": str(run_dir), "conversion": kind, "max_abs_logit_diff": diff,
            "bpb_before": bpb_before, "bpb_after": bpb_after, "eval_tokens": n_tokens,
            "entropy_floor_bpb": data.entropy_floor_bpb, "params": back.num_params(),
            "config_hash": new_cfg.hash(), "run_dir": str(out),
        }
        pending.records["conversion.json"] = record
        pending.summary = summary
    return {**record, "out": str(out)}
