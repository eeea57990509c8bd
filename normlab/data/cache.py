"""Deterministic train/val/test splits and the on-disk token cache.

Splits (exact rules in docs/data.md):
- one document: contiguous byte ranges, ``[train | val | test]`` with val and test at the end;
- several documents (>= 3): each document goes by a hash of its content, ``u = sha256(doc)[:8] / 2**64``:
  ``u < test_fraction`` -> test, ``u < test_fraction + val_fraction`` -> val, else train; an empty split then
  takes the last document of the split holding the most documents. Two documents: handled as one (joined).
- a corpus too short to split (fewer than 3 documents and fewer than 3 bytes), prepared for scoring the whole of it
  (``prepare_data(whole_ok=True)``, ``eval --split all``): train holds all of it, val and test are empty; its cache
  entry is keyed apart, and training data preparation still refuses it (``split_docs``).
Documents of a split are concatenated with nothing in between, so a split's tokens stand for exactly its
documents' bytes.

Cache entry ``<cache_dir>/<kind>-<tokenizer>-<key>/``: ``train.bin``, ``val.bin``, ``test.bin`` (raw uint16),
``meta.json`` and, for BPE, ``tokenizer.json``. Built in a temporary directory and renamed into place.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np

from normlab.data.progress import mb, stage
from normlab.data.sources import Corpus, load_corpus
from normlab.data.tokenizer import (
    DOC_SUFFIX,
    BPETokenizer,
    BytesTokenizer,
    Tokenizer,
    load_tokenizer,
    parse_tokenizer_spec,
    split_doc_suffix,
    with_doc_token,
)
from normlab.data.unigram import unigram_bpb
from normlab.errors import NormlabError
from normlab.io import make_temp_dir, read_json

CACHE_VERSION = 1
SPLITS = ("train", "val", "test")
_EMPTY = np.zeros(0, dtype=np.uint16)
_EMPTY.setflags(write=False)
_WS = re.compile(r"\s+")


@dataclass
class PreparedData:
    """Tokenized splits of one corpus, ready for training and evaluation.

    ``train``/``val``/``test``: 1-D read-only ``np.memmap`` of uint16 token ids. ``token_bytes [vocab_size]``:
    raw bytes per id, so ``token_bytes[ids].sum() == split_bytes[split]``. ``split_words``: lm-eval-harness
    word counts. ``entropy_floor_bpb``: exact entropy rate of a synthetic source, else None. ``unigram_bpb``: the
    train split's unigram entropy per byte (the "did not learn" floor), computed on first use.
    """

    train: np.ndarray
    val: np.ndarray
    test: np.ndarray
    tokenizer: Tokenizer
    vocab_size: int
    token_bytes: np.ndarray
    split_bytes: dict[str, int]
    split_words: dict[str, int]
    entropy_floor_bpb: float | None
    meta: dict = field(default_factory=dict)

    @cached_property
    def unigram_bpb(self) -> float | None:
        """Unigram entropy of the train split in bits per byte (normlab.data.unigram), computed exactly."""
        return unigram_bpb(self.train, self.split_bytes.get("train", 0), self.vocab_size)

    def split(self, name: str) -> np.ndarray:
        """The token ids ``[N]`` of split ``name``; ``"all"`` is train, val and test joined in that order (for a
        one-document corpus: the whole file in order; every byte of the corpus exactly once)."""
        if name == "all":
            return np.concatenate([self.train, self.val, self.test])
        if name not in SPLITS:
            raise NormlabError(f"unknown split '{name}'; allowed: {', '.join(SPLITS)}, all")
        return getattr(self, name)

    def bytes_of(self, name: str) -> int:
        """The raw bytes split ``name`` (or ``"all"``) stands for."""
        return sum(self.split_bytes[s] for s in SPLITS) if name == "all" else int(self.split_bytes[name])


def default_cache_dir() -> Path:
    """``$NORMLAB_CACHE_DIR`` if set, else ``~/.cache/normlab``."""
    env = os.environ.get("NORMLAB_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "normlab"


def _check_fractions(val_fraction, test_fraction) -> None:
    for name, f in (("val_fraction", val_fraction), ("test_fraction", test_fraction)):
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0 < f < 1:
            raise NormlabError(f"{name} must be a number in (0, 1); got {f!r}")
    if val_fraction + test_fraction >= 1:
        raise NormlabError(
            f"val_fraction + test_fraction must be < 1; got {val_fraction} + {test_fraction}"
        )


def doc_unit(doc: bytes) -> float:
    """A document's stable position in [0, 1): the first 8 bytes of sha256(doc) over 2**64."""
    return int.from_bytes(hashlib.sha256(doc).digest()[:8], "big") / 2**64


