"""Tensor files of a run directory: safetensors for the final weights and for checkpoints (model and optimizer
tensors), JSON for a checkpoint's step, RNG states, data position, config.

Layout of one checkpoint (written into a temp directory, then renamed into place by ``normlab.io.publish_dir``, so
it is whole or absent)::

    RUN_DIR/checkpoints/step_00000100/
        model.safetensors   model state (tied weights stored once)
        optim.safetensors   AdamW state per parameter name: '<name>::exp_avg', '::exp_avg_sq', '::step'
        state.json          {format, step, config_hash, rng: {torch, data}, tokens_seen, elapsed_s, ...}
"""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file as _load_file
from safetensors.torch import save_file as _save_file
from torch import nn

from normlab.errors import NormlabError, clip, printable
from normlab.io import atomic_path, publish_dir, read_json, write_json
from normlab.rundir.files import CHECKPOINTS_DIR, MODEL_FILE

FORMAT = "normlab-checkpoint-v1"
MODEL_FORMAT = "normlab-model-v1"


# -------------------------------------------------------------------------- tensor files (safetensors, never pickle)
def save_file(tensors: dict[str, Any], path: str, metadata: dict[str, str] | None = None) -> None:
    """``safetensors.torch.save_file`` (one name to patch in tests that simulate a full disk)."""
    _save_file(tensors, path, metadata=metadata)


def load_file(path: str) -> dict[str, Any]:
    """``safetensors.torch.load_file``."""
    return _load_file(path)


def save_tensors(path: str | Path, tensors: dict[str, Any], metadata: dict[str, str] | None = None) -> None:
    """Atomically save a flat dict of tensors as safetensors (contiguous copies, shared storage split)."""
    flat = {k: v.detach().contiguous().clone() for k, v in tensors.items()}
    with atomic_path(path) as tmp:
        try:
            save_file(flat, str(tmp), metadata=metadata)
        except SafetensorError as e:  # e.g. no space left on device; the temp file is removed, the old file kept
            raise NormlabError(f"cannot write {path}: {str(e).splitlines()[0][:120]}") from None
        _sort_metadata(tmp)


def _sort_metadata(path: Path) -> None:
    """Rewrite a safetensors header in place with its ``__metadata__`` keys sorted (the writer emits them in
    hash-map order, so identical runs gave files with different sha256). Same length, same tensors."""
    with open(path, "r+b") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        raw = f.read(n)
        header = json.loads(raw)
        meta = header.get("__metadata__")
        if not meta:
            return
        header["__metadata__"] = dict(sorted(meta.items()))
        new = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
        if len(new) > n or json.loads(new) != json.loads(raw):
            return
        f.seek(8)
        f.write(new + b" " * (n - len(new)))


def load_tensors(path: str | Path, what: str = "checkpoint") -> dict[str, Any]:
    """Load a safetensors file; missing, truncated or foreign files are one-line NormlabErrors."""
    path = Path(path)
    if not path.is_file():
        raise NormlabError(f"{what} {path} not found")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as e:
        raise NormlabError(f"{what} {path} is truncated or corrupted ({str(e).splitlines()[0][:80]})") from None


# -------------------------------------------------------------------------------------------- models, checkpoints

def model_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """State dict with tied (shared) tensors stored once, under their first name."""
    seen: dict[int, str] = {}
    out = {}
    for name, t in model.state_dict().items():
        key = t.data_ptr() if t.numel() else id(t)
        if key in seen:
            continue
        seen[key] = name
        out[name] = t
    return out


def save_model(model: nn.Module, path: str | Path, config_hash: str) -> None:
    """Atomically write ``model`` to ``path`` (safetensors with format metadata)."""
    save_tensors(path, model_tensors(model), metadata={"format": MODEL_FORMAT, "config_hash": config_hash})


def load_model_state(model: nn.Module, path: str | Path) -> None:
    """Load weights into ``model``; a foreign or mismatched file is a one-line NormlabError."""
    tensors = load_tensors(path, "model file")
    expected = model_tensors(model)
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    if missing or unexpected:
        what = f"missing {missing[:3]}" if missing else f"unexpected {unexpected[:3]}"
        raise NormlabError(f"{path} does not match this model's config ({what})")
    for name, t in tensors.items():
        if t.shape != expected[name].shape:
            raise NormlabError(
                f"{path}: tensor '{name}' has shape {tuple(t.shape)}, config expects {tuple(expected[name].shape)}"
            )
        if expected[name].is_floating_point() and not t.is_floating_point():
            raise NormlabError(f"{path}: tensor '{name}' has dtype {t.dtype}, the model needs a floating-point tensor")
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise NormlabError(
                f"{path}: tensor '{name}' contains NaN or inf; these weights cannot be evaluated or resumed"
            )
    model.load_state_dict(tensors, strict=False)


def optimizer_tensors(opt: torch.optim.Optimizer, names: dict[int, str]) -> dict[str, torch.Tensor]:
    """Flatten optimizer state to ``{'<param name>::<key>': tensor}``."""
    out = {}
    for p, state in opt.state.items():
        for k, v in state.items():
            out[f"{names[id(p)]}::{k}"] = v if torch.is_tensor(v) else torch.tensor(v)
    return out


