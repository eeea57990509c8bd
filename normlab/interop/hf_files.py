"""Reading a Hugging Face model directory without running or unpickling anything in it (``normlab import``).

A model directory is data a user hands us, so nothing in it is executed or unpickled, and nothing is taken on
trust:

- ``read_model_json(path, cap, what)``: every JSON file of a model directory (``config.json``,
  ``model.safetensors.index.json``, ``tokenizer.json``) is opened without blocking, must be a regular file (a FIFO
  or device is refused, never read) of at most its cap (``MAX_CONFIG_BYTES``, ``MAX_INDEX_BYTES``,
  ``data.tokenizer.MAX_TOKENIZER_BYTES``: a larger file, sparse or not, is refused from its size, unread) and strict
  JSON (no ``NaN`` / ``Infinity``). No other file of the directory is opened (``generation_config.json``,
  ``tokenizer_config.json``, ``special_tokens_map.json``, ``*.py`` are never read).
- ``read_hf_config(hf_dir)``: ``config.json`` read so, a ``model_type`` outside ``ARCHS`` refused before
  ``transformers`` sees the directory, an ``auto_map`` (custom code) refused, every value normlab reads checked for
  its type (``check_config_types``), every size within normlab's own ranges (``SIZE_RANGES``: ``config.RANGES``)
  and every key whose value would change what the model is (``SEMANTIC``: an encoder-decoder, cross-attention,
  pruned heads, non-causal attention, changed outputs, an attention implementation other than eager / sdpa, such
  as a hub kernel, a quantization config, a RoPE type other than default) refused, all before anything is built.
- ``hf_config_kwargs(arch, raw)``: the keyword arguments of the HF config, taken only from the keys normlab maps
  for the family (``MAPPED``, an allow-list) plus ``attn_implementation="eager"``; every other key is dropped and,
  unless it is HF bookkeeping that changes no forward (``QUIET``), named in the ``ignored`` list (a note). The config
  object is built from those with the family's own ``transformers`` config class (``CLASSES``), never through
  ``AutoConfig`` (whose ``trust_remote_code`` path prompts on stdin).
- ``weight_files(hf_dir)``: ``model.safetensors`` or the shards named by ``model.safetensors.index.json`` (an
  object whose ``weight_map`` maps tensor names to shard file names). A directory with only pickle weights
  (``pytorch_model.bin``, ``*.pt``, ``*.ckpt``) is refused with the way to convert it (safetensors' own converter);
  such files are never opened.
- ``read_header(path)``: the safetensors header parsed here (length within the file and ``MAX_HEADER_BYTES``, JSON
  object, known dtypes, offsets inside the data), so truncated, empty or hostile files are one-line refusals.
- ``expected_tensors(arch, hc)``: the tensor names and shapes the family's model class has for this config
  (built on the ``meta`` device: nothing allocated). ``check_tensors`` compares a file's tensors with it:
  missing, unexpected, mis-shaped or non-float tensors are one-line refusals naming the tensor; the only
  tolerated extras are recomputed buffers that old checkpoints carry (``IGNORED``: GPT-2 / GPT-NeoX causal masks,
  Llama's ``rotary_emb.inv_freq``), and a tied head (``tie_word_embeddings``) may be absent or equal to the
  embeddings.
- ``load_tensors_checked``: the tensors (float32), each finite.
- ``dependency_io()``: while ``transformers`` runs, nothing it prints reaches stdout and nothing reads stdin
  (``input()`` raises, ``sys.stdin`` is empty).
"""

from __future__ import annotations

import builtins
import contextlib
import io
import json
import math
import os
import re
import stat
import struct
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from normlab.config import RANGES
from normlab.errors import NormlabError
from normlab.interop.arch import ARCHS
from normlab.validate import Range

