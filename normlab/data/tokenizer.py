"""Tokenizers: raw bytes (vocab 256) and byte-level BPE (Hugging Face ``tokenizers``), both lossless on any bytes.

Byte-level BPE (Radford et al. 2019, GPT-2): every byte is first mapped to one printable unicode character
(``bytes_to_unicode``), so every vocabulary entry is a string of such characters and stands for exactly
``len(entry)`` raw bytes; ``token_bytes()[id]`` is that length, which makes bits-per-byte exact.

The ``tokenizers`` library only accepts ``str``, so input bytes are decoded as UTF-8 with ``surrogateescape``:
valid UTF-8 runs go through the BPE model, and each byte of an invalid run is emitted as its single-byte base
token. ``decode_bytes`` maps ids back to bytes through the vocabulary, never through UTF-8, so
``decode_bytes(encode(b)) == b`` for every ``b``; ``decode`` gives that as text (``str``, UTF-8 with invalid
sequences replaced), and ``encode`` takes ``str`` or ``bytes`` and returns a list of ints (the Hugging Face
names, ``Tokenizer``).
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import sys
import tempfile
from collections.abc import Iterable, Iterator
from functools import lru_cache
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

from normlab.errors import NormlabError
from normlab.io import loads_json, read_bytes

TOKENIZER_KINDS = ("bytes", "bpe:N")
DOC_SUFFIX = "+doc"  # ``bytes+doc``, ``bpe:N+doc``, ``PATH+doc``: the tokenizer plus a document-separator token
MAX_VOCAB = 65536  # token ids are stored as uint16
MAX_TOKENIZER_BYTES = 64 << 20  # a tokenizer.json read (released ones: a few MiB to tens of MiB)
_PIECE = 1 << 20  # large documents are encoded in pieces of about 1 MiB (cut after a newline where possible)
_BATCH_CHARS = 4 << 20  # characters handed to the Rust encoder per call (bounds memory)
_INVALID = re.compile("[\udc80-\udcff]+")


@lru_cache(maxsize=1)
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from the 256 byte values to printable unicode characters."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs, strict=True)}


def _as_bytes(text: str | bytes | bytearray | memoryview) -> bytes:
    """``str`` as UTF-8 (lone surrogates from undecodable argv bytes come back as those bytes), bytes as is."""
    if isinstance(text, str):
        return text.encode("utf-8", "surrogateescape")
    if isinstance(text, (bytes, bytearray, memoryview)):
        return bytes(text)
    raise NormlabError(f"a tokenizer encodes str (UTF-8) or bytes, got {type(text).__name__}")


class Tokenizer:
    """Interface shared by the byte and BPE tokenizers, with the names a Hugging Face tokenizer has.

    - ``encode(text) -> list[int]``: ``text`` is ``str`` (encoded as UTF-8) or ``bytes``;
      ``encode(text, return_array=True)`` gives a uint16 ``np.ndarray [N]`` instead (what the data layer stores);
    - ``decode(ids) -> str``: UTF-8 with invalid sequences replaced by U+FFFD, as ``tokenizers`` does;
      ``decode_bytes(ids) -> bytes`` is lossless (``decode_bytes(encode(b)) == b`` for every ``b``);
    - ``batch_decode(list_of_ids) -> list[str]``, ``tok(text) -> {"input_ids": [...]}``, ``len(tok)`` and
      ``vocab_size`` (the number of ids), ``token_bytes() -> int64 [vocab_size]`` raw bytes per id.
    """

    name: str
    vocab_size: int
    doc_token: int | None = None  # the document-separator id (``DocTokenizer``), else None

    def encode(self, text: str | bytes, *, return_array: bool = False) -> list[int] | np.ndarray:
        """Token ids of ``text`` (no special tokens: a ``+doc`` tokenizer adds no separator for one string)."""
        ids = self.encode_docs([_as_bytes(text)])
        return ids if return_array else ids.tolist()

    def decode(self, ids) -> str:
        """The text of ``ids``: their bytes decoded as UTF-8, invalid sequences replaced (U+FFFD)."""
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def batch_decode(self, sequences) -> list[str]:
        """``[decode(ids) for ids in sequences]``."""
        return [self.decode(ids) for ids in sequences]

    def __call__(self, text: str | bytes) -> dict[str, list[int]]:
        """``{"input_ids": encode(text)}``, as a Hugging Face tokenizer's call returns for one string."""
        return {"input_ids": self.encode(text)}

    def __len__(self) -> int:
        return self.vocab_size

    def encode_prompt(self, text: str | bytes) -> list[int]:
        """The ids a model is prompted with for ``text``, the start of a document: ``encode(text)``, after the
        document token when the tokenizer has one (as every training document starts; ``DocTokenizer``)."""
        ids = self.encode(text)
        return ids if self.doc_token is None else [self.doc_token, *ids]

    def encode_docs(self, docs: Iterable[bytes]) -> np.ndarray:  # concatenated ids of all docs
        raise NotImplementedError

    def decode_bytes(self, ids) -> bytes:
        """The raw bytes ``ids`` stand for (lossless)."""
        raise NotImplementedError

    def token_bytes(self) -> np.ndarray:
        raise NotImplementedError

    def _check_ids(self, ids) -> np.ndarray:
        arr = np.asarray(ids).reshape(-1)
        if arr.size and (not np.issubdtype(arr.dtype, np.integer) or arr.min() < 0 or arr.max() >= self.vocab_size):
            raise NormlabError(f"token ids must be integers in [0, {self.vocab_size}) for tokenizer '{self.name}'")
        return arr.astype(np.int64)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, vocab_size={self.vocab_size})"


