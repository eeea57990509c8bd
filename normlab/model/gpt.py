"""Decoder-only GPT (nanoGPT shape): embeddings -> (embedding norm) -> blocks (with injected norms) -> final norm
-> LM head.

Reads top to bottom: ``build_model(cfg)`` (model/build.py) builds it, ``init_weights`` initialises it,
``GPT.forward`` runs it, ``GPT.init_state`` / ``GPT.step`` run it incrementally (generation). Which norms exist is
decided by the placement (``normlab.model.placements``; docs/placements.md); which attention, by
``model.attention`` (docs/attention.md).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from normlab.attention import AttentionState, RotaryEmbedding, build_attention
from normlab.attention.dropout import Dropout
from normlab.model.blocks import MLP, Block
from normlab.model.config import ModelConfig
from normlab.model.outputs import apply_output
from normlab.model.placements import (
    block_sites,
    embed_norm_on,
    final_norm_on,
    init_gain,
    layernorm_scale,
    residual_scale,
    skip_scale,
)
from normlab.model.streams import build_connections, get_connection_class, unit
from normlab.norms import build_norm


def softcap(x: torch.Tensor, c: float | None) -> torch.Tensor:
    """Gemma 2 soft capping ``c * tanh(x / c)`` (Gemma Team 2024; any shape); ``c`` None or 0 returns ``x``.

    Bounds every value to ``(-c, c)`` while staying ~identity for ``|x| << c``. The model applies it to its logits
    (``model.logit_softcap``, train and eval); ``normlab.train.losses.lm_loss`` takes it for logits from elsewhere.
    """
    if not c:
        return x
    if c < 0:
        raise ValueError(f"softcap c must be > 0, got {c}")
    return c * torch.tanh(x / c)


class GPT(nn.Module):
    """``idx [B, T] (int64) -> logits [B, T, vocab]``; with ``targets [B, T]`` also the mean cross-entropy."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.width)
        self.embed_scale = embed_scale(cfg)
        self.pos_emb = nn.Embedding(cfg.context, cfg.width) if cfg.positions == "learned" else None
        rope = RotaryEmbedding(cfg.head_dim, cfg.context, cfg.rope_base, cfg.heads) if cfg.positions == "rope" else None
        self.drop = Dropout(cfg.dropout)

        def norm(site: str) -> nn.Module:
            group = site.split("_")[0]  # attn_in -> attn, mlp_post -> mlp, final -> final, embed -> embed
            return build_norm(cfg.norm, cfg.width, eps=cfg.norm_eps, **cfg.norm_kwargs(group))

        self.embed_norm = norm("embed") if embed_norm_on(cfg) else nn.Identity()
        blocks = []
        for l in range(cfg.depth):
            attn = build_attention(cfg, rope)
            mlp = MLP(cfg.width, cfg.mlp_ratio, cfg.activation, bias=cfg.bias, dropout=cfg.dropout,
                      hidden=cfg.mlp_hidden, ngpt=cfg.normalized)
            norms = {site: norm(site) for site in sorted(block_sites(cfg, l))}
            blocks.append(Block(attn, mlp, norms, in_scale=layernorm_scale(cfg, l), res_scale=residual_scale(cfg),
                                skip_scale=skip_scale(cfg), connections=build_connections(cfg, l)))
        conn = get_connection_class(cfg.residual)
        self.streams = cfg.streams if conn is not None and conn.multi_stream else 0  # 0: one stream [B, T, d]
        self.blocks = nn.ModuleList(blocks)
        self.final_norm = norm("final") if final_norm_on(cfg) else nn.Identity()
        self.lm_head = nn.Linear(cfg.width, cfg.vocab_size, bias=cfg.head_bias)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight
        # nGPT's scaled logits s_z [vocab], stored as the authors do: init 1/sqrt(width), used as s_z * sqrt(width)
        self.logit_scale = nn.Parameter(torch.full((cfg.vocab_size,), cfg.width ** -0.5)) if cfg.normalized else None
        init_weights(self, cfg)
        self.after_optimizer_step()  # nGPT: the weights start on the hypersphere

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        logits = self.run(idx)
        if targets is None:
            return logits
        loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))
        return logits, loss

    def run(self, idx: torch.Tensor, state: list[AttentionState] | None = None) -> torch.Tensor:
        """``idx [B, T] -> logits [B, T, vocab]``. With ``state`` (one per block, see ``step``) the tokens continue
        the ``state[0].pos`` tokens already seen; the states are updated in place."""
        B, T = idx.shape
        offset = state[0].pos if state else 0
        if self.pos_emb is not None and offset + T > self.cfg.context:
            raise ValueError(f"sequence length {offset + T} exceeds the learned position table ({self.cfg.context})")
        x = self.tok_emb(idx)
        if self.embed_scale is not None:
            x = x * self.embed_scale
        if self.pos_emb is not None:
            x = x + self.pos_emb(torch.arange(offset, offset + T, device=idx.device))
        x = self.drop(self.embed_norm(x))
        if self.streams:  # hyper-connections: copy into n streams [B, T, n, d]; summed before the final norm
            x = x.unsqueeze(-2).expand(*x.shape[:-1], self.streams, x.shape[-1])
        for l, block in enumerate(self.blocks):
            x = block(x, None if state is None else state[l])
        if self.streams:
            x = x.sum(-2)
        logits = self.lm_head(self.final_norm(x))
        if self.logit_scale is not None:  # nGPT: z = s_z * (W_head h), eq. 23
            logits = logits * (self.logit_scale * math.sqrt(self.cfg.width))
        if self.cfg.logit_softcap is not None:  # Gemma 2 final-logit softcap, train and eval
            logits = softcap(logits, self.cfg.logit_softcap)
        return apply_output(logits, self.cfg.output)  # model.output: softmax (unchanged) or log StableMax

    @torch.no_grad()
    def after_optimizer_step(self) -> None:
        """What the model needs after each optimizer update (the training loop calls it once per step): for nGPT
        (``model.residual: ngpt``; Loshchilov et al. 2025, Sec. 2.6; the authors' ``normalize_matrices``) every
        embedding and matrix renormalised to unit norm along the embedding dimension -- the rows of the readers
        (token embedding, LM head, ``qkv``, MLP ``fc`` / ``gate``: ``[out, d]``) and the columns of the writers
        (attention and MLP ``proj``: ``[d, in]``). Nothing for the other models."""
        if not self.cfg.normalized:
            return
        for name, m in self.named_modules():
            if isinstance(m, nn.Embedding):
                m.weight.copy_(unit(m.weight, 1))
            elif isinstance(m, nn.Linear):
                m.weight.copy_(unit(m.weight, 0 if name.endswith(".proj") else 1))

    def init_state(self, batch_size: int) -> list[AttentionState]:
        """Empty incremental-decoding state for ``batch_size`` sequences: one ``AttentionState`` per block (KV cache
        for softmax / softplus attention, ``(S, z)`` and the conv buffer for linear / nala; filled by ``step``)."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        return [AttentionState() for _ in self.blocks]

    def step(self, idx: torch.Tensor, state: list[AttentionState]) -> tuple[torch.Tensor, list[AttentionState]]:
        """Incremental decoding: ``idx [B, t]`` continues the sequence ``state`` has seen -> ``(logits [B, t, V],
        new state)``. Feeding a sequence in pieces gives the logits of one full forward (same positions); the
        passed ``state`` is left unchanged (shallow copies; tensors are replaced, never modified)."""
        state = [s.copy() for s in state]
        return self.run(idx, state), state

    def num_params(self, non_embedding: bool = False) -> int:
        """Parameter count (tied weights counted once)."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= self.tok_emb.weight.numel()
            if self.pos_emb is not None:
                n -= self.pos_emb.weight.numel()
        return n


