"""``normlab train CONFIG --init-from RUN_DIR``: start a new run from another run's weights.

The new config may change anything that leaves every tensor's name and shape alone (learning rate, steps, data
of the same tokenizer, schedule, optimizer, dropout, ...). Weights come from ``RUN_DIR/model.safetensors`` or,
when the run has not finished, its last checkpoint. Every model tensor (parameters and buffers, tied weights once)
must be present with the same shape, and the file may hold nothing else; otherwise one line names the first
mismatching tensor. Optimizer state and step are NOT carried over (a fine-tune starts a fresh schedule). The
source is recorded in ``init_from.json`` so ``--resume`` of the new run reloads the same start before its
checkpoint.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from normlab.errors import NormlabError
from normlab.rundir.files import INIT_FROM_FILE, MODEL_FILE
from normlab.rundir.publish import write_record as write_run_record
from normlab.rundir.readers import read_data_info, read_run_file, tokenizer_ref
from normlab.rundir.tensors import list_checkpoints, load_tensors, model_tensors

DEFAULT_TOKENIZER = "bytes"  # DataConfig's default: a config that does not choose a tokenizer takes the source's


def init_weights_path(run_dir: str | Path) -> Path:
    """``RUN_DIR/model.safetensors``, else the last checkpoint's weights; a one-line error when neither exists."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise NormlabError(f"--init-from {run_dir}: run directory does not exist")
    final = run_dir / MODEL_FILE
    if final.is_file():
        return final
    ckpts = list_checkpoints(run_dir)
    if not ckpts:
        raise NormlabError(f"--init-from {run_dir}: no model.safetensors and no checkpoint to start from")
    return ckpts[-1] / MODEL_FILE


def first_mismatch(model: nn.Module, tensors: dict[str, torch.Tensor]) -> str | None:
    """A sentence naming the first tensor (in the model's order) that is missing or has another shape, or the
    first extra tensor of the file; None when names and shapes agree."""
    expected = model_tensors(model)
    for name, t in expected.items():
        if name not in tensors:
            return f"parameter '{name}' {tuple(t.shape)} of this config is not in the source weights"
        if tuple(tensors[name].shape) != tuple(t.shape):
            return (f"parameter '{name}' has shape {tuple(tensors[name].shape)} in the source, "
                    f"{tuple(t.shape)} in this config")
    extra = [k for k in tensors if k not in expected]
    if extra:
        return f"the source has parameter '{extra[0]}' that this config does not build"
    return None


def _finite_or_refuse(run_dir: str | Path, path: Path, tensors: dict[str, torch.Tensor]) -> None:
    for name, t in tensors.items():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise NormlabError(f"--init-from {run_dir}: tensor '{name}' in {path} contains NaN or inf (a diverged "
                               "run?); start from a run or checkpoint with finite weights")


def check_source(init_from: str | Path, cfg) -> None:
    """Check an ``--init-from`` source before anything is written or any rank starts (one line, exit 2): its
    weights exist, load and are finite, and the new run's tokenizer is the source's. ``cfg.data.tokenizer`` is set
    to the source's (so config.yaml says what data.json records); a different tokenizer the config names
    explicitly (anything but the default ``bytes``) is refused rather than dropped."""
    path = init_weights_path(init_from)
    _finite_or_refuse(init_from, path, load_tensors(path, "model file"))
    src = source_tokenizer(init_from)
    if src is None:
        return
    src = str(src)
    if cfg.data.tokenizer not in (src, DEFAULT_TOKENIZER):
        raise NormlabError(f"--init-from {init_from}: data.tokenizer '{cfg.data.tokenizer}' differs from the "
                           f"source run's tokenizer '{src}' (the model's token ids are the source's); drop the "
                           "data.tokenizer setting")
    cfg.data.tokenizer = src


def load_init(model: nn.Module, run_dir: str | Path) -> Path:
    """Copy the weights of ``run_dir`` into ``model`` (in place); returns the weights file used."""
    path = init_weights_path(run_dir)
    tensors = load_tensors(path, "model file")
    _finite_or_refuse(run_dir, path, tensors)
    bad = first_mismatch(model, tensors)
    if bad:
        raise NormlabError(f"--init-from {run_dir}: {bad}; only keys that keep every shape can change")
    with torch.no_grad():
        state = model.state_dict()
        for name, t in tensors.items():
            state[name].copy_(t.to(state[name].dtype))
    return path


def resolve_init(run_dir: Path, init_from: str | Path | None, resume: bool) -> Path | None:
    """The source run of a new run (``init_from``, recorded in ``run_dir/init_from.json``) or of a resumed one
    (read back from that record); None when the run starts from its seeded initialisation."""
    record = Path(run_dir) / INIT_FROM_FILE
    if resume:
        if init_from is not None:
            raise NormlabError("--init-from cannot be combined with --resume (the run records its source)")
        return Path(read_run_file(record, "init record")["init_from"]) if record.is_file() else None
    return Path(init_from) if init_from is not None else None


def write_record(run_dir: Path, source: Path, weights: Path) -> None:
    write_run_record(run_dir, INIT_FROM_FILE, {"init_from": str(source), "weights": str(weights)})


def source_tokenizer(init_from: str | Path | None) -> str | Path | None:
    """The tokenizer a fine-tune from ``init_from`` must use (its token ids are the source model's): ``"bytes"`` or
    the source run's ``tokenizer.json``; None when there is no source or it predates recorded tokenizers."""
    if init_from is None:
        return None
    info = read_data_info(init_from)
    return None if info is None else tokenizer_ref(Path(init_from), info)
