"""Run directories: what a normlab run leaves on disk, and how every later tool opens it (the one owner).

    RUN_DIR/config.yaml        full config (every key)
    RUN_DIR/param_groups.json  optimizer grouping (which parameters get weight decay)
    RUN_DIR/metrics.jsonl      one JSON object per logged step / evaluation (``read_jsonl``, ``read_metrics``)
    RUN_DIR/checkpoints/       resumable checkpoints (see normlab.rundir.tensors)
    RUN_DIR/model.safetensors  final weights
    RUN_DIR/summary.json       {status: completed|diverged|interrupted, step, final metrics} (``read_summary``;
                               ``STATUS_EXIT`` maps the status to the exit code of ``normlab train``)
    RUN_DIR/fingerprint.json   what determines the numbers: sha256 of resolved config + parameter names/shapes/order
                               + normlab and torch versions (normlab.rundir.fingerprint; caches check it)
    RUN_DIR/tokenizer.json     the BPE tokenizer the run was trained with (Hugging Face ``tokenizers`` JSON);
                               absent for the byte tokenizer, which ``data.json`` describes instead
    RUN_DIR/data.json          the corpus identity: source string, absolute path of a local corpus, content sha256
                               (``normlab.data.sources.content_hash``), size in bytes and documents, the split rule
                               and fractions with each split's tokens/bytes/documents, the data-order seed, and the
                               tokenizer (kind, vocab size, file + sha256)
    RUN_DIR/provenance.json    normlab version, git commit (when run from a checkout), Python and torch versions

The run's data (``run_data``; ``eval``, ``diagnose``, ``calibrate``, ``extrapolate``, ``convert``, surgery, export,
``train --resume``): tokenized with the run's own ``tokenizer.json`` (never a BPE retrained from the corpus); a
local corpus is found by its recorded absolute path (so the run works from any working directory and after being
moved or copied), and a corpus whose content changed since training is refused with one line naming what changed.
``source=`` (``--data SOURCE``) scores another corpus with the run's tokenizer. Runs written before these files
existed fall back to ``cfg.data`` as before.

The evaluation commands (eval, diagnose, calibrate, extrapolate) open a run with ``open_run``: one preamble, one
split rule (``--split val|test``, default ``val``: that split of the run's own corpus, or of ``--data SOURCE``).

Importing this module does not import torch (sweep workers record results with the file readers below).
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import platform
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from normlab.errors import EXIT_DIVERGED, EXIT_INTERRUPTED, EXIT_OK, NormlabError
from normlab.io import (MAX_JSON_BYTES, MAX_JSONL_BYTES, MAX_YAML_BYTES, atomic_path, json_object, loads_json,
                        parse_json, parse_yaml, read_bytes, read_lines, write_json)
from normlab.provenance import version_info
from normlab.rundir.curves import Curve
from normlab.rundir.files import (CHECKPOINTS_DIR, CONFIG_FILE, DATA_FILE, FINGERPRINT_FILE, MODEL_FILE,
                               PROVENANCE_FILE, SUMMARY_FILE, TOKENIZER_FILE)
from normlab.validate import check_eval_memory

if TYPE_CHECKING:  # nothing here imports torch at import time (sweep workers record results without it)
    from normlab.config import RunConfig
    from normlab.data import Corpus, PreparedData, Tokenizer
    from normlab.model import GPT

LOCAL_KINDS = ("text", "directory", "jsonl")
BYTES_DESCRIPTION = "one token per byte: id = byte value (0-255), no special tokens; decode = the bytes themselves"

STATUS_EXIT = {"completed": EXIT_OK, "diverged": EXIT_DIVERGED, "interrupted": EXIT_INTERRUPTED}
"""Exit status of ``normlab train`` (and of a sweep worker) for each ``summary.json`` status."""


SUMMARY_TYPES: dict[str, tuple[type, ...]] = {
    "status": (str,), "config_hash": (str,), "step": (int,), "steps": (int,), "params": (int,), "tokens_seen": (int,),
    **{k: (int, float) for k in ("val_bpb", "best_val_bpb", "val_loss", "train_loss", "final_val_loss",
                                 "entropy_floor_bpb", "unigram_bpb", "gap_bpb", "init_val_loss", "init_val_bpb",
                                 "tokens_per_s", "elapsed_s", "compile_s", "wall_s", "peak_mem_mb")},
}
"""The type of each ``summary.json`` key that readers use (``normlab runs``, sweeps, reports); each may be null
(a non-finite number is written as null), booleans are not numbers."""


FORMS = {"bytes": MAX_JSON_BYTES, "jsonl": MAX_JSONL_BYTES, "json": MAX_JSON_BYTES, "object": MAX_JSON_BYTES,
         "yaml": MAX_YAML_BYTES}
"""How ``read_run_file`` reads each kind of file, with the most bytes it reads of one."""


def read_run_file(path: str | Path, what: str, form: str = "json") -> Any:
    """A file of a run directory, the one way this package opens one: ``normlab.io.read_bytes`` (a regular file
    under the cap of its ``form``; a FIFO, device, directory, missing, unreadable or larger file is one line naming
    ``what`` and the path), then by ``form``: ``bytes`` as read (``tokenizer.json``, hashed), ``jsonl`` as an
    iterator of its lines, streamed (``normlab.io.read_lines``: ``metrics.jsonl``, parsed line by line by
    ``iter_jsonl``; checked when this is called, read as it is consumed), ``json`` parsed, ``object`` parsed and a
    JSON object (``summary.json``, ``state.json``), ``yaml`` parsed (``config.yaml``)."""
    path = Path(path)
    if form == "jsonl":
        return read_lines(path, what, FORMS[form])
    raw = read_bytes(path, what, FORMS[form])
    label = f"{what} {path}"
    if form == "bytes":
        return raw
    if form == "yaml":
        return parse_yaml(raw, label)
    obj = parse_json(raw, label)
    return json_object(obj, label) if form == "object" else obj


def check_summary(summary: dict[str, Any], path: str | Path) -> dict[str, Any]:
    """``summary`` when each key of ``SUMMARY_TYPES`` it holds has its type (or is null); else a one-line error
    naming the file, the key, the value and the type it must have."""
    for key, types in SUMMARY_TYPES.items():
        v = summary.get(key)
        if v is not None and (not isinstance(v, types) or isinstance(v, bool)):
            want = "text" if types == (str,) else "an integer" if types == (int,) else "a number"
            raise NormlabError(f"summary {path}: \"{key}\" is {json.dumps(v)[:40]}, not {want} (or null); the file "
                               "is damaged or was not written by normlab")
    return summary


def read_summary(run_dir: str | Path) -> dict[str, Any] | None:
    """The run's summary.json, or None when absent; a FIFO or device in its place, a file over 64 MiB, anything
    but a JSON object, or a key of the wrong type (``check_summary``) is a one-line error naming the file."""
    path = Path(run_dir) / SUMMARY_FILE
    return check_summary(read_run_file(path, "summary", "object"), path) if os.path.lexists(path) else None


def read_run_hash(run_dir: str | Path) -> str | None:
    """The run's config hash: ``RunConfig.hash()`` of the config as handed to the trainer (what ``normlab config``
    prints and the default run folder's name holds), before the data and the machine fill in ``vocab_size``,
    ``device``, ``train.precision`` and ``train.compile`` (config.yaml records those filled in, so its own hash can
    differ). From ``summary.json``, else (a run still training, or killed) from the newest checkpoint's state, else
    from ``fingerprint.json`` (killed before its first checkpoint); None when none records it."""
    summary = read_summary(run_dir)
    if summary is not None and isinstance(summary.get("config_hash"), str):
        return summary["config_hash"]
    ckdir = Path(run_dir) / CHECKPOINTS_DIR
    steps = sorted(p for p in ckdir.iterdir() if not p.name.startswith(".")) if ckdir.is_dir() else []
    for ck in reversed(steps):
        if os.path.lexists(ck / "state.json"):
            state = read_run_file(ck / "state.json", "checkpoint state", "object")
            value = state.get("run_hash")
            return value if isinstance(value, str) else None
    return declared_hash(run_dir)


def declared_hash(run_dir: str | Path) -> str | None:
    """The config hash a run was started with, as its ``fingerprint.json`` records it (written right after
    config.yaml; None for a run from before it was recorded, or without the file)."""
    path = Path(run_dir) / FINGERPRINT_FILE
    if not os.path.lexists(path):
        return None
    value = read_run_file(path, "fingerprint", "object").get("config_hash")
    return value if isinstance(value, str) else None


# ------------------------------------------------------------------------------------------ metrics.jsonl readers
def iter_jsonl(path: str | Path) -> Iterator[dict[str, Any]]:
    """The JSON-object lines of a ``metrics.jsonl``, streamed (nothing when absent): the file is opened and checked
    by this call (a FIFO or device in its place, or a file over 256 MiB, is a one-line error: ``read_run_file``),
    then read and parsed one line at a time as the iterator is consumed, each line through the bounded JSON reader
    (``normlab.io.loads_json``), so memory holds one line, never the file. Lines that are cut (kill -9), junk, not
    UTF-8, nested too deep or holding an over-long integer are skipped, as are records whose ``step`` is not an
    integer."""
    path = Path(path)
    if not os.path.lexists(path):
        return iter(())
    lines = read_run_file(path, "metrics", "jsonl")
    label = f"metrics {path}"

    def records() -> Iterator[dict[str, Any]]:
        for raw in lines:
            try:
                rec = loads_json(raw, label)
            except NormlabError:
                continue
            if isinstance(rec, dict) and isinstance(rec.get("step", 0), int) and not isinstance(rec.get("step"), bool):
                yield rec

    return records()


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """``iter_jsonl`` as a list (``[]`` when absent): for a run's own short files (resume, diagnostics); a report
    over metrics of any size reads columns instead (``read_curves``)."""
    return list(iter_jsonl(path))


def _numbers(rec: dict[str, Any]) -> Iterator[tuple[int, str, float]]:
    step = rec.get("step")
    if not isinstance(step, int):
        return
    for k, v in rec.items():
        if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool):
            yield step, str(k), float(v)


def read_metrics(path: str | Path) -> list[tuple[int, str, float]]:
    """Numeric values of a ``metrics.jsonl`` as ``(step, key, value)``; unreadable lines (a kill -9) are skipped."""
    return [t for rec in iter_jsonl(path) for t in _numbers(rec)]


def read_curves(path: str | Path) -> dict[str, Curve]:
    """The numeric values of a ``metrics.jsonl`` as columns, ``{key: Curve}`` (steps and values in two typed arrays,
    16 bytes a point, in file order): the same points as ``read_metrics``, streamed from ``iter_jsonl``, so
    memory is a small multiple of the file's numeric content, not of its parsed records (``normlab report`` on a
    metrics file near the 256 MiB cap)."""
    out: dict[str, Curve] = {}
    for rec in iter_jsonl(path):
        for step, key, value in _numbers(rec):
            curve = out.get(key)
            if curve is None:
                curve = out[key] = Curve()
            curve.add(step, value)
    return out


def read_initial(metrics_path: str | Path) -> dict[str, float]:
    """The step-0 ``init_val_*`` record of a run's metrics.jsonl (``{}`` when absent: a run from an older normlab)."""
    for rec in read_jsonl(metrics_path):
        if rec.get("step") == 0 and "init_val_bpb" in rec:
            return {k: float(rec[k]) for k in ("init_val_loss", "init_val_bpb") if k in rec}
        if isinstance(rec.get("step"), int) and rec["step"] > 0:
            break
    return {}


