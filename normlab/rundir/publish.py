"""The one writer of a finished run directory: ``publish_run`` (a new directory, whole or absent) and ``write_run``
(the same files into a directory being built, e.g. remove-norm's stages inside its own published directory).

A finished run directory holds ``config.yaml`` (``dump_config``), ``model.safetensors`` (the config hash in its
metadata, normlab.rundir.tensors.save_model), the identity files of the run it was derived from (``tokenizer.json``,
``data.json``, ``provenance.json``: a derived run stays self-contained), the writer's own records (``conversion.json``,
``quantization.json``, ``removal.json``, ``hf_import.json``) and ``summary.json``, written last. Used by convert,
quantize, remove-norm and import. The trainer builds its directory in place as it trains (normlab.train.loop) but
writes these same files through here: ``write_config`` when it starts, ``finish_run`` (model.safetensors, then
summary.json last) when it ends or stops, ``finish_interrupted`` (summary.json from the last checkpoint) when a
second Ctrl-C stops it at once.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from normlab.errors import NormlabError
from normlab.io import publish_dir, write_json, write_text
from normlab.rundir.files import CONFIG_FILE, DATA_FILE, MODEL_FILE, PROVENANCE_FILE, SUMMARY_FILE, TOKENIZER_FILE
from normlab.rundir.readers import read_run_file

if TYPE_CHECKING:
    from torch import nn

    from normlab.config import RunConfig

IDENTITY_FILES = (TOKENIZER_FILE, DATA_FILE, PROVENANCE_FILE)


def copy_identity(src: str | Path, dst: str | Path) -> None:
    """Keep a derived run directory self-contained: copy the source's tokenizer.json, data.json, provenance.json
    (those it has) into ``dst``."""
    for name in IDENTITY_FILES:
        if (Path(src) / name).is_file():
            shutil.copy2(Path(src) / name, Path(dst) / name)


def write_record(path: str | Path, name: str, record: dict[str, Any]) -> None:
    """Write the JSON record ``name`` (a file name of ``normlab.rundir.files``: ``summary.json``, ``probes.json``,
    ``init_from.json``, a writer's own record) into the run directory ``path``: atomic, strict JSON (non-finite
    numbers as null). The one way a JSON record of a run directory is written."""
    write_json(Path(path) / name, record)


def write_config(path: str | Path, config: RunConfig) -> None:
    """Write ``config.yaml`` (normlab.config.dump_config) into the directory ``path`` (created if missing)."""
    from normlab.config import dump_config

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    write_text(path / CONFIG_FILE, dump_config(config))


def finish_run(path: str | Path, config: RunConfig, model: nn.Module | None, summary: dict[str, Any]) -> None:
    """End a run's files in ``path``: ``model.safetensors`` (when ``model`` is given; a stopped run has none), then
    ``summary.json``, always last (a reader that sees the summary sees every other file)."""
    from normlab.rundir.tensors import save_model

    path = Path(path)
    if model is not None:
        save_model(model, path / MODEL_FILE, config.hash())
    write_record(path, SUMMARY_FILE, summary)


def finish_interrupted(path: str | Path, config: RunConfig, run_hash: str) -> dict[str, Any]:
    """End a run stopped at once (a second Ctrl-C) with ``summary.json`` alone (``finish_run`` without a model:
    resumable from its last checkpoint): status ``interrupted`` with the last checkpoint's step, metrics, tokens and
    time (``state.json``); ``run_hash``: the run's config hash (a resumed run's comes from its checkpoint).
    Returns the summary."""
    from normlab.rundir.tensors import list_checkpoints

    path = Path(path)
    ckpts = list_checkpoints(path)
    state = read_run_file(ckpts[-1] / "state.json", "checkpoint state", "object") if ckpts else {}
    last = state.get("final") or {}
    summary = {
        "status": "interrupted", "step": state.get("step", 0), "steps": config.train.steps,
        "train_loss": last.get("train_loss"), "val_loss": last.get("val_loss"), "val_bpb": last.get("val_bpb"),
        "best_val_bpb": state.get("best_val_bpb"), "entropy_floor_bpb": None, "gap_bpb": None,
        "tokens_seen": state.get("tokens_seen", 0), "tokens_per_s": 0.0, "elapsed_s": state.get("elapsed_s", 0.0),
        "params": None, "config_hash": state.get("run_hash", run_hash), "loss_spikes": None, "run_dir": str(path),
    }
    finish_run(path, config, None, summary)
    return summary


def write_run(path: str | Path, config: RunConfig, model: nn.Module, summary: dict[str, Any] | None = None, *,
              derived_from: str | Path | None = None, records: dict[str, dict[str, Any]] | None = None) -> None:
    """Write a run's files into the directory ``path`` (created if missing): the identity files of
    ``derived_from``, ``config.yaml``, ``model.safetensors``, each ``records`` item (file name -> JSON object) and,
    when given, ``summary.json``."""
    from normlab.rundir.tensors import save_model

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    if derived_from is not None:
        copy_identity(derived_from, path)
    write_config(path, config)
    save_model(model, path / MODEL_FILE, config.hash())
    for name, record in (records or {}).items():
        write_record(path, name, record)
    if summary is not None:
        write_record(path, SUMMARY_FILE, summary)


@dataclass
class PendingRun:
    """A run directory being published: ``path`` is its temp directory (config.yaml and model.safetensors already
    written, so the writer can load back and check what it wrote); set ``summary`` and add ``records`` before the
    ``with`` block ends."""

    path: Path
    summary: dict[str, Any] | None = None
    records: dict[str, dict[str, Any]] = field(default_factory=dict)


@contextmanager
def publish_run(out: str | Path, config: RunConfig, model: nn.Module, *,
                derived_from: str | Path | None = None) -> Iterator[PendingRun]:
    """Publish the run directory ``out`` whole or not at all (normlab.io.publish_dir): config.yaml and
    model.safetensors are written into a temp directory, yielded as ``PendingRun``; when the block ends without
    error the identity files of ``derived_from``, the records and summary.json are written and the directory is
    renamed to ``out``. An error in the block (a failed check) leaves nothing behind."""
    with publish_dir(out) as tmp:
        write_run(tmp, config, model)
        run = PendingRun(tmp)
        yield run
        if run.summary is None:
            raise NormlabError(f"internal: {out} was about to be published without a summary")
        if derived_from is not None:
            copy_identity(derived_from, tmp)
        for name, record in run.records.items():
            write_record(tmp, name, record)
        write_record(tmp, SUMMARY_FILE, run.summary)


__all__ = ["IDENTITY_FILES", "PendingRun", "copy_identity", "finish_interrupted", "finish_run", "publish_run",
           "write_config", "write_record", "write_run"]