def can_split(docs: list[bytes]) -> bool:
    """Whether ``split_docs`` can give each of train/val/test a byte: 3 documents or more, or 3 bytes or more."""
    return len(docs) >= 3 or sum(len(d) for d in docs) >= 3


def split_docs(docs: list[bytes], val_fraction: float, test_fraction: float) -> dict[str, list[bytes]]:
    """Split documents into train/val/test (see the module docstring). Every split is non-empty."""
    _check_fractions(val_fraction, test_fraction)
    if len(docs) < 3:
        data = b"".join(docs)
        n = len(data)
        if n < 3:
            raise NormlabError(f"corpus has {n} bytes; at least 3 are needed for train/val/test splits")
        n_test = max(1, round(n * test_fraction))
        n_val = max(1, round(n * val_fraction))
        if n - n_val - n_test < 1:
            n_val, n_test = 1, 1
        a, b = n - n_val - n_test, n - n_test
        return {"train": [data[:a]], "val": [data[a:b]], "test": [data[b:]]}
    idx: dict[str, list[int]] = {s: [] for s in SPLITS}
    for i, d in enumerate(docs):
        u = doc_unit(d)
        idx["test" if u < test_fraction else "val" if u < test_fraction + val_fraction else "train"].append(i)
    for s in ("test", "val", "train"):
        if not idx[s]:
            donor = max(SPLITS, key=lambda k: (len(idx[k]), -SPLITS.index(k)))
            idx[s].append(idx[donor].pop())  # the donor's last document in corpus order
            idx[s].sort()
    return {s: [docs[i] for i in idx[s]] for s in SPLITS}


def count_words(docs: list[bytes]) -> int:
    """lm-eval-harness words: ``len(re.split(r"\\s+", text))`` summed over documents (UTF-8, errors replaced)."""
    return sum(sum(1 for _ in _WS.finditer(d.decode("utf-8", "replace"))) + 1 for d in docs)


def _entry_name(corpus: Corpus, tok_spec: str, key: str) -> str:
    kind = re.sub(r"[^A-Za-z0-9]+", "", str(corpus.meta.get("kind", "corpus")))
    tok = tok_spec.split(":")[0] if tok_spec.startswith("bpe-file:") else tok_spec
    return f"{kind}-{re.sub(r'[^A-Za-z0-9]+', '', tok)}-{key[:16]}"