MAX_CONFIG_BYTES = 1 << 20
MAX_INDEX_BYTES = 16 << 20  # a safetensors index lists tensor names: tens of KiB for the largest released models
MAX_HEADER_BYTES = 100 << 20  # safetensors' own limit
CLASSES = {  # model_type -> (config class, causal-LM class) in transformers
    "gpt2": ("GPT2Config", "GPT2LMHeadModel"),
    "gpt_neox": ("GPTNeoXConfig", "GPTNeoXForCausalLM"),
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM"),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM"),
}
BASE_PREFIX = {"gpt2": "transformer", "gpt_neox": "gpt_neox"}  # others: "model"
RENAMES = {"gpt_neox": {"embed_out.weight": "lm_head.weight"}}  # old checkpoint names (transformers' own renames)
IGNORED = {  # buffers recomputed at construction that old checkpoints store; never weights
    "gpt2": re.compile(r"(^|\.)h\.\d+\.attn\.(bias|masked_bias)$"),
    "gpt_neox": re.compile(r"(^|\.)layers\.\d+\.attention\.(bias|masked_bias|rotary_emb\.inv_freq)$"),
}
_ROPE_BUFFER = re.compile(r"(^|\.)layers\.\d+\.self_attn\.rotary_emb\.inv_freq$")
FLOAT_DTYPES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2}
OTHER_DTYPES = {"I64": 8, "I32": 4, "I16": 2, "I8": 1, "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1,
                "F8_E4M3": 1, "F8_E5M2": 1}
PICKLE_GLOBS = ("pytorch_model*.bin", "*.pt", "*.pth", "*.ckpt", "*.pkl", "*.pickle")

# config.json keys normlab reads, by the type each must have (absent keys take the class defaults)
POS_INT = ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head", "hidden_size", "num_hidden_layers",
           "num_attention_heads", "intermediate_size", "max_position_embeddings")
OPT_POS_INT = ("n_inner", "num_key_value_heads", "head_dim", "sliding_window")
POS_FLOAT = ("layer_norm_epsilon", "layer_norm_eps", "rms_norm_eps", "rope_theta", "initializer_range",
             "query_pre_attn_scalar")
OPT_POS_FLOAT = ("final_logit_softcapping", "attn_logit_softcapping", "partial_rotary_factor", "rotary_pct")
BOOLS = ("tie_word_embeddings", "scale_attn_weights", "scale_attn_by_inverse_layer_idx", "use_parallel_residual",
         "attention_bias", "mlp_bias", "use_sliding_window")
OPT_STR = ("activation_function", "hidden_act", "hidden_activation")
OPT_DICT = ("rope_parameters", "rope_scaling")
TOKEN_IDS = ("bos_token_id", "eos_token_id")  # any integer: one outside the vocabulary is dropped, with a note
MAX_TOKEN_IDS = 1024  # entries of a bos / eos list

# sizes, bounded by normlab's own ranges before anything is built (a list such as Qwen3's layer_types is made
# from num_hidden_layers inside the config class)
SIZE_RANGES = {k: RANGES[r] for r, keys in {
    "model.vocab_size": ("vocab_size", "num_labels"),
    "model.context": ("n_positions", "max_position_embeddings", "sliding_window"),
    "model.width": ("n_embd", "hidden_size", "head_dim"),
    "model.depth": ("n_layer", "num_hidden_layers"),
    "model.heads": ("n_head", "num_attention_heads", "num_key_value_heads"),
    "model.mlp_hidden": ("n_inner", "intermediate_size"),
}.items() for k in keys}
SIZE_RANGES["max_window_layers"] = Range(0, RANGES["model.depth"].hi, integer=True)  # Qwen3: a layer index

# the allow-list: config.json keys normlab passes to the family's config class (each maps onto a ModelConfig key,
# is checked by hf_import.model_config, or is an older spelling transformers converts: rope_theta, rope_scaling,
# rotary_pct, rotary_emb_base). Everything else is dropped before transformers sees it.
_COMMON = ("vocab_size", "tie_word_embeddings", "initializer_range", "bos_token_id", "eos_token_id")
_ROPE = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "max_position_embeddings",
         "rope_parameters", "rope_scaling", "rope_theta", "attention_bias")
