"""Run directories: what a normlab run leaves on disk, and how later tools open it.

    RUN_DIR/config.yaml        full config (every key)
    RUN_DIR/param_groups.json  optimizer grouping (which parameters get weight decay)
    RUN_DIR/metrics.jsonl      one JSON object per logged step / evaluation
    RUN_DIR/checkpoints/       resumable checkpoints (see normlab.train.checkpoint)
    RUN_DIR/model.safetensors  final weights
    RUN_DIR/summary.json       {status: completed|diverged|interrupted, step, final metrics}
    RUN_DIR/fingerprint.json   what determines the numbers: sha256 of resolved config + parameter names/shapes/order
                               + normlab and torch versions (normlab.fingerprint; caches check it)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from normlab.config import RunConfig, config_from_dict, read_yaml
from normlab.errors import NormlabError
from normlab.model import GPT, build_model
from normlab.train.checkpoint import list_checkpoints, load_model_state


def open_config(run_dir: str | Path) -> RunConfig:
    """The validated config of a run directory; anything else is a one-line error."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise NormlabError(f"run directory {run_dir} does not exist")
    path = run_dir / "config.yaml"
    if not path.is_file():
        raise NormlabError(f"{run_dir} is not a normlab run (no config.yaml)")
    return config_from_dict(read_yaml(path))


@dataclass
class LoadedRun:
    cfg: RunConfig
    model: GPT
    weights: Path


def load_run(run_dir: str | Path, *, final_only: bool = False) -> LoadedRun:
    """Build the model of a run (``build_model``: every model normlab writes, the compressed CRMSNorm one
    included) and load its final weights, or, if training stopped early, its last checkpoint; eval mode.
    ``final_only``: a run without ``model.safetensors`` is an error (conversion and surgery start from final
    weights only)."""
    run_dir = Path(run_dir)
    cfg = open_config(run_dir)
    weights = run_dir / "model.safetensors"
    if not weights.is_file() and final_only:
        raise NormlabError(f"{run_dir} has no model.safetensors")
    if not weights.is_file():
        ckpts = list_checkpoints(run_dir)
        if not ckpts:
            raise NormlabError(f"{run_dir} has no model.safetensors and no checkpoint")
        weights = ckpts[-1] / "model.safetensors"
    torch.manual_seed(cfg.seed)
    model = build_model(cfg.model)
    load_model_state(model, weights)
    model.eval()
    return LoadedRun(cfg, model, weights)