def last_step(metrics: str | Path) -> int | None:
    """The ``step`` of the last complete record of a ``metrics.jsonl`` (reads only its tail), or None (also for a
    FIFO, device or socket in its place, which is never opened: it could block forever)."""
    try:
        if not stat.S_ISREG(os.stat(metrics).st_mode):
            return None
        with open(metrics, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 8192))
            tail = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    for line in reversed(tail.splitlines()):
        try:  # the bounded reader: a line nested 100k deep or with a 5000-digit integer is junk, not a traceback
            step = loads_json(line, f"metrics {metrics}").get("step")
        except (NormlabError, AttributeError):
            continue
        if isinstance(step, int):
            return step
    return None


# ---------------------------------------------------------------------------------------------------- config
RUN_SECTIONS = ("data", "model", "train", "optim", "diag")
"""The mappings every run's config.yaml holds (``RunConfig.to_dict``; ``seed`` and ``device`` are scalars)."""


def open_config(run_dir: str | Path) -> RunConfig:
    """The config a run directory's ``config.yaml`` holds, as the run resolved it (``normlab.config.stored_config``:
    nothing completed again); anything else is a one-line error."""
    from normlab.config import config_mapping, stored_config

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise NormlabError(f"run directory {run_dir} " + ("is a file, not a directory" if os.path.lexists(run_dir)
                                                          else "does not exist"))
    path = run_dir / CONFIG_FILE
    if not os.path.lexists(path):  # a FIFO or device named config.yaml: read_run_file's one-line refusal
        raise NormlabError(f"{run_dir} is not a normlab run (no config.yaml)")
    data = config_mapping(read_run_file(path, "config", "yaml"), f"config {path}")
    # a run's config.yaml holds every section, resolved (normlab train writes them all): a missing one is a damaged
    # file, not the defaults (which would build another model, or resume another run)
    if not data:
        raise NormlabError(f"config {path} is empty; a run's config.yaml holds every section (damaged? restore it "
                           "or re-run)")
    missing = [k for k in RUN_SECTIONS if not isinstance(data.get(k), dict)]
    if missing:
        raise NormlabError(f"config {path} has no '{missing[0]}' mapping; a run's config.yaml holds every section "
                           f"({', '.join(RUN_SECTIONS)}): truncated or edited?")
    return stored_config(data, f"config {path}")  # a key out of its type or range: the line names the file


