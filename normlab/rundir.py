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
from typing import TYPE_CHECKING, Any

from normlab.errors import EXIT_DIVERGED, EXIT_INTERRUPTED, EXIT_OK, NormlabError

if TYPE_CHECKING:  # the file readers below stay torch-free (sweep workers record results without torch)
    from normlab.config import RunConfig
    from normlab.data import PreparedData
    from normlab.model import GPT

STATUS_EXIT = {"completed": EXIT_OK, "diverged": EXIT_DIVERGED, "interrupted": EXIT_INTERRUPTED}
"""Exit status of ``normlab train`` (and of a sweep worker) for each ``summary.json`` status."""


def read_summary(run_dir: str | Path) -> dict[str, Any] | None:
    """The run's summary.json, or None when absent (not a JSON object: a one-line error naming the file)."""
    from normlab.io import read_json_object

    path = Path(run_dir) / "summary.json"
    return read_json_object(path, "summary") if path.exists() else None


def read_metrics(path: str | Path) -> list[tuple[int, str, float]]:
    """Numeric values of a ``metrics.jsonl`` as ``(step, key, value)``; unreadable lines (a kill -9) are skipped."""
    from normlab.safety import read_jsonl

    out: list[tuple[int, str, float]] = []
    for rec in read_jsonl(path):
        if not isinstance(rec.get("step"), int):
            continue
        for k, v in rec.items():
            if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool):
                out.append((rec["step"], str(k), float(v)))
    return out


def apply_norm_defaults(cfg: RunConfig) -> None:
    """Fill run-dependent norm options the user did not set, in place (so config.yaml records them).

    A norm class that declares ``needs_warmup`` (PowerNorm, Unified Normalization: statistics warm-up) gets
    ``warmup = train.warmup_steps`` unless ``model.norm_options`` already has a ``warmup`` key.
    """
    from normlab.norms import get_norm_class

    opts = cfg.model.norm_options
    if get_norm_class(cfg.model.norm).needs_warmup and "warmup" not in opts:
        opts["warmup"] = cfg.train.warmup_steps


def open_config(run_dir: str | Path) -> RunConfig:
    """The validated config of a run directory; anything else is a one-line error."""
    from normlab.config import config_from_dict, read_yaml

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
    import torch

    from normlab.model import build_model
    from normlab.train.checkpoint import list_checkpoints, load_model_state

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


@dataclass
class OpenedRun:
    """A trained run opened for evaluation (``open_run``): its model (eval mode, evaluation-time overrides
    applied), the context to evaluate at, its data (the run's own tokenizer; its own corpus, identity-checked,
    or ``--data SOURCE``) and the chosen split's tokens ``[N]``."""

    run_dir: Path
    cfg: RunConfig
    model: GPT
    weights: Path
    overrides: list[str]
    context: int
    data: PreparedData
    source: str | None
    split: str
    tokens: Any

    @property
    def suffix(self) -> str:
        """Output-file suffix for results on another corpus (``normlab.rundata.data_suffix``)."""
        from normlab.rundata import data_suffix

        return data_suffix(self.source, self.data)

    @property
    def data_record(self) -> dict[str, Any]:
        """``{"data": {...}}`` for a result on another corpus, else ``{}`` (``normlab.rundata.data_record``)."""
        from normlab.rundata import data_record

        return data_record(self.source, self.data)


def check_context(mc: Any, context: int) -> None:
    """A context the trained model cannot run at is a one-line error: longer than a learned position table, or
    than its attention kind allows (its ``check_context``: linear attention's static KV-gate table, one scale per
    training position)."""
    if mc.positions == "learned" and context > mc.context:
        raise NormlabError(f"--context {context} exceeds the learned position table ({mc.context}); "
                           "learned positions cannot extrapolate")
    from normlab.attention.registry import check_attention_context

    check_attention_context(mc, context)


def apply_eval_overrides(run: LoadedRun, overrides: list[str]) -> None:
    """Apply ``model.KEY=VALUE`` strings for evaluation-time keys to a loaded run (config and model, in place).

    Any other key is a one-line error: it defines the trained model (its weights were trained with it).
    """
    if not overrides:
        return
    from normlab.attention import eval_time_keys, set_eval_options
    from normlab.config import apply_overrides, config_from_dict

    allowed = [f"model.{k}" for k in eval_time_keys()]
    for item in overrides:
        key = item.split("=", 1)[0].strip()
        if key not in allowed:
            raise NormlabError(f"--set {key}: only evaluation-time keys can change after training "
                               f"({', '.join(allowed)}); every other key defines the trained model")
    data = run.cfg.to_dict()
    apply_overrides(data, overrides)
    run.cfg = config_from_dict(data)
    set_eval_options(run.model, run.cfg.model)


def open_run(args: Any, *, context: int | None = None, batch: int | None = None, what: str = "eval") -> OpenedRun:
    """The one preamble of the evaluation commands (eval, diagnose, calibrate, extrapolate): load the run
    (``args.run_dir``), apply ``args.overrides`` (evaluation-time keys only), check the context it will run at
    (``context``, default the training context: ``check_context``), check that ``batch`` sequences of it fit in
    memory (``normlab.validate.check_eval_memory``, labelled ``what``), load its data (``args.data``: another
    corpus) and pick the split ``args.split`` (``val`` or ``test``; every command picks it the same way,
    ``PreparedData.split``)."""
    from normlab.rundata import run_data
    from normlab.validate import check_eval_memory

    run_dir = Path(args.run_dir)
    run = load_run(run_dir)
    overrides = list(getattr(args, "overrides", None) or [])
    apply_eval_overrides(run, overrides)
    mc = run.cfg.model
    ctx = context if context is not None else mc.context
    check_context(mc, ctx)
    if batch is not None:
        check_eval_memory(mc, batch, ctx, what)
    source = getattr(args, "data", None)
    data = run_data(run_dir, run.cfg, source=source)
    split = getattr(args, "split", "val")
    return OpenedRun(run_dir, run.cfg, run.model, run.weights, overrides, ctx, data, source, split, data.split(split))


def load_data(cfg: RunConfig, *, source: str | None = None, tokenizer: str | Path | None = None,
              check=None) -> PreparedData:
    """Prepare (or reuse from the cache) the tokenised splits of ``cfg.data`` and check they fit the context.

    ``source`` / ``tokenizer`` replace ``cfg.data``'s (a run directory's own tokenizer.json, another corpus);
    ``check``: see ``prepare_data``. Commands on an existing run use ``normlab.rundata.run_data``.
    """
    from normlab.data import prepare_data

    d = cfg.data
    data = prepare_data(source or d.source, tokenizer or d.tokenizer, cache_dir=d.cache_dir,
                        val_fraction=d.val_fraction, test_fraction=d.test_fraction, check=check)
    need = cfg.model.context + 1
    for split in ("train", "val"):
        n = len(getattr(data, split))
        if n < need:
            raise NormlabError(
                f"corpus '{source or d.source}' is too short: its {split} split has {n} tokens, one context window needs {need}"
            )
    return data
