"""``normlab import HF_DIR --out RUN_DIR``: a local ``transformers`` checkpoint as a normlab run directory.

Families: GPT-2, GPT-NeoX (sequential residual, full rotary), Llama, Qwen3, Gemma 2 and OLMo 2 (no grouped-query
attention, default RoPE). The HF config becomes a normlab ``ModelConfig`` (``model_config``, one-line refusal for
anything normlab has no exact form of), the tensors go through the inverse of ``mapping.weight_map``, and the
result is checked like an export (``check.compare_models``: max |logit diff| <= 1e-4 on the data's validation
tokens, greedy generation equal) before the run directory is renamed into place. Nothing is downloaded and nothing
in ``HF_DIR`` is executed or unpickled (``hf_files``: ``config.json`` read and type-checked here, only
transformers' own classes of the six families, never ``Auto*`` / ``from_pretrained``; weights only from
safetensors, exact to the family's parameter set; parameter total and memory checked before any weight is read).

Run directory: ``config.yaml`` (``data.source`` = ``--data``, ``data.tokenizer`` = ``bytes`` or the HF
tokenizer's lossless copy ``RUN_DIR/tokenizer.json``), ``model.safetensors``, ``data.json`` / ``provenance.json``
(``normlab.rundir.readers``: the run is self-contained like a trained one), ``summary.json`` (status ``completed``,
``imported_from``) and ``hf_import.json`` (family, check numbers, the document-start token an
lm-evaluation-harness run of the HF model would use: ``bos_token_id``, else ``eos_token_id``; the ``config.json``
keys normlab does not map and dropped, ``ignored_config_keys``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from normlab.config import DataConfig, RunConfig
from normlab.data.tokenizer import DOC_SUFFIX
from normlab.errors import NormlabError
from normlab.interop.arch import ARCHS
from normlab.interop.check import LOGIT_TOL, compare_models, require_transformers
from normlab.interop.hf_files import (
    CLASSES,
    build_hf_config,
    check_tensors,
    dependency_io,
    expected_tensors,
    hf_config_kwargs,
    load_tensors_checked,
    read_header,
    read_hf_config,
    tied_pairs,
    weight_files,
)
from normlab.interop.hf_tokenizer import HF_TOKENIZER_FILE, normlab_tokenizer
from normlab.interop.mapping import weight_map
from normlab.io import check_new_dir, publish_dir, write_json
from normlab.model import ModelConfig, build_model
from normlab.rundir.files import HF_IMPORT_FILE, SUMMARY_FILE, TOKENIZER_FILE
from normlab.rundir.publish import write_run
from normlab.rundir.readers import load_data, save_run_identity
from normlab.validate import check_memory, check_param_total

FORMAT = "normlab-hf-import-v1"
GELU = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}


def _refuse(arch: str, what: str) -> NormlabError:
    return NormlabError(f"cannot import this {arch} checkpoint exactly: {what}")


def _rope_theta(hc, arch: str) -> float:
    rp = dict(getattr(hc, "rope_parameters", None) or {})
    if rp.get("rope_type", "default") != "default":
        raise _refuse(arch, f"RoPE type '{rp.get('rope_type')}' (normlab has the default RoPE only)")
    if float(rp.get("partial_rotary_factor", 1.0)) != 1.0:
        raise _refuse(arch, f"partial rotary factor {rp.get('partial_rotary_factor')} (normlab rotates whole heads)")
    return float(rp.get("rope_theta", 10000.0))


def _check_heads(hc, arch: str) -> None:
    kv = getattr(hc, "num_key_value_heads", None)
    if kv is not None and kv != hc.num_attention_heads:
        raise _refuse(arch, f"grouped-query attention ({kv} key/value heads for {hc.num_attention_heads} query heads)")
    hd = getattr(hc, "head_dim", None)
    if hd is not None and hd * hc.num_attention_heads != hc.hidden_size:
        raise _refuse(arch, f"head_dim {hd} x {hc.num_attention_heads} heads != hidden_size {hc.hidden_size}")


def model_config(hc) -> tuple[str, dict[str, Any]]:
    """``(arch, ModelConfig keyword arguments)`` for an HF config ``hc``; one-line NormlabError if not exact."""
    arch = hc.model_type
    if arch not in ARCHS:
        raise NormlabError(f"cannot import HF model type '{arch}'; allowed: {', '.join(ARCHS)}")
    common = dict(vocab_size=hc.vocab_size, tie_embeddings=bool(hc.tie_word_embeddings), dropout=0.0,
                  init_std=float(getattr(hc, "initializer_range", 0.02)), final_norm=True, embed_norm=False)
    if arch == "gpt2":
        act = GELU.get(hc.activation_function)
        if act is None:
            raise _refuse(arch, f"activation '{hc.activation_function}' (gelu, gelu_new, gelu_pytorch_tanh import)")
        if hc.scale_attn_by_inverse_layer_idx or not hc.scale_attn_weights:
            raise _refuse(arch, "attention scaling other than 1/sqrt(head_dim)")
        return arch, dict(common, context=hc.n_positions, width=hc.n_embd, depth=hc.n_layer, heads=hc.n_head,
                          mlp_hidden=hc.n_inner or 4 * hc.n_embd, activation=act, positions="learned",
                          norm="layernorm", norm_eps=float(hc.layer_norm_epsilon), bias=True, placement="pre")
    _check_heads(hc, arch)
    base = dict(common, context=hc.max_position_embeddings, width=hc.hidden_size, depth=hc.num_hidden_layers,
                heads=hc.num_attention_heads, mlp_hidden=hc.intermediate_size, positions="rope",
                rope_base=_rope_theta(hc, arch))
    if arch == "gpt_neox":
        if hc.use_parallel_residual:
            raise _refuse(arch, "use_parallel_residual: true (normlab blocks are sequential)")
        act = GELU.get(hc.hidden_act)
        if act is None:
            raise _refuse(arch, f"activation '{hc.hidden_act}' (gelu, gelu_new, gelu_pytorch_tanh import)")
        return arch, dict(base, activation=act, norm="layernorm", norm_eps=float(hc.layer_norm_eps), bias=True,
                          placement="pre")
    act = getattr(hc, "hidden_activation", None) if arch == "gemma2" else hc.hidden_act
    if act != "silu":
        raise _refuse(arch, f"MLP activation '{act}' (normlab's gated MLP is SwiGLU: silu imports)")
    rms = dict(base, activation="swiglu", norm="rmsnorm", norm_eps=float(hc.rms_norm_eps))
    bias = bool(getattr(hc, "attention_bias", False))
    if arch == "llama":
        if bias != bool(getattr(hc, "mlp_bias", False)):
            raise _refuse(arch, "attention_bias != mlp_bias (normlab's model.bias covers both)")
        return arch, dict(rms, bias=bias, placement="pre")
    if bias:
        raise _refuse(arch, "attention_bias: true (its MLP has none; normlab's model.bias covers both)")
    if arch == "qwen3":
        if getattr(hc, "use_sliding_window", False):
            raise _refuse(arch, "sliding-window attention")
        return arch, dict(rms, placement="pre", qk_norm=True, qk_norm_scope="head")
    if arch == "olmo2":
        return arch, dict(rms, placement="output", qk_norm=True, qk_norm_scope="width")
    # gemma2
    types = list(getattr(hc, "layer_types", None) or [])
    if any(t != "full_attention" for t in types) and (hc.sliding_window or 0) < hc.max_position_embeddings:
        raise _refuse(arch, f"sliding-window layers (window {hc.sliding_window} < {hc.max_position_embeddings} "
                            "positions)")
    if hc.query_pre_attn_scalar != hc.hidden_size // hc.num_attention_heads:
        raise _refuse(arch, f"query_pre_attn_scalar {hc.query_pre_attn_scalar} != head_dim (normlab scales scores "
                            "by 1/sqrt(head_dim))")
    return arch, dict(rms, placement="peri", norm_options={"unit_offset": True}, embed_scale="fixed",
                      logit_softcap=hc.final_logit_softcapping, attn_softcap=hc.attn_logit_softcapping)


def load_hf_weights(model: torch.nn.Module, cfg, arch: str, hf_state: dict[str, torch.Tensor]) -> None:
    """Inverse of ``mapping.weight_map``: write ``hf_state`` into the normlab ``model`` (in place)."""
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    for e in weight_map(cfg, arch, state):
        if e.hf not in hf_state:
            if e.nl is not None and e.hf.endswith(".bias"):  # HF has no bias here: normlab's stays zero
                state[e.nl][e.rows if e.rows is not None else slice(None)] = 0.0
                continue
            if e.nl is None:
                continue
            raise _refuse(arch, f"tensor '{e.hf}' is missing")
        v = hf_state[e.hf].detach().float()
        if e.nl is None:
            if not torch.all(v == e.fill):
                raise _refuse(arch, f"tensor '{e.hf}' is not the constant {e.fill} normlab's model implies")
            continue
        if e.transpose:
            v = v.t()
        v = (v - e.add) / e.mul
        if e.rows is not None:
            state[e.nl][e.rows] = v
        else:
            state[e.nl].copy_(v)
    if cfg.tie_embeddings:
        state["lm_head.weight"] = state["tok_emb.weight"]
    model.load_state_dict(state)


def _doc_start(hc, vocab: int) -> tuple[int | None, str, str | None]:
    """``(token, source, note)``: the document-start token an lm-evaluation-harness run of the HF model would use
    (``bos_token_id``, else ``eos_token_id``), only when it is a token of the ``vocab``-token model (else None);
    ``note`` names the ids skipped for lying outside the vocabulary."""
    notes = []
    for key in ("bos_token_id", "eos_token_id"):
        v = getattr(hc, key, None)
        if isinstance(v, list):
            v = v[0] if v else None
        if v is None:
            continue
        if isinstance(v, int) and 0 <= v < vocab:
            return v, f"config.json {key}", "; ".join(notes) or None
        notes.append(f"{key} {v} is outside the {vocab}-token vocabulary")
    note = "; ".join(notes) or None
    return None, note or "config.json has no bos_token_id / eos_token_id", note


def _tokenizer(hf_dir: Path, tmp: Path, out: Path, vocab: int) -> tuple[str, str]:
    """``(data.tokenizer spec, where it came from)`` when ``--tokenizer`` is not given: the HF directory's lossless
    byte-level BPE, else bytes for a 256-token vocabulary, else a one-line refusal saying why."""
    tokenizer = normlab_tokenizer(hf_dir, tmp / TOKENIZER_FILE)
    if tokenizer is not None:
        if tokenizer.startswith(str(tmp.resolve())):  # the copy's final place (a +doc suffix kept)
            tokenizer = str((out / TOKENIZER_FILE).resolve()) + tokenizer[len(str(tmp.resolve() / TOKENIZER_FILE)):]
            return tokenizer, f"{hf_dir}/tokenizer.json (byte-level BPE, copied)"
        return tokenizer, f"{hf_dir}/tokenizer.json (the 256 byte tokens)"
    has = (hf_dir / HF_TOKENIZER_FILE).is_file()
    what = ("its tokenizer.json is not a lossless byte-level BPE" if has else "it has no tokenizer.json")
    if vocab == 256:
        return "bytes", f"bytes ({what}; the vocabulary has 256 tokens)"
    raise NormlabError(f"{hf_dir}: {what}, and its vocabulary has {vocab} tokens, not the byte tokenizer's 256; "
                       "pass --tokenizer PATH/tokenizer.json (the tokenizer the model was trained with)")


def read_hf_model(transformers, hf_dir: Path) -> tuple[str, Any, dict[str, Any], dict[str, Any], list[str]]:
    """``(arch, HF config, ModelConfig keyword arguments, HF tensors, ignored config keys)`` of ``hf_dir``, read as
    ``hf_files`` says: config checked and limited (sizes, ``MAX_PARAMS``, available memory) before anything is
    built or any weight is read, the HF config made from the keys normlab maps only, the safetensors exact to the
    family's parameter set. Nothing in ``hf_dir`` is executed or unpickled."""
    arch, raw = read_hf_config(hf_dir)
    hf_kw, ignored = hf_config_kwargs(arch, raw)
    hc = build_hf_config(transformers, arch, hf_kw, hf_dir / "config.json")
    arch, kw = model_config(hc)
    try:
        mc = ModelConfig(**kw).validate()
    except NormlabError as e:  # normlab's key names: say which file they came from
        raise NormlabError(f"{hf_dir}/config.json as a normlab model: {e}") from None
    n = check_param_total(mc, f"the {arch} model of {hf_dir}/config.json")
    check_memory(16 * n, "the file's tensors, the HF model, the normlab model and a copy: 16 bytes per parameter",
                 f"importing this {n:.3g}-parameter model", "import a smaller model or free memory")
    files = weight_files(hf_dir)
    headers = {f: read_header(f) for f in files}
    tied = tied_pairs(transformers, arch, hc)
    found = check_tensors(headers, arch, expected_tensors(transformers, arch, hc), tied)
    tensors = load_tensors_checked(found)
    for head, emb in tied.items():
        if head in tensors and not torch.equal(tensors[head], tensors[emb]):
            raise NormlabError(f"tensor '{head}' differs from '{emb}', but config.json ties them "
                               "(tie_word_embeddings: true)")
        tensors.pop(head, None)
    return arch, hc, kw, tensors, ignored