def cache_key(content_hash: str, tok_spec: str, val_fraction: float, test_fraction: float,
              whole: bool = False) -> str:
    """sha256 of the entry's identity; ``whole`` (an unsplit corpus, every byte in train) keys it apart."""
    spec = {"version": CACHE_VERSION, "content_hash": content_hash, "tokenizer": tok_spec,
            "val_fraction": float(val_fraction), "test_fraction": float(test_fraction)}
    blob = json.dumps({**spec, "whole": True} if whole else spec, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def _valid_entry(entry: Path, key: str) -> dict | None:
    """The entry's meta if it is complete and consistent, else None."""
    try:
        meta = read_json(entry / "meta.json", "token cache meta")  # bounded: size, depth, digits
        if not isinstance(meta, dict) or meta.get("cache_key") != key or meta.get("cache_version") != CACHE_VERSION:
            return None
        for s in SPLITS:
            if (entry / f"{s}.bin").stat().st_size != 2 * int(meta["split_tokens"][s]):
                return None
        if split_doc_suffix(meta["tokenizer_spec"])[0] != "bytes" and not (entry / "tokenizer.json").is_file():
            return None
        return meta
    except (OSError, ValueError, KeyError, TypeError, NormlabError):  # damaged: rebuilt
        return None


def _try_open(entry: Path, key: str) -> PreparedData | None:
    """Open a complete, consistent entry; None if it is missing or damaged (then it gets rebuilt)."""
    meta = _valid_entry(entry, key)
    if meta is None:
        return None
    try:
        return _open_entry(entry, meta)
    except (NormlabError, OSError, ValueError, KeyError, TypeError):
        return None


def _open_entry(entry: Path, meta: dict) -> PreparedData:
    base_spec, doc = split_doc_suffix(meta["tokenizer_spec"])
    if base_spec == "bytes":
        tok: Tokenizer = BytesTokenizer()
    else:
        tok = BPETokenizer.from_file(entry / "tokenizer.json", name=split_doc_suffix(meta["tokenizer"])[0])
    tok = with_doc_token(tok, doc)
    if tok.vocab_size != meta["vocab_size"]:
        raise NormlabError(f"cache entry '{entry}' is inconsistent (vocab size); delete it and retry")
    arrays = {s: np.memmap(entry / f"{s}.bin", dtype=np.uint16, mode="r") if meta["split_tokens"][s]
              else _EMPTY for s in SPLITS}  # an empty file cannot be mapped (a whole entry's val and test)
    floor = meta["corpus"].get("entropy_rate_bpb")
    return PreparedData(
        **arrays, tokenizer=tok, vocab_size=tok.vocab_size, token_bytes=tok.token_bytes(),
        split_bytes=dict(meta["split_bytes"]), split_words=dict(meta["split_words"]),
        entropy_floor_bpb=float(floor) if floor is not None else None,
        meta={**meta["corpus"], **{k: v for k, v in meta.items() if k != "corpus"}, "cache_dir": str(entry)},
    )


def _build_entry(tmp: Path, corpus: Corpus, tok_spec: str, tok_arg: int | Tokenizer | None, key: str,
                 val_fraction: float, test_fraction: float, whole: bool = False) -> None:
    """Split, tokenize and write every file of a cache entry into ``tmp``.

    ``tok_arg``: None for bytes, an int N to train ``bpe:N`` on the train split, or a ready BPE tokenizer.
    A ``+doc`` spec wraps the first two in ``DocTokenizer`` (a ready tokenizer comes wrapped already).
    ``whole``: no split (train = the corpus joined, val and test empty), for scoring; it must hold 2 tokens.
    """
    if whole:
        splits = {"train": [b"".join(corpus.docs)], "val": [], "test": []}
    else:
        splits = split_docs(corpus.docs, val_fraction, test_fraction)
    base_spec, doc = split_doc_suffix(tok_spec)
    if tok_arg is None:
        tok: Tokenizer = with_doc_token(BytesTokenizer(), doc)
    elif isinstance(tok_arg, int):
        n_train = sum(len(d) for d in splits["train"])
        with stage(f"training BPE tokenizer (vocab {tok_arg}) on the train split of '{corpus.source}' ({mb(n_train)})"):
            tok = with_doc_token(BPETokenizer.train(splits["train"], tok_arg, name=base_spec), doc)
        tok.save(tmp / "tokenizer.json")
    else:
        tok = tok_arg
        tok.save(tmp / "tokenizer.json")
    tb = tok.token_bytes()
    meta: dict = {"cache_version": CACHE_VERSION, "cache_key": key, "tokenizer": tok.name,
                  "tokenizer_spec": tok_spec,
                  "vocab_size": tok.vocab_size, "val_fraction": val_fraction, "test_fraction": test_fraction,
                  "split_tokens": {}, "split_bytes": {}, "split_words": {}, "split_docs": {}}
    for s in SPLITS:
        nbytes = sum(len(d) for d in splits[s])
        with stage(f"tokenizing the {s} split of '{corpus.source}' with {tok_spec} ({mb(nbytes)})"):
            ids = tok.encode_docs(splits[s])
        if int(tb[ids].sum()) != nbytes:  # cheap end-to-end check of losslessness
            raise NormlabError(f"tokenizer '{tok_spec}' lost bytes on split '{s}'; this is a bug")
        ids.astype("<u2").tofile(tmp / f"{s}.bin")
        meta["split_tokens"][s] = int(ids.size)
        meta["split_bytes"][s] = nbytes
        meta["split_words"][s] = count_words(splits[s])
        meta["split_docs"][s] = len(splits[s])
        if whole and s == "train" and ids.size < 2:
            raise NormlabError(f"corpus '{corpus.source}' has {ids.size} token{'s' * (ids.size != 1)} ({nbytes} "
                               f"byte{'s' * (nbytes != 1)}); at least 2 tokens are needed to score it (one "
                               "prediction)")
    meta["entropy_floor_bpb"] = corpus.meta.get("entropy_rate_bpb")
    meta["source"] = corpus.source
    meta["corpus"] = corpus.meta
    with open(tmp / "meta.json", "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=2, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())


def _resolve_tokenizer(tokenizer) -> tuple[str, int | Tokenizer | None]:
    """``(spec, arg)``: ``("bytes", None)``, ``("bpe:N", N)``, or for a saved tokenizer.json path
    ``("bpe-file:<sha256[:16]>", BPETokenizer)`` so the cache key follows the file's content; a ``+doc`` suffix
    (document-separator token) stays on the spec (and wraps a ready tokenizer)."""
    base, doc = split_doc_suffix(str(tokenizer) if isinstance(tokenizer, Path) else tokenizer)
    if isinstance(tokenizer, Path) or (isinstance(base, str) and base != "bytes"
                                       and not base.startswith("bpe:") and Path(base).exists()):
        path = Path(base)
        tok = with_doc_token(load_tokenizer(path), doc)  # a directory, a device or a fifo: its own one line
        path = path / "tokenizer.json" if path.is_dir() else path
        digest = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
        return f"bpe-file:{digest}" + (DOC_SUFFIX if doc else ""), tok
    return parse_tokenizer_spec(tokenizer)


def prepare_data(source: str, tokenizer: str | Path = "bytes", *, cache_dir: str | Path | None = None,
                 val_fraction: float = 0.05, test_fraction: float = 0.05,
                 check: Callable[[Corpus], None] | None = None, whole_ok: bool = False) -> PreparedData:
    """Load ``source``, split it, tokenize it (training BPE on train only) and cache the token ids.

    A second call with the same corpus content, tokenizer and fractions reuses the cache entry; an entry with
    missing or unreadable files, or sizes that disagree with its ``meta.json``, is rebuilt. ``tokenizer``: ``bytes``,
    ``bpe:N`` or the path of a saved ``tokenizer.json`` (a run's own). ``check(corpus)`` runs on the loaded corpus
    before anything is tokenized (a run directory's identity check raises there). ``whole_ok``: a corpus too short
    to split (``can_split``) is prepared whole instead of refused, train holding every byte and val/test empty
    (for reading split ``all`` only: ``eval --split all``); a corpus that can be split is split as always.
    """
    tok_spec, tok_arg = _resolve_tokenizer(tokenizer)
    _check_fractions(val_fraction, test_fraction)
    with stage(f"reading corpus '{source}'"):
        corpus = load_corpus(source)
    if check is not None:
        check(corpus)
    whole = whole_ok and not can_split(corpus.docs)
    key = cache_key(corpus.meta["content_hash"], tok_spec, val_fraction, test_fraction, whole)
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise NormlabError(f"cannot create cache directory '{root}': {e.strerror}") from None
    entry = root / _entry_name(corpus, tok_spec, key)
    cached = _try_open(entry, key)
    if cached is not None:
        return cached
    tmp = make_temp_dir(".tmp-", root)  # the umask honoured, not mkdtemp's 0700 (a shared cache stays readable)
    try:
        _build_entry(tmp, corpus, tok_spec, tok_arg, key, float(val_fraction), float(test_fraction),
                     whole)
        cached = _try_open(entry, key)  # another process may have finished the same entry meanwhile
        if cached is not None:
            return cached
        if entry.exists():  # a broken entry: move it aside, then swap ours in
            trash = Path(tempfile.mkdtemp(prefix=".trash-", dir=root))
            os.replace(entry, trash / "old")
            shutil.rmtree(trash, ignore_errors=True)
        try:
            os.replace(tmp, entry)
        except OSError as e:  # lost a race to another writer: use theirs if it is good
            cached = _try_open(entry, key)
            if cached is not None:
                return cached
            raise NormlabError(f"cannot write cache entry '{entry}': {e.strerror}") from None
    except OSError as e:
        raise NormlabError(f"cannot write cache entry under '{root}': {e.strerror or e}") from None
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    meta = _valid_entry(entry, key)
    if meta is None:
        raise NormlabError(f"cache entry '{entry}' could not be written")
    return _open_entry(entry, meta)