_RMS = _ROPE + ("rms_norm_eps", "num_key_value_heads")
MAPPED = {arch: frozenset(_COMMON + keys) for arch, keys in {
    "gpt2": ("n_positions", "n_embd", "n_layer", "n_head", "n_inner", "activation_function", "layer_norm_epsilon",
             "scale_attn_weights", "scale_attn_by_inverse_layer_idx"),
    "gpt_neox": _ROPE + ("hidden_act", "layer_norm_eps", "use_parallel_residual", "rotary_pct", "rotary_emb_base"),
    "llama": _RMS + ("head_dim", "hidden_act", "mlp_bias"),
    "qwen3": _RMS + ("head_dim", "hidden_act", "use_sliding_window", "sliding_window", "max_window_layers",
                     "layer_types"),
    "gemma2": _RMS + ("head_dim", "hidden_activation", "query_pre_attn_scalar", "sliding_window", "layer_types",
                      "final_logit_softcapping", "attn_logit_softcapping"),
    "olmo2": _RMS + ("hidden_act",),
}.items()}
ROPE_SUBKEYS = ("rope_type", "rope_theta", "partial_rotary_factor")  # of rope_parameters / rope_scaling
ATTN_IMPLEMENTATION = "eager"  # what normlab builds: transformers' own attention code, no kernel loaded

# keys dropped without a note: HF bookkeeping and training-time settings that change neither the weights nor an
# eval-mode float32 forward (dropout, caching, labels of other heads, generation defaults, dtype hints)
QUIET = frozenset((
    "model_type", "_name_or_path", "architectures", "transformers_version", "dtype", "torch_dtype", "use_cache",
    "pad_token_id", "sep_token_id", "decoder_start_token_id", "id2label", "label2id", "num_labels", "problem_type",
    "chunk_size_feed_forward", "is_decoder", "tokenizer_class", "prefix", "task_specific_params", "finetuning_task",
    "pretraining_tp", "reorder_and_upcast_attn", "n_ctx", "cache_implementation", "max_length", "min_length",
    "do_sample", "num_beams", "temperature", "top_k", "top_p", "repetition_penalty", "length_penalty",
    "no_repeat_ngram_size", "early_stopping", "num_return_sequences", "output_scores", "return_dict_in_generate",
    "return_dict", "output_hidden_states", "output_attentions", "torchscript", "is_encoder_decoder",
    "add_cross_attention", "tie_encoder_decoder", "use_bidirectional_attention", "pruned_heads",
    "attn_implementation", "_attn_implementation", "experts_implementation", "_experts_implementation",
    "_attn_implementation_autoset", "_commit_hash", "use_bfloat16", "tf_legacy_loss",
))
_QUIET_PATTERN = re.compile(r"(dropout|_pdrop|dropout_prob)$|^summary_")  # dropout rates, GPT-2's double-heads

# keys whose other values change what the model is or returns: refused, never dropped (allowed values, and what
# normlab imports instead); absent is always allowed
SEMANTIC: dict[str, tuple[tuple[Any, ...], str]] = {
    "is_encoder_decoder": ((False, None), "normlab imports decoder-only causal LMs"),
    "add_cross_attention": ((False, None), "normlab imports decoder-only causal LMs (no cross-attention)"),
    "tie_encoder_decoder": ((False, None), "normlab imports decoder-only causal LMs"),
    "use_bidirectional_attention": ((False, None), "normlab imports causal attention only"),
    "pruned_heads": (({}, None), "normlab imports unpruned models (every head of every layer)"),
    "return_dict": ((True, None), "normlab checks the model's standard output (the logits)"),
    "output_hidden_states": ((False, None), "normlab checks the model's standard output (the logits)"),
    "output_attentions": ((False, None), "normlab checks the model's standard output (the logits)"),
    "torchscript": ((False, None), "normlab checks the model's standard output (the logits)"),
    "attn_implementation": ((None, "eager", "sdpa"), "normlab builds transformers' own eager attention and loads "
                            "no attention kernel"),
    "_attn_implementation": ((None, "eager", "sdpa"), "normlab builds transformers' own eager attention and loads "
                             "no attention kernel"),
    "experts_implementation": ((None,), "normlab imports dense models and loads no kernel"),
    "_experts_implementation": ((None,), "normlab imports dense models and loads no kernel"),
    "quantization_config": ((None,), "normlab imports float weights, not a quantized checkpoint"),
}


