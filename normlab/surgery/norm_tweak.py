"""Norm Tweaking (Li, Li, Zhang & Chu 2024, "Norm Tweaking: High-performance Low-bit Quantization of Large Language
Models", AAAI 2024, arXiv:2309.02784): after quantizing, adjust only the normalization parameters of each block so
that the quantized block's output *distribution* matches the float block's, block by block.

For block ``l`` (in order), with ``X`` the quantized model's input to the block on the calibration samples (so each
block corrects what the earlier, already tweaked, blocks hand it), the float target is ``F_l(X)`` and the loss the
paper's channel-wise distribution loss over the tokens of a sample::

    L_dist = 1/C sum_c ( |mu_f,c - mu_q,c| + |var_f,c - var_q,c| )      (mean and variance of channel c)

minimised over the block's norm parameters only (every occupied norm site's ``weight`` / ``bias``; all other
weights frozen) with Adam, one calibration sample per step, ``epochs`` passes (the paper: one pass over its
calibration set, per-layer learning rates found by grid search around 1e-5 for 7B-176B models).

Deviations, stated: calibration samples are windows of the run's *training split* (the paper generates them with
the model itself, "self-generated data"), 32 windows by default instead of 128 of 2,048 tokens; RTN / HIGGS grids
instead of GPTQ as the base quantizer; the learning rate default (1e-3) is for our small, fast-moving models, not
the paper's.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from normlab.model.placements import SITES

TWEAK_LR = 1e-3
TWEAK_EPOCHS = 1


def dist_loss(f: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Channel-wise distribution loss of ``f, q [..., C]``: mean over channels of ``|mu_f - mu_q| + |var_f -
    var_q|``, the statistics over all leading (token) positions."""
    f2, q2 = f.reshape(-1, f.shape[-1]), q.reshape(-1, q.shape[-1])
    mf, mq = f2.mean(0), q2.mean(0)
    vf, vq = f2.var(0, unbiased=False), q2.var(0, unbiased=False)
    return ((mf - mq).abs() + (vf - vq).abs()).mean()


def block_norm_params(block: nn.Module) -> list[nn.Parameter]:
    """The parameters of a block's occupied norm sites (``attn_in``, ``mlp_in``, ``*_out``, ``*_post``)."""
    out: list[nn.Parameter] = []
    for site in SITES:
        m = getattr(block, site, None)
        if m is not None and not isinstance(m, nn.Identity):
            out += list(m.parameters())
    return out


@torch.no_grad()
def block_input(model: nn.Module, idx: torch.Tensor) -> torch.Tensor:
    """The residual stream entering block 0 for ``idx [N, T]`` (eval mode)."""
    seen: dict[str, torch.Tensor] = {}
    h = model.blocks[0].register_forward_pre_hook(lambda _m, args: seen.__setitem__("x", args[0].detach()))
    try:
        model(idx)
    finally:
        h.remove()
    return seen["x"]


@torch.no_grad()
def output_error(ref: nn.Module, model: nn.Module, idx: torch.Tensor) -> float:
    """Relative squared error of the output logits over ``idx [N, T]``: ``sum ||c(z_ref) - c(z)||^2 / sum
    ||c(z_ref)||^2`` with ``c`` centring each position's logits over the vocabulary (the shift softmax ignores)."""
    a, b = ref(idx).double(), model(idx).double()
    a, b = a - a.mean(-1, keepdim=True), b - b.mean(-1, keepdim=True)
    return float((a - b).pow(2).sum() / a.pow(2).sum())


@torch.no_grad()
def _total(block: nn.Module, x: torch.Tensor, target: torch.Tensor) -> float:
    """Mean ``L_dist`` over the samples of ``x [N, T, d]`` (one sample at a time, as the tweak steps)."""
    return float(sum(dist_loss(target[i], block(x[i:i + 1])[0]) for i in range(len(x))) / len(x))


def norm_tweak(float_model: nn.Module, q_model: nn.Module, calib: torch.Tensor, *, lr: float = TWEAK_LR,
               epochs: int = TWEAK_EPOCHS) -> dict[str, Any]:
    """Tweak ``q_model``'s block norm parameters in place against ``float_model`` on ``calib [N, T]`` (token ids).
    Returns ``{blocks: [{block, params, loss_before, loss_after}], lr, epochs, samples}``."""
    float_model.eval()
    q_model.eval()
    x = block_input(q_model, calib)  # embeddings are not quantized: the same for both models
    report = []
    for l, (bf, bq) in enumerate(zip(float_model.blocks, q_model.blocks)):
        with torch.no_grad():
            target = bf(x)
        params = block_norm_params(bq)
        keep = {id(p): p.requires_grad for p in bq.parameters()}
        for p in bq.parameters():
            p.requires_grad_(False)
        for p in params:
            p.requires_grad_(True)

        before = _total(bq, x, target)
        if params:
            opt = torch.optim.Adam(params, lr=lr)
            for _ in range(epochs):
                for i in range(len(x)):
                    loss = dist_loss(target[i], bq(x[i:i + 1])[0])
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    opt.step()
        for p in bq.parameters():
            p.requires_grad_(keep[id(p)])
        report.append({"block": l, "params": sum(p.numel() for p in params), "loss_before": before,
                       "loss_after": _total(bq, x, target)})
        with torch.no_grad():
            x = bq(x)
    return {"blocks": report, "lr": lr, "epochs": epochs, "samples": int(calib.shape[0])}