def embed_scale(cfg: ModelConfig) -> nn.Parameter | float | None:
    """Multiplier of the token embeddings (``model.embed_scale``): None, the constant ``sqrt(width)``, or a
    learnable scalar ``[1]`` initialised to ``sqrt(width)``; ``model.embed_scale_init`` overrides the value.

    ``auto`` (the default) is what the norm class's ``auto_embed_scale`` says: ``none``, except DyT's LLaMA
    recipe (Zhu et al. 2025, a learnable scalar after the embedding), initialised to ``1 / init_std``: the
    authors' ``sqrt(d)`` with N(0, 0.02) embeddings gives a unit-scale stream (RMS 1.28) at their d = 4096, but
    only 0.16 at d = 64, where DyT's tanh then passes almost no signal (measured: docs/norms.md)."""
    kind = cfg.embed_scale_kind
    if cfg.embed_scale_init is not None:
        value = cfg.embed_scale_init
    elif cfg.embed_scale == "auto":  # unit-RMS embeddings at init: what sqrt(d) * 0.02 gives DyT at d = 4096
        value = 1.0 / cfg.init_std
    else:
        value = math.sqrt(cfg.width)
    if kind == "none":
        return None
    if kind == "fixed":
        return float(value)
    return nn.Parameter(torch.full((1,), float(value)))


def init_weights(model: GPT, cfg: ModelConfig) -> None:
    """The one init function (GPT-2 scheme): N(0, init_std) for linears and embeddings, zero biases, and
    ``init_std / sqrt(2L)`` for the residual-stream writers (attention and MLP output projections).
    Norm parameters keep the values their own constructors give them. With ``activation: selu`` the linears get
    LeCun-normal init ``N(0, 1/fan_in)`` instead (Klambauer et al. 2017, self-normalizing networks).
    DeepNorm (``placement: deepnorm``, Wang et al. 2022) replaces the ``1/sqrt(2L)`` scale by its ``beta =
    (8N)^(-1/4)`` on the weights torchscale scales: every MLP matrix, the attention output projection and the value
    rows of the fused ``qkv`` projection (``N(0, beta * init_std)``; queries and keys keep ``init_std``).
    """
    beta = init_gain(cfg)
    for name, m in model.named_modules():
        if isinstance(m, nn.Linear):
            if cfg.activation == "selu":
                std = 1.0 / math.sqrt(m.in_features)
            elif beta is not None:
                std = cfg.init_std * beta if name.endswith((".mlp.fc", ".mlp.gate", ".proj")) else cfg.init_std
            else:
                std = cfg.init_std / math.sqrt(2 * cfg.depth) if name.endswith(".proj") else cfg.init_std
            nn.init.normal_(m.weight, 0.0, std)
            if beta is not None and cfg.activation != "selu" and name.endswith(".attn.qkv"):
                with torch.no_grad():  # the value third of [q; k; v] (AttentionBase.qkv: rows 2w..3w)
                    m.weight[2 * m.weight.shape[0] // 3:].mul_(beta)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, 0.0, cfg.init_std)