@contextlib.contextmanager
def dependency_io() -> Iterator[None]:
    """Run a dependency with stdout captured (dropped) and no standard input: ``input()`` raises a one-line
    NormlabError and ``sys.stdin`` reads as empty, so no prompt can appear, stall or be answered."""
    def refuse(prompt: object = "") -> str:
        raise NormlabError("a dependency asked a question on standard input (normlab answers none and runs no "
                           "code from a model directory)")

    saved_stdin, saved_input = sys.stdin, builtins.input
    sys.stdin, builtins.input = io.StringIO(""), refuse
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        sys.stdin, builtins.input = saved_stdin, saved_input


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:160]}" if text else type(e).__name__


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def _type_error(path: Path, key: str, value: Any, allowed: str) -> NormlabError:
    shown = json.dumps(value)[:40]
    return NormlabError(f"{path}: '{key}' is {shown}; it must be {allowed}")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return (_is_int(v) or isinstance(v, float)) and math.isfinite(float(v))


def check_config_types(raw: dict[str, Any], path: Path) -> None:
    """Every key normlab reads has its type (``CONFIG_TYPES`` above): one line naming the key otherwise."""
    for k in POS_INT + OPT_POS_INT:
        if k in raw and not (raw[k] is None and k in OPT_POS_INT):
            if not _is_int(raw[k]) or raw[k] < 1:
                raise _type_error(path, k, raw[k], "an integer >= 1" + (" or null" if k in OPT_POS_INT else ""))
    for k in POS_FLOAT + OPT_POS_FLOAT:
        if k in raw and not (raw[k] is None and k in OPT_POS_FLOAT):
            if not _is_number(raw[k]) or raw[k] <= 0:
                raise _type_error(path, k, raw[k], "a finite number > 0" + (" or null" if k in OPT_POS_FLOAT else ""))
    for k in BOOLS:
        if k in raw and not isinstance(raw[k], bool):
            raise _type_error(path, k, raw[k], "true or false")
    for k in OPT_STR:
        if k in raw and raw[k] is not None and not isinstance(raw[k], str):
            raise _type_error(path, k, raw[k], "a string")
    for k in OPT_DICT:
        if k in raw and raw[k] is not None:
            if not isinstance(raw[k], dict):
                raise _type_error(path, k, raw[k], "an object or null")
            check_config_types(raw[k], path)
            if "rope_type" in raw[k] and not isinstance(raw[k]["rope_type"], str):
                raise _type_error(path, f"{k}.rope_type", raw[k]["rope_type"], "a string")
    for k in TOKEN_IDS:
        v = raw.get(k)
        ok = v is None or _is_int(v) or (isinstance(v, list) and all(_is_int(i) for i in v))
        if not ok:
            raise _type_error(path, k, v, "a token id (an integer), a list of them, or null")
    lt = raw.get("layer_types")
    if lt is not None and not (isinstance(lt, list) and all(isinstance(t, str) for t in lt)):
        raise _type_error(path, "layer_types", lt, "a list of strings or null")


def _shown(v: Any, n: int = 60) -> str:
    """A value of a user's file for a one-line message: JSON (control characters escaped), cut to ``n``."""
    text = json.dumps(v, ensure_ascii=True)
    return text if len(text) <= n else text[: n - 3] + "..."