# --------------------------------------------------------------------------------- data identity and the run's data
def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _resolved_source(meta: dict[str, Any]) -> str | None:
    """A source string naming a local corpus by its absolute path (with its glob/field), else None."""
    kind, path = meta.get("kind"), meta.get("path")
    if kind not in LOCAL_KINDS or not path:
        return None
    if kind == "directory":
        return f"{path}?glob={meta.get('glob', '*')}"
    if kind == "jsonl":
        return f"{path}?field={meta.get('field', 'text')}"
    return str(path)


def save_run_identity(run_dir: str | Path, cfg: RunConfig, data: PreparedData) -> dict[str, Any]:
    """Write ``tokenizer.json`` (BPE), ``data.json`` and ``provenance.json`` into a new run directory."""
    import torch

    from normlab.data import BPETokenizer
    from normlab.data.tokenizer import DOC_SUFFIX

    run_dir = Path(run_dir)
    m, tok = data.meta, data.tokenizer
    doc = {"doc_token": tok.doc_token} if tok.doc_token is not None else {}  # DocTokenizer: the separator's id
    if isinstance(getattr(tok, "base", tok), BPETokenizer):
        with atomic_path(run_dir / TOKENIZER_FILE) as tmp:
            tok.save(tmp)
        tok_info: dict[str, Any] = {"kind": "bpe", "spec": cfg.data.tokenizer, "vocab_size": tok.vocab_size,
                                    "file": TOKENIZER_FILE, "sha256": _sha256(run_dir / TOKENIZER_FILE), **doc}
    else:
        tok_info = {"kind": "bytes", "spec": "bytes" + (DOC_SUFFIX if doc else ""), "vocab_size": tok.vocab_size,
                    "description": BYTES_DESCRIPTION, **doc}
    info = {
        "source": cfg.data.source, "resolved_source": _resolved_source(m), "kind": m.get("kind"),
        "content_hash": m["content_hash"], "num_bytes": m["num_bytes"], "num_docs": m["num_docs"],
        **({"python_version": m["python_version"]} if m.get("kind") in ("pystdlib", "english") else {}),
        "splits": {
            "rule": ("contiguous byte ranges [train | val | test]" if m["num_docs"] < 3 else
                     "per document: sha256(doc)[:8] / 2**64 against the fractions (no random seed)"),
            "val_fraction": cfg.data.val_fraction, "test_fraction": cfg.data.test_fraction,
            "tokens": m.get("split_tokens"), "bytes": m.get("split_bytes"), "docs": m.get("split_docs"),
        },
        "data_order_seed": cfg.seed,
        "tokenizer": tok_info,
    }
    write_json(run_dir / DATA_FILE, info)
    write_json(run_dir / PROVENANCE_FILE, {
        **version_info(), "python": platform.python_version(), "torch": torch.__version__,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    })
    return info


