"""Reading a Hugging Face model directory without running or unpickling anything in it (``normlab import``).

A model directory is data a user hands us, so nothing in it is executed or unpickled, and nothing is taken on
trust:

- ``read_hf_config(hf_dir)``: ``config.json`` read here (strict JSON: no ``NaN`` / ``Infinity``, at most
  ``MAX_CONFIG_BYTES``), a ``model_type`` outside ``ARCHS`` refused before ``transformers`` sees the directory,
  an ``auto_map`` (custom code) refused, and every value normlab reads checked for its type (``CONFIG_TYPES``).
  The config object is then built from the checked dict with the family's own ``transformers`` config class
  (``CLASSES``), never through ``AutoConfig`` (whose ``trust_remote_code`` path prompts on stdin).
- ``weight_files(hf_dir)``: ``model.safetensors`` or the shards named by ``model.safetensors.index.json``. A
  directory with only pickle weights (``pytorch_model.bin``, ``*.pt``, ``*.ckpt``) is refused with the way to
  convert it (safetensors' own converter); such files are never opened.
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
import re
import struct
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from normlab.errors import NormlabError
from normlab.interop.arch import ARCHS

MAX_CONFIG_BYTES = 1 << 20
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


def read_hf_config(hf_dir: Path) -> tuple[str, dict[str, Any]]:
    """``(model_type, config dict)`` of ``hf_dir/config.json``, checked as the module docstring says."""
    path = hf_dir / "config.json"
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as e:
        raise NormlabError(f"cannot read {path}: {e.strerror or type(e).__name__}") from None
    if len(data) > MAX_CONFIG_BYTES:
        raise NormlabError(f"{path} is larger than {MAX_CONFIG_BYTES >> 20} MiB; not an HF config")
    try:
        raw = json.loads(data.decode("utf-8"), parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        reason = str(e).splitlines()[0][:80] if isinstance(e, ValueError) else type(e).__name__
        raise NormlabError(f"{path} is not valid JSON ({reason})") from None
    if not isinstance(raw, dict):
        raise NormlabError(f"{path} must hold a JSON object, got {type(raw).__name__}")
    mt = raw.get("model_type")
    if mt not in ARCHS:
        shown = json.dumps(mt)[:60] if not isinstance(mt, str) else f"'{mt[:60]}'"
        raise NormlabError(f"cannot import HF model type {shown} ({path}); allowed: {', '.join(ARCHS)} (normlab "
                           "never runs a model directory's own code)")
    if raw.get("auto_map") is not None:
        raise NormlabError(f"{path} has 'auto_map' (custom model code); normlab never runs a model directory's code "
                           f"and imports only transformers' own {', '.join(ARCHS)} classes: remove auto_map if the "
                           "model is a plain one")
    check_config_types(raw, path)
    return mt, raw


def build_hf_config(transformers: Any, arch: str, raw: dict[str, Any], path: Path) -> Any:
    """The family's own ``transformers`` config class built from the checked dict (no ``AutoConfig``)."""
    cls = getattr(transformers, CLASSES[arch][0])
    kw = {k: v for k, v in raw.items() if k not in ("model_type", "transformers_version", "architectures")}
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
    if single.is_file():
        return [single]
    if index.is_file():
        try:
            obj = json.loads(index.read_text(encoding="utf-8"), parse_constant=_no_constant)
            names = sorted(set(obj["weight_map"].values()))
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError):
            raise NormlabError(f"{index} is not a safetensors index (a JSON object with 'weight_map')") from None
        files = []
        for n in names:
            plain = isinstance(n, str) and "/" not in n and "\\" not in n and n not in ("", ".", "..")
            if not plain or not n.endswith(".safetensors"):
                raise NormlabError(f"{index} names shard {json.dumps(n)[:60]}; shards must be *.safetensors files "
                                   "in the model directory")
            if not (hf_dir / n).is_file():
                raise NormlabError(f"{index} names shard '{n}', which is not in {hf_dir}")
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
    import torch

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
    import torch
    from safetensors import safe_open

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