def _key(k: str) -> str:
    """A key of a user's file as printed: as is when printable, else JSON-escaped."""
    return k[:60] if k.isprintable() else _shown(k)


def read_model_json(path: Path, cap: int, what: str) -> Any:
    """The JSON value of ``path``, a file of a model directory: a regular file (opened without blocking, so a FIFO
    is refused, never waited on) of at most ``cap`` bytes (from its size: a larger file is never read), strict JSON
    (no ``NaN`` / ``Infinity``). ``what``: the file's kind, for the one-line refusals."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as e:
        raise NormlabError(f"cannot read {path}: {e.strerror or type(e).__name__}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NormlabError(f"{path} is not a regular file (a FIFO, device or directory); {what} must be a "
                               "plain JSON file")
        if st.st_size > cap:
            raise NormlabError(f"{path} is {st.st_size} bytes, more than the {cap >> 20} MiB a {what} may have; "
                               "refusing to read it")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(cap + 1)
    except OSError as e:
        raise NormlabError(f"cannot read {path}: {e.strerror or type(e).__name__}") from None
    finally:
        os.close(fd)
    if len(data) > cap:  # grew while being read
        raise NormlabError(f"{path} is larger than the {cap >> 20} MiB a {what} may have; refusing to read it")
    try:
        return json.loads(data.decode("utf-8"), parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        reason = str(e).splitlines()[0][:80] if isinstance(e, ValueError) else type(e).__name__
        raise NormlabError(f"{path} is not valid JSON ({reason})") from None


def _same(v: Any, allowed: tuple[Any, ...]) -> bool:
    """``v`` is one of ``allowed``, type included (JSON ``0`` is not ``false``)."""
    return any(v is a or (type(v) is type(a) and v == a) for a in allowed)


def _rope_type(d: dict[str, Any]) -> Any:
    return d.get("rope_type", d.get("type"))


def check_config_keys(raw: dict[str, Any], path: Path) -> None:
    """The checks of ``read_hf_config`` after the types: ``SEMANTIC`` values, ``SIZE_RANGES``, list lengths and
    the RoPE type, each a one-line NormlabError naming the key; nothing is allocated from the values before this."""
    for k, (allowed, why) in SEMANTIC.items():
        if k in raw and not _same(raw[k], allowed):
            shown = ", ".join("null" if a is None else json.dumps(a) for a in allowed)
            raise NormlabError(f"{path}: '{k}' is {_shown(raw[k])}; {why} (allowed: {shown}, or no such key)")
    for k, rng in SIZE_RANGES.items():
        v = raw.get(k)
        if v is None:
            continue
        if not _is_int(v) or not rng.contains(v):
            hi = f"{int(rng.hi)}" if rng.hi is not None else "any"
            raise _type_error(path, k, v, f"an integer in {int(rng.lo or 0)}..{hi} (normlab's range for it)")
    for k in TOKEN_IDS:
        if isinstance(raw.get(k), list) and len(raw[k]) > MAX_TOKEN_IDS:
            raise NormlabError(f"{path}: '{k}' lists {len(raw[k])} token ids; at most {MAX_TOKEN_IDS} are allowed")
    depth = int(RANGES["model.depth"].hi)
    if isinstance(raw.get("layer_types"), list) and len(raw["layer_types"]) > depth:
        raise NormlabError(f"{path}: 'layer_types' has {len(raw['layer_types'])} entries; normlab's models have at "
                           f"most {depth} layers")
    for k in OPT_DICT:
        d = raw.get(k)
        if isinstance(d, dict) and _rope_type(d) not in (None, "default"):
            raise NormlabError(f"cannot import this {raw['model_type']} checkpoint exactly: {k} has RoPE type "
                               f"{_shown(_rope_type(d), 40)} (normlab has the default RoPE only)")


def read_hf_config(hf_dir: Path) -> tuple[str, dict[str, Any]]:
    """``(model_type, config dict)`` of ``hf_dir/config.json``, checked as the module docstring says."""
    path = hf_dir / "config.json"
    raw = read_model_json(path, MAX_CONFIG_BYTES, "config.json")
    if not isinstance(raw, dict):
        raise NormlabError(f"{path} must hold a JSON object, got {type(raw).__name__}")
    mt = raw.get("model_type")
    if mt not in ARCHS:
        shown = f"'{mt[:60]}'" if isinstance(mt, str) and mt.isprintable() else _shown(mt)
        raise NormlabError(f"cannot import HF model type {shown} ({path}); allowed: {', '.join(ARCHS)} (normlab "
                           "never runs a model directory's own code)")
    if raw.get("auto_map") is not None:
        raise NormlabError(f"{path} has 'auto_map' (custom model code); normlab never runs a model directory's code "
                           f"and imports only transformers' own {', '.join(ARCHS)} classes: remove auto_map if the "
                           "model is a plain one")
    check_config_types(raw, path)
    check_config_keys(raw, path)
    return mt, raw


def hf_config_kwargs(arch: str, raw: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """``(kwargs, ignored)``: the family config class's keyword arguments from ``raw`` (checked by
    ``read_hf_config``), only the ``MAPPED`` keys (a RoPE dict only its ``ROPE_SUBKEYS``) and normlab's
    ``attn_implementation``; ``ignored``: the dropped keys that are not ``QUIET`` (``rope_parameters.factor`` for a
    sub-key), sorted, for a note."""
    kw: dict[str, Any] = {}
    ignored: list[str] = []
    for k, v in raw.items():
        if k in MAPPED[arch]:
            if k in OPT_DICT and isinstance(v, dict):
                ignored += [f"{k}.{_key(s)}" for s in v if s not in ROPE_SUBKEYS and s != "type"]
                v = {s: x for s, x in v.items() if s in ROPE_SUBKEYS}
            kw[k] = v
        elif k not in QUIET and not _QUIET_PATTERN.search(k):
            ignored.append(_key(k))
    kw["attn_implementation"] = ATTN_IMPLEMENTATION
    return kw, sorted(ignored)


def build_hf_config(transformers: Any, arch: str, kw: dict[str, Any], path: Path) -> Any:
    """The family's own ``transformers`` config class built from ``hf_config_kwargs``' arguments (no
    ``AutoConfig``)."""
    cls = getattr(transformers, CLASSES[arch][0])
    try:
        with dependency_io():
            return cls(**kw)
    except NormlabError:
        raise
    except Exception as e:  # a dependency's validation of user data: one line
        raise NormlabError(f"transformers refuses {path} as a {arch} config ({_first_line(e)})") from None


def weight_files(hf_dir: Path) -> list[Path]:
    """The safetensors files holding ``hf_dir``'s weights; pickle-only directories refused, never opened."""
    single = hf_dir / "model.safetensors"
    index = hf_dir / "model.safetensors.index.json"
    for p in (single, index):
        if p.exists() and not p.is_file():
            raise NormlabError(f"{p} is not a regular file (a FIFO, device or directory)")
    if single.is_file():
        return [single]
    if index.is_file():
        obj = read_model_json(index, MAX_INDEX_BYTES, "safetensors index")
        wm = obj.get("weight_map") if isinstance(obj, dict) else None
        if not (isinstance(wm, dict) and all(isinstance(v, str) for v in wm.values())
                and (obj.get("metadata") is None or isinstance(obj["metadata"], dict))):
            raise NormlabError(f"{index} is not a safetensors index (a JSON object whose 'weight_map' maps tensor "
                               "names to shard file names, and an optional 'metadata' object)")
        names = sorted(set(wm.values()))
        files = []
        for n in names:
            plain = isinstance(n, str) and "/" not in n and "\\" not in n and n not in ("", ".", "..")
            if not plain or not n.endswith(".safetensors"):
                raise NormlabError(f"{index} names shard {json.dumps(n)[:60]}; shards must be *.safetensors files "
                                   "in the model directory")
            if not (hf_dir / n).is_file():
                raise NormlabError(f"{index} names shard '{_key(n)}', which is not in {hf_dir}")
            files.append(hf_dir / n)
        if not files:
            raise NormlabError(f"{index} names no shards")
        return files
    pickles = sorted({p.name for g in PICKLE_GLOBS for p in hf_dir.glob(g)})
    if pickles:
        raise NormlabError(f"{hf_dir} has only pickle weights ({', '.join(pickles[:3])}); normlab never unpickles a "
                           "file it is handed (loading a pickle can run code): convert it to model.safetensors with "
                           "safetensors' own converter (https://huggingface.co/spaces/safetensors/convert, or "
                           "bindings/python/convert.py of github.com/huggingface/safetensors) where you trust the "
                           "file, then import the safetensors directory")
    raise NormlabError(f"{hf_dir} has no model.safetensors (nor model.safetensors.index.json); normlab imports "
                       "safetensors weights only")


