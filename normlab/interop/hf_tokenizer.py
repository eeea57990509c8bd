"""Tokenizer files ``transformers.AutoTokenizer`` loads, for normlab's two tokenizers, and the reverse.

- Byte tokenizer (id = byte value, vocab 256): written as a byte-level BPE with the 256 GPT-2 byte characters
  (``bytes_to_unicode``) at ids 0..255 and no merges, ``ByteLevel`` pre-tokenizer without the regex split and
  ``ByteLevel`` decoder, so ``encode(text) == list(text.encode('utf-8'))`` and decoding gives the bytes back.
- Byte-level BPE: its own ``tokenizer.json`` (already a ``tokenizers`` file).

Both get a ``tokenizer_config.json`` naming ``PreTrainedTokenizerFast`` and an end-of-text token (``eos_token``)
at the id normlab starts a document after (``write_hf_tokenizer``): the newline byte's token, so
lm-evaluation-harness scores an export without ``prefix_token_id``. A tokenizer with a document-separator token
(``+doc``, ``normlab.data.tokenizer.DocTokenizer``) gets it as the special added token ``<|doc|>`` at the same id,
named as ``bos_token`` and ``eos_token``.

``normlab_tokenizer(hf_dir)`` reads an HF directory's ``tokenizer.json`` back: ``"bytes"`` when it is exactly the
byte tokenizer above, else a lossless byte-level BPE (added tokens that are already in the vocabulary, such as
GPT-2's ``<|endoftext|>``, are dropped from the copy: they stay ordinary vocabulary entries), else None; with the
``+doc`` suffix when the file has the special ``<|doc|>`` at the id after the vocabulary (normlab's export of a
``+doc`` tokenizer), so such an export imports back with its document token. The file is read as every JSON
file of a model directory is (``hf_files.read_model_json``: a regular file of at most
``data.tokenizer.MAX_TOKENIZER_BYTES``, strict JSON) and its shape checked (``check_tokenizer_json``) before
anything uses it: a file that is not a ``tokenizers`` file at all is a one-line refusal, a well-formed tokenizer of
another kind (WordPiece, Unigram, a lossy BPE) is None.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import AddedToken, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from normlab.data.tokenizer import (
    DOC_SUFFIX,
    MAX_TOKENIZER_BYTES,
    BPETokenizer,
    BytesTokenizer,
    Tokenizer,
    bytes_to_unicode,
)
from normlab.errors import NormlabError
from normlab.interop.hf_files import read_model_json
from normlab.io import write_json, write_text

HF_TOKENIZER_FILE = "tokenizer.json"  # an HF model directory's tokenizer (a run's is normlab.rundir.files)
DOC_TOKEN_TEXT = "<|doc|>"  # the HF spelling of a DocTokenizer's separator
_SECTIONS = ("normalizer", "pre_tokenizer", "post_processor", "decoder", "truncation", "padding")


def byte_tokenizer_json() -> str:
    """``tokenizer.json`` text of the byte tokenizer (ids 0..255 = bytes)."""
    vocab = {bytes_to_unicode()[b]: b for b in range(256)}
    tok = HFTokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return tok.to_str(pretty=True)


def doc_start_id(tokenizer: Tokenizer) -> int:
    """The token a document starts after in normlab's per-document evaluation (``eval --documents``): a ``+doc``
    tokenizer's separator, else the token of a newline byte (id 10 for bytes)."""
    doc = tokenizer.doc_token
    return int(doc) if doc is not None else tokenizer.encode(b"\n")[0]


