"""Corpus sources: synthetic Markov, the Python standard library, local files, Hugging Face datasets.

A source string selects a corpus (full syntax in docs/data.md):

- ``synthetic:markov?order=2&alphabet=16&length=2000000&concentration=0.5&seed=0``
- ``pystdlib``
- ``english``: English prose of the Python Language Reference shipped with CPython (``pydoc_data.topics``)
- ``PATH`` (text file: one document), ``DIR[?glob=*.py]`` (each file one document), ``FILE.jsonl[?field=text]``
- ``hf:NAME[:CONFIG][?split=train&field=text]`` (needs the optional ``datasets`` library)

Every corpus is a list of non-empty byte documents in a deterministic order; empty documents are dropped.
"""

from __future__ import annotations

import hashlib
import math
import platform
import re
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path
from pydoc_data.topics import topics
from urllib.parse import parse_qsl

import numpy as np

from normlab.data import markov
from normlab.errors import NormlabError, did_you_mean, unknown
from normlab.io import loads_json

SOURCE_KINDS = ("synthetic", "pystdlib", "english", "hf")  # plus a local path
SYNTHETIC_KINDS = ("markov",)
STDLIB_EXCLUDED_DIRS = frozenset({"site-packages", "dist-packages", "test", "tests", "idlelib", "__pycache__"})
# name -> (type, default)
MARKOV_PARAMS: dict[str, tuple[type, object]] = {
    "order": (int, 2),
    "alphabet": (int, 16),
    "length": (int, 2_000_000),
    "concentration": (float, 0.5),
    "seed": (int, 0),
}
MAX_SYNTHETIC_LENGTH = 1_000_000_000


@dataclass
class Corpus:
    """A loaded corpus.

    ``docs``: documents (bytes) in a deterministic order. ``meta``: JSON-serialisable; always ``kind``,
    ``content_hash``, ``num_docs``, ``num_bytes``, plus per-kind extras.
    """

    source: str
    docs: list[bytes]
    meta: dict = field(default_factory=dict)


def content_hash(docs: list[bytes]) -> str:
    """sha256 over the documents: each as its 8-byte little-endian length followed by its bytes."""
    h = hashlib.sha256()
    for d in docs:
        h.update(len(d).to_bytes(8, "little"))
        h.update(d)
    return h.hexdigest()


def _parse_query(source: str, query: str, allowed: tuple[str, ...]) -> dict[str, str]:
    """Parse ``a=1&b=2`` into a dict; unknown or repeated names and malformed pairs raise NormlabError."""
    if not query:
        return {}
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=True)
    except ValueError:
        raise NormlabError(
            f"malformed parameters '?{query}' in source '{source}'; expected ?name=value&name=value"
        ) from None
    out: dict[str, str] = {}
    for k, v in pairs:
        if k not in allowed:
            if not allowed:
                raise NormlabError(f"source '{source}' takes no parameters; got '{k}'")
            raise NormlabError(
                f"unknown parameter '{k}' in source '{source}'{did_you_mean(k, allowed)}; "
                f"allowed: {', '.join(allowed)}"
            )
        if k in out:
            raise NormlabError(f"parameter '{k}' given twice in source '{source}'")
        out[k] = v
    return out


def _convert(source: str, name: str, value: str, typ: type) -> int | float:
    try:
        x = typ(value)
    except ValueError:
        what = "an integer" if typ is int else "a number"
        raise NormlabError(f"parameter '{name}' in source '{source}' must be {what}; got '{value}'") from None
    if typ is float and not math.isfinite(x):
        raise NormlabError(f"parameter '{name}' in source '{source}' must be finite; got '{value}'")
    return x


def _load_markov(source: str, query: str) -> Corpus:
    raw = _parse_query(source, query, tuple(MARKOV_PARAMS))
    p = {k: _convert(source, k, raw[k], t) if k in raw else d for k, (t, d) in MARKOV_PARAMS.items()}
    checks = [
        ("order", 0 <= p["order"], ">= 0"),
        ("alphabet", 2 <= p["alphabet"] <= markov.MAX_ALPHABET, f"in [2, {markov.MAX_ALPHABET}]"),
        ("length", 1 <= p["length"] <= MAX_SYNTHETIC_LENGTH, f"in [1, {MAX_SYNTHETIC_LENGTH}]"),
        ("concentration", p["concentration"] > 0, "> 0"),
        ("seed", p["seed"] >= 0, ">= 0"),
    ]
    for name, ok, rule in checks:
        if not ok:
            raise NormlabError(f"parameter '{name}' in source '{source}' must be {rule}; got {p[name]}")
    data, info = markov.generate(**p)
    meta = {"kind": "synthetic", "generator": "markov", **p, **info,
            "numpy_version": np.__version__}
    return Corpus(source, [data], meta)