def read_data_info(run_dir: str | Path) -> dict[str, Any] | None:
    """``RUN_DIR/data.json``, or None for a run written before normlab recorded it."""
    path = Path(run_dir) / DATA_FILE
    if not os.path.lexists(path):
        return None
    info = read_run_file(path, "data identity")
    if not isinstance(info, dict) or "content_hash" not in info or "tokenizer" not in info:
        raise NormlabError(f"{path} is not a normlab data identity (no content_hash/tokenizer)")
    tok = info["tokenizer"]
    if not isinstance(info["content_hash"], str) or not isinstance(tok, dict):
        raise NormlabError(f"{path} is damaged: content_hash must be text and tokenizer an object")
    name = tok.get("file", TOKENIZER_FILE)
    if not isinstance(name, str) or Path(name).name != name or name in ("", ".", ".."):
        raise NormlabError(f"{path} is damaged: tokenizer.file must be a file name inside the run directory, got "
                           f"{json.dumps(name)[:60]}")
    return info


def tokenizer_ref(run_dir: Path, info: dict[str, Any]) -> str | Path:
    """``"bytes"``, or the path of the run's own tokenizer.json after checking it is the one trained with."""
    t = info["tokenizer"]
    if t.get("kind") == "bytes":
        return "bytes"
    path = run_dir / str(t.get("file", TOKENIZER_FILE))
    if not os.path.lexists(path):
        raise NormlabError(f"{run_dir} lacks {path.name}, the BPE tokenizer it was trained with; restore it "
                           "from a copy of the run directory")
    raw = read_run_file(path, "tokenizer", "bytes")  # a regular file under the cap (a FIFO is one line)
    if t.get("sha256") and hashlib.sha256(raw).hexdigest() != t["sha256"]:
        raise NormlabError(f"{path} was modified since training (sha256 differs from data.json); the model's token "
                           "ids belong to the original file")
    return path