def build_hf(transformers, arch: str, hc, tensors: dict[str, Any], tied: dict[str, str]) -> torch.nn.Module:
    """The family's own ``transformers`` class (no ``Auto*``, no remote code) holding exactly ``tensors``."""
    cls = getattr(transformers, CLASSES[arch][1])
    try:
        with dependency_io():
            hf = cls(hc).float()
            missing, unexpected = hf.load_state_dict(tensors, strict=False)
            if tied:
                hf.tie_weights()
    except NormlabError:
        raise
    except MemoryError:  # guarded: the out-of-memory line
        raise
    except Exception as e:  # noqa: BLE001 - transformers' model construction on user data: one line
        first = (str(e).strip().splitlines() or [""])[0][:160]
        raise NormlabError(f"transformers cannot build the {arch} model of config.json ({type(e).__name__}: "
                           f"{first})") from None
    if set(missing) - set(tied) or unexpected:  # check_tensors made these exact: a bug, never a user error
        raise RuntimeError(f"HF import of {arch}: missing {sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]}")
    return hf.eval()


def import_hf(hf_dir: str | Path, out: str | Path, *, data: str = "pystdlib", tokenizer: str | None = None
              ) -> dict[str, Any]:
    """Import the HF checkpoint in ``hf_dir`` as a run directory ``out``; returns the import record."""
    transformers = require_transformers()
    hf_dir, out = Path(hf_dir), Path(out)
    if not hf_dir.is_dir():
        raise NormlabError(f"{hf_dir} is not a directory (give a local HF model directory)")
    if not (hf_dir / "config.json").exists():
        raise NormlabError(f"{hf_dir} is not a local HF model directory (no config.json)")
    check_new_dir(out)
    arch, hc, kw, tensors, ignored = read_hf_model(transformers, hf_dir)
    tied = tied_pairs(transformers, arch, hc)
    vocab = int(kw["vocab_size"])
    with publish_dir(out) as tmp:
        if tokenizer is None:
            tokenizer, tok_source = _tokenizer(hf_dir, tmp, out, vocab)
        else:
            tok_source = "--tokenizer"
        cfg = RunConfig(data=DataConfig(source=data, tokenizer=tokenizer), model=ModelConfig(**kw))
        cfg.validate()
        model = build_model(cfg.model)
        hf = build_hf(transformers, arch, hc, tensors, tied)
        del tensors
        load_hf_weights(model, cfg.model, arch, hf.state_dict())
        model.eval()
        write_run(tmp, cfg, model)  # config.yaml, model.safetensors (normlab.rundir.publish)
        tok_file = tmp / TOKENIZER_FILE
        data_cfg = cfg
        if tok_file.is_file():  # load the data with the copy where it is now; the config names its final place
            suffix = DOC_SUFFIX if cfg.data.tokenizer.endswith(DOC_SUFFIX) else ""
            data_cfg = RunConfig(data=DataConfig(source=data, tokenizer=str(tok_file) + suffix), model=cfg.model)
        prepared = load_data(data_cfg)
        save_run_identity(tmp, cfg, prepared)  # tokenizer.json (BPE), data.json, provenance.json
        if prepared.vocab_size > cfg.model.vocab_size:
            raise NormlabError(f"tokenizer has {prepared.vocab_size} tokens but the model only {cfg.model.vocab_size}")
        with dependency_io():
            check = compare_models(model, hf, prepared.val, cfg.model.context)
        if not check["max_abs_logit_diff"] <= LOGIT_TOL or not check["greedy_equal"]:
            raise NormlabError(f"import of {arch} failed its check (max |logit diff| "
                               f"{check['max_abs_logit_diff']:.3g}, tolerance {LOGIT_TOL:g}; greedy generation "
                               f"{'equal' if check['greedy_equal'] else 'differs'}); nothing written")
        doc_start, doc_source, doc_note = _doc_start(hc, vocab)
        record = {"format": FORMAT, "source": str(hf_dir), "arch": arch, "hf_class": type(hf).__name__, **check,
                  "tolerance": LOGIT_TOL, "dtype": "float32", "eval_split": "val", "doc_start_token": doc_start,
                  "doc_start_source": doc_source, "doc_start_note": doc_note, "data": data, "tokenizer": tokenizer,
                  "tokenizer_source": tok_source, "ignored_config_keys": ignored}
        write_json(tmp / HF_IMPORT_FILE, record)
        write_json(tmp / SUMMARY_FILE, {"status": "completed", "step": 0, "imported_from": str(hf_dir),
                                          "arch": arch, "max_abs_logit_diff": check["max_abs_logit_diff"],
                                          "params": model.num_params(), "config_hash": cfg.hash(),
                                          "run_dir": str(out)})
    return {**record, "out": str(out)}