def read_header(path: Path) -> dict[str, dict[str, Any]]:
    """``{name: {"dtype", "shape", "data_offsets"}}`` of a safetensors file, every entry checked against the file."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise NormlabError(f"{path} is {size} bytes: truncated or empty (not a safetensors file)")
            (n,) = struct.unpack("<Q", head)
            if n > min(size - 8, MAX_HEADER_BYTES):
                raise NormlabError(f"{path}: header length {n} exceeds the file ({size} bytes) or "
                                   f"{MAX_HEADER_BYTES >> 20} MiB: truncated or not a safetensors file")
            text = f.read(n)
    except OSError as e:
        raise NormlabError(f"cannot read {path}: {e.strerror or type(e).__name__}") from None
    try:
        header = json.loads(text.decode("utf-8"), parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise NormlabError(f"{path}: the safetensors header is not valid JSON (truncated or corrupted)") from None
    if not isinstance(header, dict):
        raise NormlabError(f"{path}: the safetensors header is not a JSON object")
    header.pop("__metadata__", None)
    data_len = size - 8 - n
    for name, e in header.items():
        bad = f"{path}: tensor '{name[:80]}'"
        if not isinstance(e, dict):
            raise NormlabError(f"{bad} has no dtype / shape / data_offsets entry")
        dtype, shape, offs = e.get("dtype"), e.get("shape"), e.get("data_offsets")
        width = FLOAT_DTYPES.get(dtype) or OTHER_DTYPES.get(dtype) if isinstance(dtype, str) else None
        if width is None:
            raise NormlabError(f"{bad} has unknown dtype {json.dumps(dtype)[:20]}")
        if not (isinstance(shape, list) and all(_is_int(s) and s >= 0 for s in shape)):
            raise NormlabError(f"{bad} has an invalid shape {json.dumps(shape)[:40]}")
        if not (isinstance(offs, list) and len(offs) == 2 and all(_is_int(o) for o in offs)
                and 0 <= offs[0] <= offs[1] <= data_len):
            raise NormlabError(f"{bad} has data offsets {json.dumps(offs)[:40]} outside the file's {data_len} data "
                               "bytes (truncated?)")
        if offs[1] - offs[0] != math.prod(shape) * width:
            raise NormlabError(f"{bad}: shape {tuple(shape)} of {dtype} needs {math.prod(shape) * width} bytes, its "
                               f"offsets give {offs[1] - offs[0]}")
    return header


def expected_tensors(transformers: Any, arch: str, hc: Any) -> dict[str, tuple[int, ...]]:
    """Names and shapes of the family's causal-LM parameters for config ``hc`` (built on ``meta``: no memory)."""
    cls = getattr(transformers, CLASSES[arch][1])
    try:
        with dependency_io(), torch.device("meta"):
            m = cls(hc)
    except NormlabError:
        raise
    except Exception as e:
        raise NormlabError(f"transformers cannot build a {arch} model from config.json ({_first_line(e)})") from None
    return {k: tuple(v.shape) for k, v in m.state_dict().items()}