def load_optimizer_tensors(
    opt: torch.optim.Optimizer, tensors: dict[str, torch.Tensor], params: dict[str, nn.Parameter]
) -> None:
    """Inverse of :func:`optimizer_tensors`."""
    for key, v in tensors.items():
        name, _, k = key.partition("::")
        if name not in params:
            raise NormlabError(f"optimizer state names unknown parameter '{name}'")
        fused = bool(opt.defaults.get("fused"))  # the fused kernels read the step on the parameters' device
        on_cpu = k == "step" and not fused
        opt.state[params[name]][k] = v if on_cpu else v.to(params[name].device)  # step stays on the CPU


def checkpoint_tensors(model: nn.Module, opt: torch.optim.Optimizer
                       ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """What a checkpoint of ``model`` and ``opt`` holds: the model's tensors (:func:`model_tensors`) and the
    optimizer's state (:func:`optimizer_tensors`), the live tensors themselves (copy them before training changes
    them: normlab.train.checkpointer)."""
    names = {id(p): n for n, p in model.named_parameters()}
    return model_tensors(model), optimizer_tensors(opt, names)


def save_checkpoint(run_dir: Path, step: int, model_t: dict[str, torch.Tensor], optim_t: dict[str, torch.Tensor],
                    state: dict[str, Any], config_hash: str, keep: int) -> Path:
    """Write ``checkpoints/step_XXXXXXXX`` (the model's tensors ``model_t`` and the optimizer's ``optim_t``, from
    :func:`checkpoint_tensors`, and ``state.json``) atomically (temp dir + rename); then prune to the newest
    ``keep``."""
    final = run_dir / CHECKPOINTS_DIR / f"step_{step:08d}"
    with publish_dir(final, replace=True) as tmp:  # a checkpoint of the same step (resumed there) is replaced
        save_tensors(tmp / MODEL_FILE, model_t, metadata={"format": MODEL_FORMAT, "config_hash": config_hash})
        save_tensors(tmp / "optim.safetensors", optim_t, {"format": FORMAT})
        write_json(tmp / "state.json", {"format": FORMAT, "step": step, "config_hash": config_hash, **state})
    for old in list_checkpoints(run_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoint directories, oldest first (temp directories start with '.')."""
    ckdir = Path(run_dir) / CHECKPOINTS_DIR
    if not ckdir.is_dir():
        return []
    return sorted(p for p in ckdir.iterdir() if p.is_dir() and p.name.startswith("step_"))


def _shown(v: Any) -> str:
    """``v`` for an error line: a string quoted (``'7'`` is not the step 7), clipped, control characters escaped."""
    return clip(repr(v) if isinstance(v, str) else v, 40)


def _count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _state_problem(state: dict[str, Any], name: str) -> str | None:
    """What is wrong with the fields of a checkpoint's ``state.json`` that a resume reads before anything else
    (``normlab.train.runstate.RunState.resume``: it truncates metrics.jsonl to ``step``), or None. ``name``: the
    checkpoint directory's name, ``step_XXXXXXXX``, whose step the state must hold."""
    want = int(name[5:]) if name[:5] == "step_" and name[5:].isdigit() else None
    if not _count(state.get("step")) or (want is not None and state["step"] != want):
        return f"step must be {want} (its directory's step), got {_shown(state.get('step'))}"
    if not _count(state.get("tokens_seen")):
        return f"tokens_seen must be an integer >= 0, got {_shown(state.get('tokens_seen'))}"
    t = state.get("elapsed_s")
    if not (isinstance(t, (int, float)) and not isinstance(t, bool) and 0 <= t < float("inf")):
        return f"elapsed_s must be a finite number >= 0, got {_shown(t)}"
    if not isinstance(state.get("config_hash"), str):
        return f"config_hash must be a string, got {_shown(state.get('config_hash'))}"
    rng = state.get("rng")
    if not (isinstance(rng, dict) and "data" in rng):
        return f"rng must be an object with the data generator's state (data), got {_shown(rng)}"
    for k, v in rng.items():
        if not (isinstance(v, list) and all(_count(x) and x < 256 for x in v)):
            return f"rng.{printable(k)} must be a list of bytes (integers 0-255), got {_shown(v)}"
    return None


def load_checkpoint(path: Path, model: nn.Module, opt: torch.optim.Optimizer) -> dict[str, Any]:
    """Restore model and optimizer from checkpoint dir ``path``; returns its ``state.json``."""
    state = read_json(path / "state.json", "checkpoint state")
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise NormlabError(f"{path} is not a normlab checkpoint (format {FORMAT} expected)")
    why = _state_problem(state, path.name)
    if why:
        raise NormlabError(f"checkpoint state {path / 'state.json'}: {why}; resume from another checkpoint (move "
                           "this one away) or start the run again")
    load_model_state(model, path / MODEL_FILE)
    tensors = load_tensors(path / "optim.safetensors", "optimizer checkpoint")
    load_optimizer_tensors(opt, tensors, dict(model.named_parameters()))
    return state
