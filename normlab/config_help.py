"""Every config key with its type, default, allowed values and a one-line description (``normlab config``).

The type is the config dataclass's annotation and the default its field default (``normlab.config``,
``normlab.model.config``); the allowed range is the one validation checks: :data:`normlab.validate.RANGES` for
numeric keys, the owning attention kind's ``ranges`` for attention options, and the choice tuples the sections'
``validate()`` check for string keys (norms, attention kinds and placements from their registries). Only the
one-line descriptions live here (:data:`KEY_HELP`); ``tests/test_config_help.py`` checks that every key has one
and that each listed range and choice list is exactly what validation accepts and refuses.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable
from typing import Any

from normlab.config import (CLIPS, DEVICES, EVAL_SAMPLES, OPTIMIZERS, PRECISIONS, STACKS, TRACKERS, RunConfig,
                            _all_keys, _type_name)
from normlab.model.config import ACTIVATIONS, EMBED_SCALES, POSITIONS, RESIDUAL_SCALES
from normlab.validate import RANGES, Range

KEY_HELP: dict[str, str] = {
    "seed": "drives model initialisation, data order and dropout (the unit of replication)",
    "device": "where to train: auto (CUDA when available), cpu or cuda",
    "data.source": "the corpus: pystdlib, a file, a directory, a .jsonl, hf:NAME, synthetic:markov?... (docs/data.md)",
    "data.tokenizer": "bytes, bpe:N (trained on the train split) or a tokenizer.json path; +doc adds a document token",
    "data.val_fraction": "share of the corpus held out for validation (by document hash, or the file's end)",
    "data.test_fraction": "share of the corpus held out for the test split",
    "data.cache_dir": "token cache root (null: $NORMLAB_CACHE_DIR, else ~/.cache/normlab)",
    "model.vocab_size": "number of token ids (filled in from the tokenizer)",
    "model.context": "training sequence length in tokens",
    "model.width": "residual stream width d_model",
    "model.depth": "number of transformer blocks",
    "model.heads": "attention heads (width must be divisible by heads)",
    "model.mlp_ratio": "MLP hidden size as a multiple of width (times 2/3 for swiglu)",
    "model.mlp_hidden": "MLP hidden size directly (null: derived from mlp_ratio)",
    "model.activation": "MLP activation",
    "model.positions": "position encoding: rope, learned table, alibi bias or none",
    "model.attention": "attention kind (normlab attention lists them; docs/attention.md)",
    "model.output": "output distribution: softmax, or StableMax (Prieto et al. 2025; docs/output.md)",
    "model.qk_norm": "RMSNorm on queries and keys before the scores (softmax, linear)",
    "model.qk_norm_scope": "qk_norm over each head's head_dim (head, Qwen3) or over all heads' q, k (width, OLMo 2)",
    "model.attn_softcap": "softmax score cap c: s = c * tanh(s / c) (null: no cap)",
    "model.lssa_reweight": "softplus attention's LSSAR re-weighting (switchable at evaluation time)",
    "model.lssa_power": "exponent of the LSSAR re-weighting (softplus attention)",
    "model.linear_conv": "kernel size of the causal depthwise convolution (linear, nala; 0: none)",
    "model.linear_conv_source": "what the convolution runs over: value (NaLaFormer) or input (LINA)",
    "model.linear_gate": "KV gate of linear attention: none, static (per head and position) or sigmoid",
    "model.linear_chunk": "chunk length of linear attention's prefix sums (speed only; same outputs)",
    "model.rope_base": "RoPE frequency base theta",
    "model.dropout": "dropout probability on attention and residual branches",
    "model.tie_embeddings": "share the token embedding with the LM head",
    "model.bias": "biases in the linear layers",
    "model.norm": "the normalization layer (normlab norms lists them; docs/norms.md)",
    "model.norm_eps": "epsilon added inside the norm's statistic",
    "model.norm_options": "extra options of the norm; key@group for one site group (attn, mlp, final, embed)",
    "model.placement": "where norms sit in a block: pre, post, peri, output or mix (docs/placements.md)",
    "model.final_norm": "norm before the LM head (null: the placement's default)",
    "model.embed_norm": "norm after the token embedding (null: the placement's default)",
    "model.mix_alpha": "Mix-LN: share of blocks (the first ones) that use Post-LN",
    "model.layernorm_scaling": "scale input-norm outputs of block l by 1/sqrt(l) (Curse of Depth)",
    "model.residual_scale": "residual branch scale: none, fixed 1/sqrt(2L), or learnable (a scalar per branch, init 0)",
    "model.embed_scale": "token-embedding scale: auto (as the norm asks), none, fixed sqrt(width) or learnable",
    "model.embed_scale_init": "(initial) embedding scale (null: sqrt(width), or 1/init_std for dyt's auto)",
    "model.head_bias": "a bias on the LM head (lets convert fold a final norm's bias into it)",
    "model.logit_softcap": "output logit cap c: z = c * tanh(z / c) (Gemma 2; null: no cap)",
    "model.init_std": "standard deviation of the normal weight initialisation",
    "train.steps": "optimizer steps",
    "train.batch_size": "sequences per micro-batch",
    "train.grad_accum": "micro-batches per optimizer step",
    "train.lr": "peak learning rate (after linear warm-up, cosine decay to min_lr_ratio * lr)",
    "train.min_lr_ratio": "final learning rate as a share of lr",
    "train.warmup_steps": "linear learning-rate warm-up steps",
    "train.weight_decay": "decoupled weight decay on matrices (AdamW)",
    "train.wd_norm": "also decay norm gains and biases",
    "train.wd_embeddings": "also decay the token (and position) embeddings",
    "train.beta1": "Adam beta1",
    "train.beta2": "Adam beta2",
    "train.grad_clip": "clip the global gradient norm to this (0: no clipping)",
    "train.clip": "gradient clipping: global norm, or AdaGC's per-tensor adaptive thresholds (Wang et al. 2025)",
    "train.adagc_lambda": "AdaGC: clip each tensor to lambda x the EMA of its clipped gradient norm",
    "train.adagc_beta": "AdaGC: EMA coefficient of each tensor's gradient norm",
    "train.adagc_warmup": "AdaGC: steps of global clipping that initialise the EMA (null: the LR warm-up)",
    "train.eval_every": "validate every N steps (and at the end)",
    "train.eval_batches": "validation batches per evaluation",
    "train.eval_sample": "validation windows spread over the whole split, or its head",
    "train.log_every": "write a training record to metrics.jsonl every N steps",
    "train.checkpoint_every": "save a resumable checkpoint every N steps",
    "train.keep_checkpoints": "checkpoints kept on disk (the newest)",
    "train.loss_ceiling": "a loss above this stops the run as diverged (null: 3 ln(vocab))",
    "train.z_loss": "z-loss coefficient c: loss += c * mean log^2 Z (PaLM; 0: off)",
    "train.logitnorm_tau": "LogitNorm temperature: CE on logits normalised to norm 1/tau (null: off)",
    "train.threads": "torch CPU threads: auto (from the machine's load at start), a count (clamped to the usable "
                     "cores) or null (torch's default)",
    "train.precision": "matmul precision: auto, fp32 or bf16 autocast (statistics stay fp32)",
    "train.compile": "torch.compile the model: auto, true or false",
    "train.deterministic": "CUDA: deterministic kernels, so a resumed run is bit-identical (CPU: always); auto: "
                           "deterministic kernels without NaN-filling new memory, the choice stated in the run log",
    "train.tf32": "CUDA: TF32 for fp32 matmuls (auto: on; false: strict fp32); no effect on CPU",
    "train.stack": "a sweep's runs of one architecture train as one stacked model: auto (on a GPU), on, off",
    "train.track": "where curves and hparams are logged live: tensorboard, wandb, mlflow (a list; [] for none)",
    "train.track_required": "true: a tracker server that does not answer at start is an error before training "
                            "(default false: a one-line warning, training goes on without it)",
    "optim.name": "optimizer: adamw, adamp or sgdp (docs/optim.md)",
    "optim.perp_grad": "perp-Grad: remove the gradient component along each weight (Prieto et al. 2025)",
    "optim.nap": "Normalize-and-Project after every step (Lyle et al. 2024)",
    "optim.delta": "AdamP / SGDP: cosine threshold for the projection",
    "optim.wd_ratio": "AdamP / SGDP: weight-decay ratio on projected (scale-invariant) weights",
    "optim.momentum": "SGDP momentum",
    "optim.effective_lr_every": "record ||dW|| / ||W|| of weights feeding norms every N steps (0: off)",
    "diag.every": "record per-block activation and gradient statistics every N steps (0: off)",
    "diag.spike_factor": "a step loss above this times the recent mean counts as a loss spike",
    "diag.spike_window": "steps in the recent mean for loss spikes",
    "diag.probes": "a sweep measures the in-context probes (induction, recall) on each completed run (probes.json)",
}


def _choices() -> dict[str, Callable[[], tuple[str, ...]]]:
    """The string keys with a fixed set of values, each as the tuple validation checks against."""
    from normlab.attention import attention_names
    from normlab.attention.linear import CONV_SOURCES, GATES
    from normlab.attention.softmax import QK_NORM_SCOPES
    from normlab.model.outputs import OUTPUTS
    from normlab.model.placements import PLACEMENTS
    from normlab.norms import norm_names

    return {
        "device": lambda: DEVICES,
        "model.activation": lambda: ACTIVATIONS,
        "model.positions": lambda: POSITIONS,
        "model.attention": lambda: tuple(attention_names()),
        "model.output": lambda: OUTPUTS,
        "model.qk_norm_scope": lambda: tuple(QK_NORM_SCOPES),
        "model.linear_conv_source": lambda: tuple(CONV_SOURCES),
        "model.linear_gate": lambda: tuple(GATES),
        "model.norm": lambda: tuple(norm_names()),
        "model.placement": lambda: tuple(PLACEMENTS),
        "model.residual_scale": lambda: RESIDUAL_SCALES,
        "model.embed_scale": lambda: EMBED_SCALES,
        "train.eval_sample": lambda: EVAL_SAMPLES,
        "train.precision": lambda: PRECISIONS,
        "train.compile": lambda: ("auto", "true", "false"),
        "train.stack": lambda: STACKS,
        "optim.name": lambda: OPTIMIZERS,
        "train.track": lambda: TRACKERS,
        "train.clip": lambda: CLIPS,
    }


def key_range(key: str) -> Range | None:
    """The numeric range validation checks for ``key``: RANGES, else the attention kind that owns it."""
    if key in RANGES:
        return RANGES[key]
    if key.startswith("model."):
        from normlab.attention.registry import _REGISTRY

        for cls in _REGISTRY.values():
            if key[len("model."):] in cls.ranges:
                return cls.ranges[key[len("model."):]]
    return None


def _fields(cls: type = RunConfig, prefix: str = "") -> dict[str, tuple[Any, Any]]:
    """``key -> (annotation, default)`` of every leaf field."""
    out: dict[str, tuple[Any, Any]] = {}
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            out.update(_fields(tp, f"{prefix}{f.name}."))
        else:
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
            out[f"{prefix}{f.name}"] = (tp, default)
    return out


def _get(cfg: RunConfig, key: str) -> Any:
    node: Any = cfg
    for part in key.split("."):
        node = getattr(node, part)
    return node


def describe_keys(cfg: RunConfig | None = None) -> list[dict[str, Any]]:
    """One row per config key, in config order: ``key``, ``value`` (in ``cfg``; the default without one),
    ``type``, ``default``, ``allowed`` (text) with ``range`` (``{lo, hi, lo_open, hi_open, integer}``) or
    ``choices``, and ``description``."""
    choices = _choices()
    fields = _fields()
    rows = []
    for key in _all_keys():
        tp, default = fields[key]
        rng = key_range(key)
        row: dict[str, Any] = {"key": key, "value": _get(cfg, key) if cfg is not None else default,
                               "type": "mapping" if typing.get_origin(tp) is dict else _type_name(tp),
                               "default": default}
        nullable = type(None) in typing.get_args(tp)
        if key in choices:
            row["choices"] = list(choices[key]())
            many = "a list of any of " if typing.get_origin(tp) is list else "one of "
            row["allowed"] = many + ", ".join(row["choices"]) + (" or null" if nullable else "")
        elif rng is not None:
            row["range"] = dataclasses.asdict(rng)
            row["allowed"] = rng.text() + (" or null" if nullable else "")
        elif tp is bool or typing.get_args(tp) == (bool, type(None)):
            row["allowed"] = "true or false" + (" or null" if nullable else "")
        else:
            row["allowed"] = "any " + row["type"]
        row["description"] = KEY_HELP.get(key, "")
        rows.append(row)
    return rows
