"""Tokenizer files ``transformers.AutoTokenizer`` loads, for normlab's two tokenizers, and the reverse.

- Byte tokenizer (id = byte value, vocab 256): written as a byte-level BPE with the 256 GPT-2 byte characters
  (``bytes_to_unicode``) at ids 0..255 and no merges, ``ByteLevel`` pre-tokenizer without the regex split and
  ``ByteLevel`` decoder, so ``encode(text) == list(text.encode('utf-8'))`` and decoding gives the bytes back.
- Byte-level BPE: its own ``tokenizer.json`` (already a ``tokenizers`` file).

Both get a ``tokenizer_config.json`` naming ``PreTrainedTokenizerFast`` and no special tokens (normlab tokenizers
have none; lm-evaluation-harness then needs ``prefix_token_id``, see docs/interop.md). A tokenizer with a
document-separator token (``+doc``, ``normlab.data.tokenizer.DocTokenizer``) gets it as the special added token
``<|doc|>`` at the same id, named as ``bos_token``.

``normlab_tokenizer(hf_dir)`` reads an HF directory's ``tokenizer.json`` back: ``"bytes"`` when it is exactly the
byte tokenizer above, else a lossless byte-level BPE (added tokens that are already in the vocabulary, such as
GPT-2's ``<|endoftext|>``, are dropped from the copy: they stay ordinary vocabulary entries), else None; with the
``+doc`` suffix when the file has the special ``<|doc|>`` at the id after the vocabulary (normlab's export of a
``+doc`` tokenizer), so such an export imports back with its document token.
"""

from __future__ import annotations

import json
from pathlib import Path

from normlab.data.tokenizer import DOC_SUFFIX, BPETokenizer, BytesTokenizer, Tokenizer, bytes_to_unicode
from normlab.errors import NormlabError
from normlab.io import write_json, write_text

HF_TOKENIZER_FILE = "tokenizer.json"  # an HF model directory's tokenizer (a run's is normlab.run.files)
DOC_TOKEN_TEXT = "<|doc|>"  # the HF spelling of a DocTokenizer's separator


def byte_tokenizer_json() -> str:
    """``tokenizer.json`` text of the byte tokenizer (ids 0..255 = bytes)."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers

    vocab = {bytes_to_unicode()[b]: b for b in range(256)}
    tok = HFTokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return tok.to_str(pretty=True)


def write_hf_tokenizer(tokenizer: Tokenizer, out: Path, context: int) -> None:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` for ``tokenizer`` into ``out``."""
    from tokenizers import AddedToken
    from tokenizers import Tokenizer as HFTokenizer

    base = getattr(tokenizer, "base", tokenizer)  # a DocTokenizer wraps bytes or BPE
    if isinstance(base, BytesTokenizer):
        text = byte_tokenizer_json()
    elif isinstance(base, BPETokenizer):
        text = base._tok.to_str(pretty=True)
    else:
        raise NormlabError(f"cannot export tokenizer {tokenizer!r} (bytes or byte-level BPE only)")
    bos = None
    if tokenizer.doc_token is not None:
        hf = HFTokenizer.from_str(text)
        hf.add_special_tokens([AddedToken(DOC_TOKEN_TEXT, special=True, normalized=False)])
        if hf.token_to_id(DOC_TOKEN_TEXT) != tokenizer.doc_token:  # the next free id is the separator's by design
            raise NormlabError(f"internal: {DOC_TOKEN_TEXT} got id {hf.token_to_id(DOC_TOKEN_TEXT)}, "
                               f"expected {tokenizer.doc_token}")
        text, bos = hf.to_str(pretty=True), DOC_TOKEN_TEXT
    write_text(out / "tokenizer.json", text)
    write_json(out / "tokenizer_config.json", {
        "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": context, "add_prefix_space": False,
        "clean_up_tokenization_spaces": False, "bos_token": bos, "eos_token": None, "pad_token": None,
        "unk_token": None,
    })


def normlab_tokenizer(hf_dir: Path, dest: Path) -> str | None:
    """Tokenizer spec for a run imported from ``hf_dir``: ``"bytes"``, or the path of a lossless byte-level BPE
    copy written to ``dest`` (``tokenizer.json``); None when ``hf_dir`` has no tokenizer normlab can use."""
    src = hf_dir / "tokenizer.json"
    if not src.is_file():
        return None
    try:
        spec = json.loads(src.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    vocab = (spec.get("model") or {}).get("vocab") or {}
    added = spec.get("added_tokens") or []
    doc = [t for t in added if t.get("content") == DOC_TOKEN_TEXT and t.get("id") == len(vocab) and t.get("special")]
    spec["added_tokens"] = [t for t in added if t.get("content") not in vocab and t not in doc]
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