def write_hf_tokenizer(tokenizer: Tokenizer, out: Path, context: int) -> None:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` for ``tokenizer`` into ``out``, with an end-of-text
    token (``eos_token``; also ``bos_token`` for a ``+doc`` tokenizer) at the id normlab starts documents after
    (``doc_start_id``), so lm-evaluation-harness's ``HFLM`` (whose prefix is ``bos_token_id``, else
    ``eos_token_id``) scores documents as ``normlab eval --documents`` does without ``prefix_token_id``:

    - ``+doc``: ``<|doc|>``, the separator's own id (after the vocabulary);
    - bytes or BPE: the newline byte's token itself (``Ċ``, GPT-2's byte character for ``\n``: id 10 for bytes),
      named in ``tokenizer_config.json`` (``tokenizer.json`` keeps no added tokens, so normlab loads it back as a
      lossless BPE); ``transformers`` marks it special on loading. Encoding real text with ``transformers`` is
      unchanged (a newline is the character ``\n``, not ``Ċ``); but a literal ``Ċ`` (U+010A) in the input then
      encodes to that id rather than its two UTF-8 bytes, and decoding with ``skip_special_tokens=True`` drops
      newlines. A model trained on concatenated files sees a newline before
      most documents start, which is why normlab scores a document after it."""
    base = getattr(tokenizer, "base", tokenizer)  # a DocTokenizer wraps bytes or BPE
    if isinstance(base, BytesTokenizer):
        text = byte_tokenizer_json()
    elif isinstance(base, BPETokenizer):
        text = base._tok.to_str(pretty=True)
    else:
        raise NormlabError(f"cannot export tokenizer {tokenizer!r} (bytes or byte-level BPE only)")
    hf = HFTokenizer.from_str(text)
    start = doc_start_id(tokenizer)
    if tokenizer.doc_token is not None:
        hf.add_special_tokens([AddedToken(DOC_TOKEN_TEXT, special=True, normalized=False)])
        eos, bos = DOC_TOKEN_TEXT, DOC_TOKEN_TEXT
    else:  # named in tokenizer_config.json only: tokenizer.json stays the lossless BPE normlab loads back
        eos, bos = hf.id_to_token(start), None
    if hf.token_to_id(eos) != start:  # the next free id is the separator's by design; a vocabulary token keeps its id
        raise NormlabError(f"internal: {eos} got id {hf.token_to_id(eos)}, expected {start}")
    write_text(out / "tokenizer.json", hf.to_str(pretty=True))
    write_json(out / "tokenizer_config.json", {
        "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": context, "add_prefix_space": False,
        "clean_up_tokenization_spaces": False, "bos_token": bos, "eos_token": eos, "pad_token": None,
        "unk_token": None,
    })


def _json_kind(v: object) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null",
            int: "a number", float: "a number"}.get(type(v), type(v).__name__)


def _is_id(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def check_tokenizer_json(spec: object, path: Path) -> None:
    """One-line NormlabError unless ``spec`` has the shape of a ``tokenizers`` file: an object whose ``model`` is
    an object (its ``vocab``, when present, maps token strings to ids, or lists Unigram pieces), whose
    ``added_tokens`` is a list of objects with an integer ``id`` and a string ``content``, and whose pipeline
    sections (``normalizer``, ``pre_tokenizer``, ...) are objects or null."""
    def bad(what: str) -> NormlabError:
        return NormlabError(f"{path} is not a tokenizers file: {what} (pass --tokenizer bytes or a tokenizer.json "
                            "path)")

    if not isinstance(spec, dict):
        raise bad(f"it holds {_json_kind(spec)}, not an object")
    model = spec.get("model")
    if not isinstance(model, dict):
        raise bad(f"'model' is {_json_kind(model)}, not an object")
    if not isinstance(model.get("type", ""), str):
        raise bad(f"'model.type' is {_json_kind(model['type'])}, not a string")
    vocab = model.get("vocab")
    if vocab is not None and not isinstance(vocab, list):
        if not (isinstance(vocab, dict) and all(_is_id(i) for i in vocab.values())):
            raise bad("'model.vocab' must map token strings to ids >= 0")
    added = spec.get("added_tokens")
    if added is not None:
        if not isinstance(added, list):
            raise bad(f"'added_tokens' is {_json_kind(added)}, not a list")
        for i, t in enumerate(added):
            if not (isinstance(t, dict) and _is_id(t.get("id")) and isinstance(t.get("content"), str)
                    and isinstance(t.get("special", False), bool)):
                raise bad(f"added_tokens[{i}] is not an object with an integer 'id' and a string 'content'")
    for k in _SECTIONS:
        if spec.get(k) is not None and not isinstance(spec[k], dict):
            raise bad(f"'{k}' is {_json_kind(spec[k])}, not an object or null")


def normlab_tokenizer(hf_dir: Path, dest: Path) -> str | None:
    """Tokenizer spec for a run imported from ``hf_dir``: ``"bytes"``, or the path of a lossless byte-level BPE
    copy written to ``dest`` (``tokenizer.json``); None when ``hf_dir`` has no tokenizer normlab can use; a
    one-line NormlabError when its ``tokenizer.json`` is not a ``tokenizers`` file (module docstring)."""
    src = hf_dir / HF_TOKENIZER_FILE
    if not src.exists():
        return None
    spec = read_model_json(src, MAX_TOKENIZER_BYTES, HF_TOKENIZER_FILE)
    check_tokenizer_json(spec, src)
    vocab = spec["model"].get("vocab") or {}
    added = spec.get("added_tokens") or []
    doc = [t for t in added if t["content"] == DOC_TOKEN_TEXT and t["id"] == len(vocab) and t.get("special")]
    spec["added_tokens"] = [t for t in added if t["content"] not in vocab and t not in doc]
    suffix = DOC_SUFFIX if doc else ""  # normlab's own export of a +doc tokenizer: the separator comes back
    spec["post_processor"] = None  # adds special tokens only; normlab scores raw text
    dest.parent.mkdir(parents=True, exist_ok=True)
    write_text(dest, json.dumps(spec))
    try:
        tok = BPETokenizer.from_file(dest)
    except NormlabError:
        dest.unlink(missing_ok=True)
        return None
    if tok.vocab_size == 256 and all(tok.decode_bytes([i]) == bytes([i]) for i in range(256)):
        dest.unlink(missing_ok=True)
        return "bytes" + suffix
    return str(dest.resolve()) + suffix