def _canonical(name: str, arch: str, expected: dict[str, tuple[int, ...]]) -> str | None:
    """The model's name for file tensor ``name`` (prefix-less base-model checkpoints, old names), None if ignored."""
    if IGNORED.get(arch, _ROPE_BUFFER).search(name):
        return None
    name = RENAMES.get(arch, {}).get(name, name)
    if name in expected:
        return name
    prefixed = f"{BASE_PREFIX.get(arch, 'model')}.{name}"
    return prefixed if prefixed in expected else name


def tied_pairs(transformers: Any, arch: str, hc: Any) -> dict[str, str]:
    """``{head: embedding}`` names that the config ties (empty when ``tie_word_embeddings`` is false)."""
    if not getattr(hc, "tie_word_embeddings", False):
        return {}
    tied = getattr(getattr(transformers, CLASSES[arch][1]), "_tied_weights_keys", None) or {}
    return dict(tied) if isinstance(tied, dict) else {}


def check_tensors(headers: dict[Path, dict[str, dict[str, Any]]], arch: str, expected: dict[str, tuple[int, ...]],
                  tied: dict[str, str]) -> dict[str, tuple[Path, str]]:
    """``{model name: (file, file name)}`` for every expected tensor; one-line refusals naming the tensor."""
    found: dict[str, tuple[Path, str]] = {}
    for path, header in headers.items():
        for name, e in sorted(header.items()):
            key = _canonical(name, arch, expected)
            if key is None:
                continue
            if key not in expected:
                raise NormlabError(f"{path}: tensor '{name[:80]}' is not part of the {arch} model config.json "
                                   "describes (unexpected tensor; a different depth, width or family?)")
            if key in found:
                raise NormlabError(f"{path}: tensor '{key}' appears twice (as '{found[key][1]}' and '{name}')")
            if tuple(e["shape"]) != expected[key]:
                raise NormlabError(f"{path}: tensor '{name}' has shape {tuple(e['shape'])}, config.json implies "
                                   f"{expected[key]}")
            if e["dtype"] not in FLOAT_DTYPES:
                raise NormlabError(f"{path}: tensor '{name}' has dtype {e['dtype']}; weights must be floating point "
                                   f"({', '.join(FLOAT_DTYPES)})")
            found[key] = (path, name)
    missing = sorted(k for k in expected if k not in found and k not in tied)
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise NormlabError(f"tensor '{missing[0]}' is missing from the model's safetensors{more}; config.json's "
                           f"{arch} model needs it (normlab imports exactly what the file holds, nothing random)")
    return found


def load_tensors_checked(found: dict[str, tuple[Path, str]]) -> dict[str, Any]:
    """The tensors as float32 (``safetensors.safe_open``: no pickle), each finite."""
    out: dict[str, Any] = {}
    by_file: dict[Path, list[tuple[str, str]]] = {}
    for key, (path, name) in found.items():
        by_file.setdefault(path, []).append((key, name))
    for path, items in by_file.items():
        try:
            with safe_open(str(path), framework="pt") as f:
                for key, name in items:
                    out[key] = f.get_tensor(name).to(torch.float32)
        except (NormlabError, MemoryError):
            raise
        except Exception as e:  # safetensors' own checks (overlapping offsets, ...): one line
            raise NormlabError(f"{path} is not a readable safetensors file ({_first_line(e)})") from None
    for key, t in out.items():
        if not bool(torch.isfinite(t).all()):
            raise NormlabError(f"tensor '{found[key][1]}' ({found[key][0]}) contains NaN or inf; refusing to import")
    return out
