"""``normlab export RUN_DIR --to hf --out DIR``: a ``transformers`` model directory, checked on real text.

Steps: pick the HF family the run's config maps onto exactly (``arch.hf_arch``, else a one-line refusal), map every
tensor (``mapping.weight_map``), save with ``save_pretrained`` (safetensors) plus tokenizer files
(``hf_tokenizer``) into a temporary directory, load it back with ``AutoModelForCausalLM.from_pretrained`` and
compare on the run's validation tokens (fp32):

- ``max_abs_logit_diff``: max |normlab logits - HF logits| over ``check.LOGIT_WINDOWS`` windows of the training
  context spread over the validation split; must be <= ``check.LOGIT_TOL`` (1e-4);
- ``greedy_equal``: ``GREEDY_NEW`` greedy tokens after a validation prompt, normlab vs HF ``generate``.

Only then is the directory renamed to ``--out`` (whole or absent). ``normlab_export.json`` stores the numbers.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from normlab.errors import NormlabError
from normlab.interop.arch import hf_arch
from normlab.interop.check import LOGIT_TOL, compare_models, require_transformers
from normlab.interop.hf_files import dependency_io
from normlab.interop.hf_tokenizer import doc_start_id, write_hf_tokenizer
from normlab.interop.mapping import gemma_embed_mul, hf_config, weight_map
from normlab.io import check_new_dir, publish_dir, write_json
from normlab.rundir.readers import load_run, run_data

FORMAT = "normlab-hf-export-v1"
HF_CLASSES = {"gpt2": "GPT2Config", "gpt_neox": "GPTNeoXConfig", "llama": "LlamaConfig", "qwen3": "Qwen3Config",
              "gemma2": "Gemma2Config", "olmo2": "Olmo2Config"}


def hf_state_dict(model: torch.nn.Module, cfg, arch: str) -> dict[str, torch.Tensor]:
    """The HF tensors of ``arch`` for a normlab ``model`` (``cfg``: its ModelConfig); every normlab tensor used."""
    state = {k: v.detach().float() for k, v in model.state_dict().items()}
    mul = 1.0
    if arch == "gemma2":
        s = model.embed_scale
        value = None if s is None else float(s.detach().reshape(-1)[0]) if torch.is_tensor(s) else float(s)
        mul = gemma_embed_mul(cfg, value)
        f32 = lambda v: float(torch.tensor(v, dtype=torch.float32))  # noqa: E731
        if cfg.tie_embeddings and f32(value or 1.0) != f32(math.sqrt(cfg.width)):
            raise NormlabError(f"cannot export to HF exactly: model.embed_scale value {value} with tied embeddings "
                               f"(Gemma 2 multiplies by sqrt(width) = {math.sqrt(cfg.width):.6g}; an untied head "
                               "would export)")
        if cfg.tie_embeddings:
            mul = 1.0
    out, used = {}, set()
    for e in weight_map(cfg, arch, state, embed_mul=mul):
        if e.nl is None:
            out[e.hf] = None if e.fill is None else e.fill  # filled once the HF shape is known
            continue
        t = state[e.nl]
        used.add(e.nl)
        if e.rows is not None:
            t = t[e.rows]
        if e.transpose:
            t = t.t()
        out[e.hf] = (t * e.mul + e.add).contiguous() if (e.mul != 1.0 or e.add != 0.0) else t.contiguous()
    unused = set(state) - used - {"lm_head.weight", "embed_scale"}
    if unused:  # a tensor the map forgot would silently be dropped: a bug, never a user error
        raise RuntimeError(f"HF export map misses normlab tensors {sorted(unused)[:4]}")
    return out


def build_hf_model(cfg, arch: str, tensors: dict[str, Any]):
    """A ``transformers`` causal LM of ``arch`` holding ``tensors`` (fills: constants of the HF shape)."""
    import transformers

    config = getattr(transformers, HF_CLASSES[arch])(**hf_config(cfg, arch))
    with torch.device("cpu"):
        hf = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    own = hf.state_dict()
    full = {}
    for k, v in tensors.items():
        if k not in own:
            raise RuntimeError(f"HF export map names '{k}', which {arch} does not have")
        full[k] = torch.full_like(own[k], v) if isinstance(v, float) else v
        if full[k].shape != own[k].shape:
            raise RuntimeError(f"HF tensor '{k}': shape {tuple(full[k].shape)}, {arch} expects {tuple(own[k].shape)}")
    missing, unexpected = hf.load_state_dict(full, strict=False)
    missing = [m for m in missing if not (cfg.tie_embeddings and m == "lm_head.weight")]
    if missing or unexpected:
        raise RuntimeError(f"HF export map incomplete for {arch}: missing {missing[:4]}, unexpected {unexpected[:4]}")
    if cfg.tie_embeddings:
        hf.tie_weights()
    hf.eval()
    return hf


EXPORT_STAGES = ("loading the run", "preparing its tokenizer and validation split", "building the HF model",
                 "saving the HF directory", "reading it back with transformers and comparing logits on the val split")
"""What ``export_run`` reports through ``progress`` as it goes, in this order (then the result)."""


def export_run(run_dir: str | Path, out: str | Path, progress: Any = None) -> dict[str, Any]:
    """Export the run in ``run_dir`` to an HF directory ``out``; returns the export record (also
    ``out/normlab_export.json``). Refusals and a failed check are one-line NormlabErrors; nothing is written then.
    ``progress``: called with each of ``EXPORT_STAGES`` as it starts (``normlab export`` prints them)."""
    say = progress or (lambda stage: None)
    require_transformers()
    run_dir, out = Path(run_dir), Path(out)
    check_new_dir(out)
    say(EXPORT_STAGES[0])
    run = load_run(run_dir)
    cfg = run.cfg.model
    arch = hf_arch(cfg)
    say(EXPORT_STAGES[1])
    data = run_data(run_dir, run.cfg)
    if data.vocab_size > cfg.vocab_size:
        raise NormlabError(f"tokenizer has {data.vocab_size} tokens but the model only {cfg.vocab_size}")
    say(EXPORT_STAGES[2])
    hf = build_hf_model(cfg, arch, hf_state_dict(run.model, cfg, arch))
    with publish_dir(out) as tmp:
        say(EXPORT_STAGES[3])
        hf.save_pretrained(tmp)
        write_hf_tokenizer(data.tokenizer, tmp, cfg.context)
        from transformers import AutoModelForCausalLM

        say(EXPORT_STAGES[4])
        with dependency_io():  # our own files, read back as any user would; still no remote code, no prompt
            back = AutoModelForCausalLM.from_pretrained(tmp, trust_remote_code=False, dtype=torch.float32,
                                                        local_files_only=True)  # check what was written
            check = compare_models(run.model, back, data.val, cfg.context)
        doc_start = doc_start_id(data.tokenizer)  # +doc's separator, else newline (eval --documents); the eos token
        # absolute paths: the record (and the lm-eval arguments in it) must work from any working directory
        record = {"format": FORMAT, "source": str(run_dir.resolve()), "arch": arch, "hf_class": type(back).__name__,
                  **check, "tolerance": LOGIT_TOL, "dtype": "float32", "eval_split": "val",
                  "tokenizer": data.tokenizer.name, "doc_start_token": doc_start,
                  "lm_eval_model_args": f"pretrained={out.resolve()},prefix_token_id={doc_start},"
                                        f"max_length={cfg.context}"}
        if not check["max_abs_logit_diff"] <= LOGIT_TOL or not check["greedy_equal"]:
            raise NormlabError(f"export to HF {arch} failed its check (max |logit diff| "
                               f"{check['max_abs_logit_diff']:.3g}, tolerance {LOGIT_TOL:g}; greedy generation "
                               f"{'equal' if check['greedy_equal'] else 'differs'}); nothing written")
        write_json(tmp / "normlab_export.json", record)
    return {**record, "out": str(out.resolve())}