def run_tokenizer(run_dir: str | Path, cfg: RunConfig) -> Tokenizer:
    """The run's tokenizer without touching the corpus (``generate``); old runs rebuild it from ``cfg.data``."""
    from normlab.data import BPETokenizer, BytesTokenizer
    from normlab.data.tokenizer import split_doc_suffix, with_doc_token

    run_dir = Path(run_dir)
    info = read_data_info(run_dir)
    if info is None:
        return load_data(cfg).tokenizer
    ref = tokenizer_ref(run_dir, info)
    base_spec, doc = split_doc_suffix(info["tokenizer"].get("spec") or "bytes")
    tok = BytesTokenizer() if ref == "bytes" else BPETokenizer.from_file(ref, name=base_spec)
    return with_doc_token(tok, doc)


def check_identity(run_dir: Path, info: dict[str, Any], corpus: Corpus) -> None:
    """One-line error naming what changed when ``corpus`` is not the content the run was trained on."""
    m = corpus.meta
    if m["content_hash"] == info["content_hash"]:
        return
    changes = []
    if m["num_bytes"] != info.get("num_bytes"):
        changes.append(f"size {info.get('num_bytes'):,} -> {m['num_bytes']:,} bytes")
    if m["num_docs"] != info.get("num_docs"):
        changes.append(f"documents {info.get('num_docs'):,} -> {m['num_docs']:,}")
    if info.get("python_version") and m.get("python_version") != info["python_version"]:
        changes.append(f"python {info['python_version']} -> {m.get('python_version')}")
    changes.append(f"content sha256 {info['content_hash'][:12]}... -> {m['content_hash'][:12]}...")
    raise NormlabError(f"corpus '{corpus.source}' changed since {run_dir} was trained ({', '.join(changes)}); the "
                       f"run's splits belong to the old content: restore it, or score the new one with --data "
                       f"{corpus.source} (eval, diagnose, calibrate, extrapolate)")