def _load_synthetic(source: str, rest: str) -> Corpus:
    kind, _, query = rest.partition("?")
    if kind not in SYNTHETIC_KINDS:
        raise unknown("synthetic kind", kind, SYNTHETIC_KINDS)
    return _load_markov(source, query)


def _walk(root: Path, excluded: frozenset[str]) -> list[Path]:
    """All files under ``root`` (recursive), skipping directories named in ``excluded``, sorted by relative path."""
    out = []
    stack = [root]
    while stack:
        d = stack.pop()
        for p in d.iterdir():
            if p.is_dir() and not p.is_symlink():
                if p.name not in excluded:
                    stack.append(p)
            elif p.is_file():
                out.append(p)
    return sorted(out, key=lambda p: p.relative_to(root).as_posix())


def stdlib_files() -> tuple[Path, list[Path]]:
    """The stdlib root and its ``.py`` files (sorted by relative path), without test/site-packages dirs."""
    root = Path(sysconfig.get_paths()["stdlib"])
    if not root.is_dir():
        raise NormlabError(f"Python standard library directory '{root}' not found")
    return root, [p for p in _walk(root, STDLIB_EXCLUDED_DIRS) if p.suffix == ".py"]


def _load_pystdlib(source: str, query: str) -> Corpus:
    _parse_query(source, query, ())
    root, files = stdlib_files()
    docs = [d for d in (p.read_bytes() for p in files) if d]
    meta = {"kind": "pystdlib", "python_version": platform.python_version(), "root": str(root),
            "num_files": len(docs), "excluded_dirs": sorted(STDLIB_EXCLUDED_DIRS)}
    return Corpus(source, docs, meta)


def english_text() -> str:
    """The ``english`` corpus: the topics of ``pydoc_data.topics`` (the Python Language Reference and library
    sections CPython ships for ``help()``, PSF licence) sorted by name, each without its indented lines (code
    examples, grammar productions, tables), blank-line runs collapsed; joined by a blank line. English prose only."""
    parts = []
    for name in sorted(topics):
        lines = [ln.rstrip() for ln in topics[name].splitlines() if not ln.startswith((" ", "\t"))]
        text = re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()
        if text:
            parts.append(text)
    return "\n\n".join(parts) + "\n"


def _load_english(source: str, query: str) -> Corpus:
    _parse_query(source, query, ())

    meta = {"kind": "english", "python_version": platform.python_version(), "origin": "pydoc_data.topics",
            "num_topics": len(topics)}
    return Corpus(source, [english_text().encode("utf-8")], meta)