class BytesTokenizer(Tokenizer):
    """One token per byte: id = byte value, vocab 256, no special tokens."""

    name = "bytes"
    vocab_size = 256

    def encode_docs(self, docs: Iterable[bytes]) -> np.ndarray:
        return np.frombuffer(b"".join(docs), dtype=np.uint8).astype(np.uint16)

    def decode_bytes(self, ids) -> bytes:
        return self._check_ids(ids).astype(np.uint8).tobytes()

    def token_bytes(self) -> np.ndarray:
        return np.ones(256, dtype=np.int64)


def _pieces(data: bytes) -> Iterator[bytes]:
    """Cut ``data`` into pieces of at most ~1 MiB, after the last newline in a window, else on a UTF-8 boundary."""
    start, n = 0, len(data)
    while n - start > _PIECE:
        end = start + _PIECE
        cut = data.rfind(b"\n", start, end) + 1
        if cut <= start:
            cut = end
            while cut > start + 1 and (data[cut] & 0xC0) == 0x80 and end - cut < 3:
                cut -= 1
        yield data[start:cut]
        start = cut
    if start < n:
        yield data[start:]


def _segments(data: bytes) -> Iterator[str | bytes]:
    """Valid UTF-8 runs as ``str`` and invalid runs as ``bytes``, in order."""
    for piece in _pieces(data):
        text = piece.decode("utf-8", "surrogateescape")
        pos = 0
        for m in _INVALID.finditer(text):
            if m.start() > pos:
                yield text[pos:m.start()]
            yield bytes(ord(ch) - 0xDC00 for ch in m.group())
            pos = m.end()
        if pos < len(text):
            yield text[pos:]


def _new_bpe():
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    return tok