def run_data(run_dir: str | Path, cfg: RunConfig, source: str | None = None, *,
             need_window: Sequence[str] = ("train", "val"), whole_ok: bool = False) -> PreparedData:
    """The tokenized splits for a trained run: its own corpus (identity-checked) or ``source`` (``--data``),
    always with the run's own tokenizer; a vocabulary that does not match the model is a one-line error.
    ``need_window``: the splits that must hold one context window; ``whole_ok``: a corpus too short to split is
    prepared whole (``load_data``)."""
    from normlab.data.tokenizer import DOC_SUFFIX, split_doc_suffix

    run_dir = Path(run_dir)
    info = read_data_info(run_dir)
    if info is None:  # written before run directories recorded their data
        if source is not None and cfg.data.tokenizer != "bytes":
            raise NormlabError(f"{run_dir} has no {DATA_FILE}/{TOKENIZER_FILE} (trained before run directories kept "
                               "their tokenizer); --data needs the run's own BPE tokenizer")
        data = load_data(cfg, source=source, need_window=need_window, whole_ok=whole_ok)
    else:
        tokenizer = tokenizer_ref(run_dir, info)
        if split_doc_suffix(info["tokenizer"].get("spec") or "bytes")[1]:  # trained with a document token
            tokenizer = f"{tokenizer}{DOC_SUFFIX}"
        if source is not None:
            data = load_data(cfg, source=source, tokenizer=tokenizer, need_window=need_window, whole_ok=whole_ok)
        else:
            resolved = info.get("resolved_source")
            own = resolved if resolved and Path(resolved.partition("?")[0]).exists() else info["source"]
            if resolved and own == info["source"] and not Path(info["source"].partition("?")[0]).exists():
                raise NormlabError(f"the corpus of {run_dir} is gone: {resolved.partition('?')[0]} does not exist "
                                   f"(source '{info['source']}' at training time); score another corpus with --data "
                                   "SOURCE")
            data = load_data(cfg, source=own, tokenizer=tokenizer, need_window=need_window, whole_ok=whole_ok,
                             check=lambda corpus: check_identity(run_dir, info, corpus))
    if cfg.model.vocab_size and data.vocab_size != cfg.model.vocab_size:
        raise NormlabError(f"the tokenizer gives {data.vocab_size} token ids but the model of {run_dir} has "
                           f"{cfg.model.vocab_size}; it is not the tokenizer the run was trained with")
    return data


def data_suffix(source: str | None, data: PreparedData) -> str:
    """Output-file suffix for results on another corpus (``--data``): ``_data-<content sha256[:12]>``, else ``""``."""
    return f"_data-{data.meta['content_hash'][:12]}" if source is not None else ""


def data_record(source: str | None, data: PreparedData) -> dict[str, Any]:
    """``{"data": {...}}`` for the JSON of a result on another corpus (``--data``), else ``{}``."""
    if source is None:
        return {}
    m = data.meta
    return {"data": {"source": source, "content_hash": m["content_hash"], "num_bytes": m["num_bytes"],
                     "num_docs": m["num_docs"]}}


def load_data(cfg: RunConfig, *, source: str | None = None, tokenizer: str | Path | None = None,
              check=None, need_window: Sequence[str] = ("train", "val"), whole_ok: bool = False) -> PreparedData:
    """Prepare (or reuse from the cache) the tokenised splits of ``cfg.data`` and check they fit the context.

    ``source`` / ``tokenizer`` replace ``cfg.data``'s (a run directory's own tokenizer.json, another corpus);
    ``check``: see ``prepare_data``; ``need_window``: the splits that must hold one context window of
    ``context + 1`` tokens (training and its evaluations; scoring a file, as lm-eval does, needs none: a window
    may be shorter than the context); ``whole_ok``: a corpus too short to split into train/val/test (under 3 bytes)
    is prepared whole, train holding all of it (``prepare_data``; for split ``all`` only, the other splits empty).
    Commands on an existing run use ``run_data``.
    """
    from normlab.data import prepare_data

    d = cfg.data
    data = prepare_data(source or d.source, tokenizer or d.tokenizer, cache_dir=d.cache_dir,
                        val_fraction=d.val_fraction, test_fraction=d.test_fraction, check=check, whole_ok=whole_ok)
    need = cfg.model.context + 1
    for split in need_window:
        n = len(getattr(data, split))
        if n < need:
            raise NormlabError(
                f"corpus '{source or d.source}' is too short: its {split} split has {n} tokens, "
                f"one context window needs {need}"
            )
    return data