def _utf8(text: str, where: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise NormlabError(f"{where}: text is not valid Unicode (it contains a lone surrogate)") from None


def _load_jsonl(source: str, path: Path, fieldname: str) -> list[bytes]:
    docs = []
    with path.open("rb") as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            obj = loads_json(line, f"{path} line {i}")  # bounded: digits, depth; one line naming the line
            if not isinstance(obj, dict) or fieldname not in obj:
                keys = ", ".join(sorted(obj)) if isinstance(obj, dict) else type(obj).__name__
                raise NormlabError(
                    f"{path} line {i}: no field '{fieldname}' (has: {keys}); choose one with ?field=NAME"
                )
            text = obj[fieldname]
            if not isinstance(text, str):
                raise NormlabError(f"{path} line {i}: field '{fieldname}' must be a string; got {type(text).__name__}")
            docs.append(_utf8(text, f"{path} line {i}"))
    return docs


def _load_path(source: str, spec: str) -> Corpus:
    path_str, query = spec, ""
    if not Path(spec).exists() and "?" in spec:
        path_str, _, query = spec.rpartition("?")
    path = Path(path_str).expanduser()
    if not path.exists():
        raise NormlabError(
            f"corpus path '{path_str}' does not exist; a source is synthetic:markov?..., pystdlib, hf:NAME, "
            f"or a path to a text file, directory or .jsonl file"
        )
    if not path.is_dir() and not path.is_file():  # a fifo, device or socket would be read forever (/dev/zero)
        raise NormlabError(f"corpus path '{path_str}' is not a regular file or directory (a fifo, device or socket); "
                           "give a text file, directory or .jsonl file")
    meta: dict = {"path": str(path.resolve())}
    if path.is_dir():
        q = _parse_query(source, query, ("glob",))
        pattern = q.get("glob", "*")
        files = [p for p in sorted(path.rglob(pattern), key=lambda p: p.relative_to(path).as_posix())
                 if p.is_file() and not any(part.startswith(".") or part == "__pycache__"
                                            for part in p.relative_to(path).parts)]
        raw = [p.read_bytes() for p in files]
        binary = sum(1 for d in raw if b"\0" in d[:8192])
        docs = [d for d in raw if d and b"\0" not in d[:8192]]
        meta.update(kind="directory", glob=pattern, num_files=len(docs), skipped_binary=binary)
    elif path.suffix == ".jsonl":
        q = _parse_query(source, query, ("field",))
        fieldname = q.get("field", "text")
        docs = [d for d in _load_jsonl(source, path, fieldname) if d]
        meta.update(kind="jsonl", field=fieldname)
    else:
        _parse_query(source, query, ())
        docs = [d for d in [path.read_bytes()] if d]
        meta.update(kind="text")
    return Corpus(source, docs, meta)


def _load_hf(source: str, rest: str) -> Corpus:
    spec, _, query = rest.partition("?")
    q = _parse_query(source, query, ("split", "field"))
    name, _, config = spec.partition(":")
    if not name:
        raise NormlabError(f"source '{source}' names no dataset; expected hf:NAME[:CONFIG]")
    split, fieldname = q.get("split", "train"), q.get("field", "text")
    try:
        import datasets
    except ImportError:
        raise NormlabError(
            f"source '{source}' needs the optional 'datasets' library; install the hf extra: pip install 'normlab[hf]'"
        ) from None
    try:
        ds = datasets.load_dataset(name, config or None, split=split)
    except Exception as e:  # offline, missing dataset, bad config/split: all user-facing
        msg = (str(e).strip().splitlines() or [""])[0][:300]
        raise NormlabError(
            f"could not load Hugging Face dataset '{spec}' split '{split}': {type(e).__name__}: {msg}"
        ) from None
    if fieldname not in ds.column_names:
        raise NormlabError(
            f"Hugging Face dataset '{spec}' has no field '{fieldname}'; allowed: {', '.join(ds.column_names)}"
        )
    docs = []
    for i, text in enumerate(ds[fieldname]):
        if not isinstance(text, str):
            raise NormlabError(f"Hugging Face dataset '{spec}' row {i}: field '{fieldname}' is not a string")
        if text:
            docs.append(_utf8(text, f"Hugging Face dataset '{spec}' row {i}"))
    meta = {"kind": "hf", "name": name, "config": config or None, "split": split, "field": fieldname,
            "num_rows": len(ds)}
    return Corpus(source, docs, meta)


def load_corpus(source: str) -> Corpus:
    """Load the corpus named by ``source`` (see the module docstring and docs/data.md)."""
    if not isinstance(source, str) or not source:
        raise NormlabError(f"corpus source must be a non-empty string; got {source!r}")
    m = re.match(r"^([A-Za-z][A-Za-z0-9_]*):", source)
    base = source.partition("?")[0]
    if base == "pystdlib":
        corpus = _load_pystdlib(source, source.partition("?")[2])
    elif base == "english":
        corpus = _load_english(source, source.partition("?")[2])
    elif m and m.group(1) == "synthetic":
        corpus = _load_synthetic(source, source[m.end():])
    elif m and m.group(1) == "hf":
        corpus = _load_hf(source, source[m.end():])
    elif m and len(m.group(1)) > 1 and not Path(source).exists():
        kind = m.group(1)
        raise NormlabError(
            f"unknown source kind '{kind}'{did_you_mean(kind, SOURCE_KINDS)}; allowed: "
            "synthetic:markov?..., pystdlib, english, hf:NAME[:CONFIG], or a path to a text file, directory or "
            ".jsonl file"
        )
    else:
        corpus = _load_path(source, source)
    if not corpus.docs or not any(corpus.docs):
        raise NormlabError(f"corpus '{source}' is empty (no documents with any bytes)")
    corpus.meta = {**corpus.meta, "content_hash": content_hash(corpus.docs), "num_docs": len(corpus.docs),
                   "num_bytes": sum(len(d) for d in corpus.docs)}
    return corpus
