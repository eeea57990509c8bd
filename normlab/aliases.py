"""Names other tools use for normlab's config keys: nanoGPT (``n_layer``, ``block_size``, ``learning_rate``, ...),
Hugging Face transformers configs and ``TrainingArguments`` (``hidden_size``, ``num_hidden_layers``,
``max_position_embeddings``, ...) and common paper/code spellings (``d_model``, ``n_heads``, ``seq_len``, ...).

An unknown key whose last component is in ``KEY_ALIASES`` gets "did you mean 'model.depth'?" (an alias table,
not edit distance: ``n_layer`` is nowhere near ``depth`` as a string); nothing is renamed silently, so a config
always says what normlab ran. Other unknown keys fall back to the closest spelling (``normlab.errors.did_you_mean``).
"""

from __future__ import annotations

from collections.abc import Iterable

from normlab.errors import did_you_mean

# other tool's name -> (normlab key, note when the meaning differs)
KEY_ALIASES: dict[str, tuple[str, str]] = {
    # depth / width / heads / context
    "n_layer": ("model.depth", ""), "n_layers": ("model.depth", ""), "num_layers": ("model.depth", ""),
    "num_hidden_layers": ("model.depth", ""), "layers": ("model.depth", ""),
    "n_embd": ("model.width", ""), "hidden_size": ("model.width", ""), "d_model": ("model.width", ""),
    "dim": ("model.width", ""), "embed_dim": ("model.width", ""), "n_embed": ("model.width", ""),
    "n_head": ("model.heads", ""), "n_heads": ("model.heads", ""), "num_heads": ("model.heads", ""),
    "num_attention_heads": ("model.heads", ""),
    "block_size": ("model.context", ""), "max_position_embeddings": ("model.context", ""),
    "n_positions": ("model.context", ""), "n_ctx": ("model.context", ""), "seq_len": ("model.context", ""),
    "seq_length": ("model.context", ""), "max_seq_len": ("model.context", ""), "context_length": ("model.context", ""),
    "intermediate_size": ("model.mlp_ratio", "normlab takes the ratio intermediate_size / width"),
    "d_ff": ("model.mlp_ratio", "normlab takes the ratio d_ff / width"),
    "ffn_dim": ("model.mlp_ratio", "normlab takes the ratio ffn_dim / width"),
    "hidden_act": ("model.activation", ""), "activation_function": ("model.activation", ""),
    "rms_norm_eps": ("model.norm_eps", ""), "layer_norm_eps": ("model.norm_eps", ""),
    "layer_norm_epsilon": ("model.norm_eps", ""), "norm_epsilon": ("model.norm_eps", ""),
    "norm_type": ("model.norm", ""), "normalization": ("model.norm", ""),
    "rope_theta": ("model.rope_base", ""), "rotary_emb_base": ("model.rope_base", ""),
    "tie_word_embeddings": ("model.tie_embeddings", ""), "initializer_range": ("model.init_std", ""),
    "resid_pdrop": ("model.dropout", "one dropout rate for all sites"),
    "embd_pdrop": ("model.dropout", "one dropout rate for all sites"),
    "attn_pdrop": ("model.dropout", "one dropout rate for all sites"),
    "hidden_dropout": ("model.dropout", "one dropout rate for all sites"),
    "attention_dropout": ("model.dropout", "one dropout rate for all sites"),
    "final_logit_softcapping": ("model.logit_softcap", ""), "attn_logit_softcapping": ("model.attn_softcap", ""),
    # training
    "learning_rate": ("train.lr", ""), "max_lr": ("train.lr", ""),
    "min_lr": ("train.min_lr_ratio", "normlab takes the ratio min_lr / lr"),
    "max_iters": ("train.steps", ""), "max_steps": ("train.steps", ""), "lr_decay_iters": ("train.steps", ""),
    "num_steps": ("train.steps", ""), "total_steps": ("train.steps", ""),
    "warmup_iters": ("train.warmup_steps", ""),
    "gradient_accumulation_steps": ("train.grad_accum", ""),
    "per_device_train_batch_size": ("train.batch_size", ""), "micro_batch_size": ("train.batch_size", ""),
    "max_grad_norm": ("train.grad_clip", ""), "clip_grad": ("train.grad_clip", ""),
    "adam_beta1": ("train.beta1", ""), "adam_beta2": ("train.beta2", ""),
    "eval_interval": ("train.eval_every", ""), "eval_steps": ("train.eval_every", ""),
    "eval_iters": ("train.eval_batches", ""), "log_interval": ("train.log_every", ""),
    "logging_steps": ("train.log_every", ""), "save_steps": ("train.checkpoint_every", ""),
    "dtype": ("train.precision", ""), "optimizer": ("optim.name", ""), "optim": ("optim.name", ""),
    "dataset": ("data.source", ""), "random_seed": ("seed", ""),
}


def suggest_key(key: str, valid: Iterable[str]) -> str:
    """`` (did you mean 'model.depth'?)`` for an unknown config key: the alias table first (on the key's last
    component, so ``n_layer``, ``model.n_layer`` and ``train.n_layer`` all resolve), else the closest spelling."""
    leaf = key.rsplit(".", 1)[-1]
    if leaf in KEY_ALIASES:
        target, note = KEY_ALIASES[leaf]
        return f" (did you mean '{target}'? '{leaf}' is what other tools call it{'; ' + note if note else ''})"
    return did_you_mean(key, valid)