# -------------------------------------------------------------------------------------------- opening a trained run
@dataclass
class LoadedModel:
    cfg: RunConfig
    model: GPT
    weights: Path


def load_run(run_dir: str | Path, *, final_only: bool = False) -> LoadedModel:
    """Build the model of a run (``build_model``: every model normlab writes, the compressed CRMSNorm one
    included) and load its final weights, or, if training stopped early, its last checkpoint; eval mode.
    ``final_only``: a run without ``model.safetensors`` is an error (conversion and surgery start from final
    weights only)."""
    import torch

    from normlab.model import build_model
    from normlab.rundir.tensors import list_checkpoints, load_model_state

    run_dir = Path(run_dir)
    cfg = open_config(run_dir)
    weights = run_dir / MODEL_FILE
    if not weights.is_file() and final_only:
        raise NormlabError(f"{run_dir} has no model.safetensors")
    if not weights.is_file():
        ckpts = list_checkpoints(run_dir)
        if not ckpts:
            raise NormlabError(f"{run_dir} has no model.safetensors and no checkpoint")
        weights = ckpts[-1] / MODEL_FILE
    torch.manual_seed(cfg.seed)
    model = build_model(cfg.model)
    load_model_state(model, weights)
    model.eval()
    return LoadedModel(cfg, model, weights)


@dataclass
class EvalSetup:
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
        """Output-file suffix for results on another corpus (``data_suffix``)."""
        return data_suffix(self.source, self.data)

    @property
    def data_record(self) -> dict[str, Any]:
        """``{"data": {...}}`` for a result on another corpus, else ``{}`` (``data_record``)."""
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


def apply_eval_overrides(run: LoadedModel, overrides: list[str]) -> None:
    """Apply ``model.KEY=VALUE`` strings for evaluation-time keys to a loaded run (config and model, in place).

    Any other key is a one-line error: it defines the trained model (its weights were trained with it).
    """
    if not overrides:
        return
    from normlab.attention import eval_time_keys, set_eval_options
    from normlab.config import derive_config

    allowed = [f"model.{k}" for k in eval_time_keys()]
    for item in overrides:
        key = item.split("=", 1)[0].strip()
        if key not in allowed:
            raise NormlabError(f"--set {key}: only evaluation-time keys can change after training "
                               f"({', '.join(allowed)}); every other key defines the trained model")
    run.cfg = derive_config(run.cfg, overrides=overrides)
    set_eval_options(run.model, run.cfg.model)


def open_run(run_dir: str | Path, *, overrides: Sequence[str] = (), source: str | None = None, split: str = "val",
             context: int | None = None, batch: int | None = None, what: str = "eval",
             need_window: Sequence[str] = ("train", "val")) -> EvalSetup:
    """The one preamble of the evaluation commands (eval, diagnose, calibrate, extrapolate): load the run in
    ``run_dir``, apply ``overrides`` (``--set``; evaluation-time keys only), check the context it will run at
    (``context``, default the training context: ``check_context``), check that ``batch`` sequences of it fit in
    memory (``normlab.validate.check_eval_memory``, labelled ``what``), load its data (``source``, ``--data``:
    another corpus) and pick ``split`` (``val``, ``test`` or ``all``; every command picks it the same way,
    ``PreparedData.split``; for ``all``, a file too short to split, of 2 tokens or more, is scored whole);
    ``need_window``: the splits that must hold one context window (``load_data``)."""
    run_dir = Path(run_dir)
    run = load_run(run_dir)
    overrides = list(overrides)
    apply_eval_overrides(run, overrides)
    mc = run.cfg.model
    ctx = context if context is not None else mc.context
    check_context(mc, ctx)
    if batch is not None:
        check_eval_memory(mc, batch, ctx, what)
    data = run_data(run_dir, run.cfg, source=source, need_window=need_window, whole_ok=split == "all")
    return EvalSetup(run_dir, run.cfg, run.model, run.weights, overrides, ctx, data, source, split, data.split(split))
