"""A run directory's own data identity, tokenizer and provenance, and how commands get a run's data.

Written by ``normlab train`` next to ``config.yaml`` (docs/concepts.md, "The run directory"):

    RUN_DIR/tokenizer.json   the BPE tokenizer the run was trained with (Hugging Face ``tokenizers`` JSON);
                             absent for the byte tokenizer, which ``data.json`` describes instead
    RUN_DIR/data.json        the corpus identity: source string, absolute path of a local corpus, content sha256
                             (``normlab.data.sources.content_hash``), size in bytes and documents, the split rule
                             and fractions with each split's tokens/bytes/documents, the data-order seed, and the
                             tokenizer (kind, vocab size, file + sha256)
    RUN_DIR/provenance.json  normlab version, git commit (when run from a checkout), Python and torch versions

Every command that needs the run's data (``eval``, ``diagnose``, ``calibrate``, ``extrapolate``, ``convert``,
``train --resume``) goes through ``run_data``: it tokenizes with the run's own ``tokenizer.json`` (never a BPE
retrained from the corpus), finds a local corpus by its recorded absolute path (so the run works from any working
directory and after being moved or copied), and refuses a corpus whose content changed since training with one
line naming what changed. ``source=`` (``--data SOURCE``) scores another corpus with the run's tokenizer.
Runs written before these files existed fall back to ``cfg.data`` as before.
"""

from __future__ import annotations

import datetime
import hashlib
import platform
from pathlib import Path
from typing import Any

from normlab.config import RunConfig
from normlab.data import BPETokenizer, BytesTokenizer, Corpus, PreparedData, Tokenizer
from normlab.data.tokenizer import DOC_SUFFIX, split_doc_suffix, with_doc_token
from normlab.errors import NormlabError
from normlab.io import atomic_path, read_json, write_json

DATA_FILE = "data.json"
TOKENIZER_FILE = "tokenizer.json"
PROVENANCE_FILE = "provenance.json"
LOCAL_KINDS = ("text", "directory", "jsonl")
BYTES_DESCRIPTION = "one token per byte: id = byte value (0-255), no special tokens; decode = the bytes themselves"


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

    from normlab.provenance import version_info

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
        **({"python_version": m["python_version"]} if m.get("kind") == "pystdlib" else {}),
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
    if not path.is_file():
        return None
    info = read_json(path, "data identity")
    if not isinstance(info, dict) or "content_hash" not in info or "tokenizer" not in info:
        raise NormlabError(f"{path} is not a normlab data identity (no content_hash/tokenizer)")
    return info


def _tokenizer_ref(run_dir: Path, info: dict[str, Any]) -> str | Path:
    """``"bytes"``, or the path of the run's own tokenizer.json after checking it is the one trained with."""
    t = info["tokenizer"]
    if t.get("kind") == "bytes":
        return "bytes"
    path = run_dir / t.get("file", TOKENIZER_FILE)
    if not path.is_file():
        raise NormlabError(f"{run_dir} lacks {path.name}, the BPE tokenizer it was trained with; restore it "
                           "from a copy of the run directory")
    if t.get("sha256") and _sha256(path) != t["sha256"]:
        raise NormlabError(f"{path} was modified since training (sha256 differs from data.json); the model's token "
                           "ids belong to the original file")
    return path


def run_tokenizer(run_dir: str | Path, cfg: RunConfig) -> Tokenizer:
    """The run's tokenizer without touching the corpus (``generate``); old runs rebuild it from ``cfg.data``."""
    run_dir = Path(run_dir)
    info = read_data_info(run_dir)
    if info is None:
        from normlab.rundir import load_data

        return load_data(cfg).tokenizer
    ref = _tokenizer_ref(run_dir, info)
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


def run_data(run_dir: str | Path, cfg: RunConfig, source: str | None = None) -> PreparedData:
    """The tokenized splits for a trained run: its own corpus (identity-checked) or ``source`` (``--data``),
    always with the run's own tokenizer; a vocabulary that does not match the model is a one-line error."""
    from normlab.rundir import load_data

    run_dir = Path(run_dir)
    info = read_data_info(run_dir)
    if info is None:  # written before run directories recorded their data
        if source is not None and cfg.data.tokenizer != "bytes":
            raise NormlabError(f"{run_dir} has no {DATA_FILE}/{TOKENIZER_FILE} (trained before run directories kept "
                               "their tokenizer); --data needs the run's own BPE tokenizer")
        data = load_data(cfg, source=source)
    else:
        tokenizer = _tokenizer_ref(run_dir, info)
        if split_doc_suffix(info["tokenizer"].get("spec") or "bytes")[1]:  # trained with a document token
            tokenizer = f"{tokenizer}{DOC_SUFFIX}"
        if source is not None:
            data = load_data(cfg, source=source, tokenizer=tokenizer)
        else:
            resolved = info.get("resolved_source")
            own = resolved if resolved and Path(resolved.partition("?")[0]).exists() else info["source"]
            if resolved and own == info["source"] and not Path(info["source"].partition("?")[0]).exists():
                raise NormlabError(f"the corpus of {run_dir} is gone: {resolved.partition('?')[0]} does not exist "
                                   f"(source '{info['source']}' at training time); score another corpus with --data "
                                   "SOURCE")
            data = load_data(cfg, source=own, tokenizer=tokenizer,
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
