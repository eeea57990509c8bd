"""Post-hoc diagnostics of a trained model on a fixed sample of sequences (``normlab diagnose``).

``sample_sequences`` picks the sample deterministically (evenly spaced windows of a split, no RNG);
``diagnose_model`` runs every analysis on it and returns one JSON-ready dict (layout in docs/diagnostics.md);
``training_records`` reads the ``diag/...`` records that training wrote to metrics.jsonl.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

from normlab.diagnostics.capture import capture_stream
from normlab.diagnostics.depth import variance_by_depth
from normlab.diagnostics.effectiveness import angular_distances, skip_losses
from normlab.diagnostics.massive import massive_by_block
from normlab.diagnostics.normstats import norm_parameter_stats
from normlab.diagnostics.residual_sinks import ablate_residual_sinks, residual_sinks_by_block
from normlab.diagnostics.sinks import EPSILON, SINK_CONTEXT, sink_analysis
from normlab.errors import NormlabError
from normlab.rundir.files import METRICS_FILE
from normlab.rundir.readers import read_jsonl


def sample_sequences(tokens: np.ndarray, n: int, context: int) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """``n`` windows of ``context + 1`` tokens starting at evenly spaced offsets of ``tokens`` (first at 0, last at
    the end; they overlap only when the split is shorter than ``n * (context + 1)``). Returns
    ``idx [n, context]``, ``targets [n, context]`` (int64) and the start offsets."""
    if n < 1 or context < 1:
        raise NormlabError(f"--sequences and --context must be >= 1, got {n} and {context}")
    if len(tokens) < context + 1:
        raise NormlabError(f"the split has {len(tokens)} tokens; one sequence of --context {context} needs "
                           f"{context + 1}")
    starts = np.linspace(0, len(tokens) - context - 1, n).round().astype(np.int64).tolist()
    chunk = torch.from_numpy(np.stack([tokens[s : s + context + 1] for s in starts]).astype(np.int64))
    return chunk[:, :-1].contiguous(), chunk[:, 1:].contiguous(), starts


@torch.no_grad()
def diagnose_model(model: nn.Module, idx: torch.Tensor, targets: torch.Tensor, *,
                   sink_context: int = SINK_CONTEXT, epsilon: float = EPSILON,
                   ablate_residual: bool = False) -> dict:
    """Every post-hoc analysis of ``model`` on ``idx, targets [N, T]`` (eval mode; hooks removed afterwards).

    Sections: ``variance`` (:mod:`.depth`), ``massive`` (:mod:`.massive`), ``sinks`` (:mod:`.sinks`, on the first
    ``sink_context`` tokens), ``layer_effectiveness`` (:mod:`.effectiveness`), ``norm_params`` (:mod:`.normstats`),
    ``residual_sinks`` (:mod:`.residual_sinks`; with ``ablate_residual`` also ``residual_sink_ablation``).
    """
    stream = capture_stream(model, idx)
    hidden = stream.hidden
    skip = skip_losses(model, idx, targets)
    ang = angular_distances(hidden)
    eff = {"base_loss": skip["base_loss"],
           "blocks": [{"block": l, "angular_distance": a, "skip_loss": s, "skip_loss_increase": d}
                      for l, (a, s, d) in enumerate(zip(ang, skip["skip_loss"], skip["skip_loss_increase"]))]}
    rsinks = residual_sinks_by_block(hidden[1:])
    extra = {"residual_sink_ablation": ablate_residual_sinks(model, idx, targets, rsinks)} if ablate_residual else {}
    return {
        "variance": variance_by_depth(hidden),
        "massive": massive_by_block(hidden),
        "sinks": sink_analysis(model, idx, context=sink_context, epsilon=epsilon),
        "layer_effectiveness": eff,
        "norm_params": norm_parameter_stats(model),
        "residual_sinks": rsinks,
        **extra,
    }


def training_records(run_dir: str | Path) -> list[dict]:
    """Records of ``RUN_DIR/metrics.jsonl`` that carry ``diag/...`` keys (skipping lines cut by a kill)."""
    # read_jsonl skips cut, junk and non-UTF-8 lines
    return [rec for rec in read_jsonl(Path(run_dir) / METRICS_FILE) if any(k.startswith("diag/") for k in rec)]


def training_summary(records: list[dict]) -> dict:
    """Headline of the training-time records: how many, the last one's per-block values as lists."""
    stat = [r for r in records if any(k.startswith("diag/resid_rms/") for k in r)]
    spikes = [r["step"] for r in records if r.get("diag/loss_spike")]
    out: dict = {"records": len(stat), "spike_steps": spikes}
    if stat:
        last = stat[-1]

        def series(prefix: str) -> list[float]:
            keys = sorted((k for k in last if k.startswith(prefix) and k[len(prefix):].isdigit()),
                          key=lambda k: int(k[len(prefix):]))
            return [last[k] for k in keys]

        out["last"] = {"step": last["step"], "resid_rms": series("diag/resid_rms/"),
                       "resid_var": series("diag/resid_var/"), "grad_norm_attn": series("diag/grad_norm/attn/"),
                       "grad_norm_mlp": series("diag/grad_norm/mlp/"), "grad_norm_norm": series("diag/grad_norm/norm/")}
    return out