@contextlib.contextmanager
def rust_boundary(what: str) -> Iterator[None]:
    """Around a call into the tokenizers library (Rust): a panic there -- pyo3's ``PanicException``, which derives
    from ``BaseException`` and so passes every ``except Exception`` -- becomes a one-line NormlabError naming
    ``what``; the lines Rust's panic hook writes to stderr are held back meanwhile (stderr's descriptor points at a
    temporary file for the call; what a call that did not panic wrote is passed on)."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        panicked = False
        try:
            yield
        except (KeyboardInterrupt, SystemExit, GeneratorExit):
            raise
        except Exception:
            raise
        except BaseException as e:  # pyo3_runtime.PanicException
            panicked = True
            why = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise NormlabError(f"{what}: the tokenizers library failed on it (a Rust panic: {why[:160]}); it is not a "
                               "valid tokenizers file") from None
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            if not panicked:
                held.seek(0)
                os.write(2, held.read())


class BPETokenizer(Tokenizer):
    """Byte-level BPE over a Hugging Face ``tokenizers.Tokenizer`` (no normalizer, no special tokens)."""

    def __init__(self, hf_tokenizer, name: str | None = None):
        self._tok = hf_tokenizer
        vocab = hf_tokenizer.get_vocab(with_added_tokens=True)
        self.vocab_size = len(vocab)
        if sorted(vocab.values()) != list(range(self.vocab_size)):
            raise NormlabError("BPE vocabulary ids are not contiguous from 0")
        if self.vocab_size > MAX_VOCAB:
            raise NormlabError(f"BPE vocabulary has {self.vocab_size} tokens; allowed: at most {MAX_VOCAB}")
        u2b = {c: b for b, c in bytes_to_unicode().items()}
        table: list[bytes] = [b""] * self.vocab_size
        for tok, i in vocab.items():
            if not tok or any(ch not in u2b for ch in tok):
                raise NormlabError(f"BPE token {tok!r} is not made of byte-level characters; not a byte-level BPE")
            table[i] = bytes(u2b[ch] for ch in tok)
        self._table = table
        try:
            self._byte_id = np.array([vocab[bytes_to_unicode()[b]] for b in range(256)], dtype=np.int64)
        except KeyError:
            raise NormlabError("BPE vocabulary lacks some of the 256 single-byte tokens") from None
        self._token_bytes = np.array([len(t) for t in table], dtype=np.int64)
        self.name = name or f"bpe:{self.vocab_size}"

    @classmethod
    def train(cls, docs: Iterable[bytes], vocab_size: int, name: str | None = None) -> BPETokenizer:
        """Train on ``docs`` (the train split): 256 byte tokens plus up to ``vocab_size - 256`` merges."""
        tok = _new_bpe()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                      special_tokens=[], initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        texts = (s for d in docs for s in _segments(d) if isinstance(s, str))
        tok.train_from_iterator(texts, trainer=trainer)
        return cls(tok, name=name or f"bpe:{vocab_size}")

    @classmethod
    def from_file(cls, path: str | Path, name: str | None = None) -> BPETokenizer:
        """Load a saved byte-level BPE ``tokenizer.json``, refusing anything that would not be lossless."""
        path = Path(path)
        try:
            st = path.stat()
        except OSError:
            st = None  # the read below names the error
        if st is not None and not stat.S_ISREG(st.st_mode):  # a FIFO or device would block or never end
            raise NormlabError(f"tokenizer file '{path}' is not a regular file (a FIFO, device or directory)")
        if st is not None and st.st_size > MAX_TOKENIZER_BYTES:
            raise NormlabError(f"tokenizer file '{path}' is {st.st_size} bytes, more than {MAX_TOKENIZER_BYTES >> 20} "
                               "MiB; refusing to read it")
        label = f"tokenizer file '{path}'"
        spec = loads_json(read_bytes(path, "tokenizer file", MAX_TOKENIZER_BYTES), label)  # bounded digits, depth
        try:
            with rust_boundary(label):
                hf = HFTokenizer.from_file(str(path))
        except NormlabError:
            raise
        except Exception as e:  # OSError, and the plain Exception tokenizers raises
            why = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise NormlabError(f"cannot read tokenizer file '{path}': {why}") from None
        if not isinstance(spec, dict):
            raise NormlabError(f"{label} holds {type(spec).__name__}, not a tokenizers file (a JSON object)")
        pre = spec.get("pre_tokenizer") or {}
        pres = pre.get("pretokenizers", [pre]) if pre.get("type") == "Sequence" else [pre]
        byte_level = [p for p in pres if p.get("type") == "ByteLevel"]
        problems = []
        if (spec.get("model") or {}).get("type") != "BPE":
            problems.append("model is not BPE")
        if (spec.get("model") or {}).get("dropout") not in (None, 0, 0.0):
            problems.append("BPE dropout is set")
        if not byte_level or any(p.get("add_prefix_space") for p in byte_level):
            problems.append("pre-tokenizer is not ByteLevel(add_prefix_space=False)")
        if spec.get("normalizer") is not None:
            problems.append("it has a normalizer")
        if spec.get("added_tokens"):
            problems.append("it has added/special tokens")
        if problems:
            raise NormlabError(f"tokenizer file '{path}' is not a lossless byte-level BPE: {'; '.join(problems)}")
        return cls(hf, name=name)

    def save(self, path: str | Path) -> None:
        self._tok.save(str(path))

    def encode_docs(self, docs: Iterable[bytes]) -> np.ndarray:
        out: list[np.ndarray] = []
        batch: list[str] = []
        slots: list[int] = []  # index in `out` of each pending batch item
        chars = 0

        def flush() -> None:
            nonlocal chars
            for slot, enc in zip(slots, self._tok.encode_batch_fast(batch, add_special_tokens=False), strict=True):
                out[slot] = np.asarray(enc.ids, dtype=np.uint16)
            batch.clear()
            slots.clear()
            chars = 0

        for d in docs:
            for seg in _segments(d):
                if isinstance(seg, bytes):
                    out.append(self._byte_id[np.frombuffer(seg, dtype=np.uint8)].astype(np.uint16))
                else:
                    out.append(np.empty(0, dtype=np.uint16))
                    slots.append(len(out) - 1)
                    batch.append(seg)
                    chars += len(seg)
                    if chars >= _BATCH_CHARS:
                        flush()
        if batch:
            flush()
        return np.concatenate(out) if out else np.empty(0, dtype=np.uint16)

    def decode_bytes(self, ids) -> bytes:
        table = self._table
        return b"".join([table[i] for i in self._check_ids(ids).tolist()])

    def token_bytes(self) -> np.ndarray:
        return self._token_bytes.copy()


class DocTokenizer(Tokenizer):
    """``base`` plus one document-separator token, id ``base.vocab_size`` (vocab ``base.vocab_size + 1``).

    ``encode_docs(docs)`` puts the separator before every document (``[sep] d0 [sep] d1 ...``), so a split's
    token stream shows the model where each document starts, as GPT-2's ``<|endoftext|>`` does (Radford et al.
    2019); ``encode(b)`` of one string adds none. The separator stands for 0 bytes (``token_bytes()[sep] == 0``,
    ``decode`` drops it), so bits/byte still divide by the documents' own bytes; in stream evaluation its
    prediction is scored like any target, in ``eval --documents`` it is the document-start token every document
    is conditioned on (lm-evaluation-harness ``loglikelihood_rolling``).
    """

    def __init__(self, base: Tokenizer):
        if base.doc_token is not None:
            raise NormlabError(f"tokenizer '{base.name}' already has a document token")
        if base.vocab_size + 1 > MAX_VOCAB:
            raise NormlabError(f"tokenizer '{base.name}{DOC_SUFFIX}' would have {base.vocab_size + 1} tokens; "
                               f"allowed: at most {MAX_VOCAB} (ids are stored as uint16)")
        self.base = base
        self.doc_token = base.vocab_size
        self.vocab_size = base.vocab_size + 1
        self.name = base.name + DOC_SUFFIX

    def encode_docs(self, docs: Iterable[bytes]) -> np.ndarray:
        sep = np.array([self.doc_token], dtype=np.uint16)
        parts: list[np.ndarray] = []
        for d in docs:
            parts += [sep, self.base.encode(d, return_array=True)]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint16)

    def encode(self, text: str | bytes, *, return_array: bool = False) -> list[int] | np.ndarray:
        return self.base.encode(text, return_array=return_array)  # one string: no separator

    def decode_bytes(self, ids) -> bytes:
        arr = self._check_ids(ids)
        return self.base.decode_bytes(arr[arr != self.doc_token])

    def token_bytes(self) -> np.ndarray:
        return np.append(self.base.token_bytes(), 0).astype(np.int64)

    def save(self, path: str | Path) -> None:
        self.base.save(
            path
        )  # BPE only (bytes has no file); the separator is implied by the spec's DOC_SUFFIX, not stored in the file


def split_doc_suffix(spec):
    """``(base spec, has_doc_token)``: ``"bpe:512+doc"`` -> ``("bpe:512", True)``; anything else unchanged."""
    if isinstance(spec, str) and spec.endswith(DOC_SUFFIX) and len(spec) > len(DOC_SUFFIX):
        return spec[: -len(DOC_SUFFIX)], True
    return spec, False


def with_doc_token(tok: Tokenizer, doc: bool) -> Tokenizer:
    """``DocTokenizer(tok)`` when ``doc``, else ``tok``."""
    return DocTokenizer(tok) if doc else tok


def parse_tokenizer_spec(spec) -> tuple[str, int | None]:
    """``"bytes"`` -> ``("bytes", None)``; ``"bpe:N"`` -> ``("bpe:N", N)`` with 256 <= N <= 65536. A ``+doc``
    suffix (document-separator token, ``DocTokenizer``) is kept on the spec: ``"bpe:512+doc"`` -> ``("bpe:512+doc",
    512)``."""
    base, doc = split_doc_suffix(spec)
    if doc:
        name, n = parse_tokenizer_spec(base)
        if n is not None and n + 1 > MAX_VOCAB:
            raise NormlabError(f"tokenizer '{spec}': bpe:N{DOC_SUFFIX} needs N <= {MAX_VOCAB - 1} (one id for the "
                               "document token)")
        return name + DOC_SUFFIX, n
    if isinstance(spec, str) and spec == "bytes":
        return "bytes", None
    if isinstance(spec, str) and spec.startswith("bpe:"):
        try:
            n = int(spec[4:])
        except ValueError:
            n = None
        if n is None or not 256 <= n <= MAX_VOCAB:
            raise NormlabError(f"tokenizer '{spec}': N in bpe:N must be an integer in [256, {MAX_VOCAB}]")
        return f"bpe:{n}", n
    if isinstance(spec, str) and ("/" in spec or spec.endswith(".json")):
        raise NormlabError(f"tokenizer file '{spec}' does not exist (a tokenizer is bytes, bpe:N or the path of a "
                           "tokenizer.json)")
    raise NormlabError(
        f"unknown tokenizer {spec!r}; allowed: bytes, bpe:N (256 <= N <= {MAX_VOCAB}), or a tokenizer.json path, "
        f"each optionally with '{DOC_SUFFIX}' (a document-separator token)"
    )


def load_tokenizer(path_or_name) -> Tokenizer:
    """``"bytes"``, a byte-level BPE ``tokenizer.json`` path, or a cache entry directory holding one; each with an
    optional ``+doc`` suffix (``DocTokenizer``)."""
    base, doc = split_doc_suffix(path_or_name)
    if doc:
        return DocTokenizer(load_tokenizer(base))
    if isinstance(path_or_name, str) and path_or_name == "bytes":
        return BytesTokenizer()
    if isinstance(path_or_name, (str, Path)):
        p = Path(path_or_name).expanduser()
        if p.is_dir():
            if not (p / "tokenizer.json").exists():
                raise NormlabError(f"tokenizer directory '{path_or_name}' has no tokenizer.json")
            p = p / "tokenizer.json"
        if p.is_file():
            return BPETokenizer.from_file(p)
        if p.exists():  # /dev/zero, a fifo, a socket: never read (it could block or never end)
            raise NormlabError(f"tokenizer file '{p}' is not a regular file (a device, fifo or socket); give a "
                               "tokenizer.json file")
        if isinstance(path_or_name, str) and path_or_name.startswith("bpe:"):
            raise NormlabError(
                f"tokenizer '{path_or_name}' must be trained on a corpus: use prepare_data(source, "
                f"'{path_or_name}') or pass the path of its saved tokenizer.json"
            )
        if isinstance(path_or_name, Path) or "/" in path_or_name or path_or_name.endswith(".json"):
            raise NormlabError(f"tokenizer file '{path_or_name}' does not exist")
    raise NormlabError(f"unknown tokenizer {path_or_name!r}; allowed: bytes or a tokenizer.json path")
