"""FLOPs per token of a model as built: the analytic count behind equal-compute comparisons.

The model a config describes is built on the ``meta`` device (no memory, no arithmetic) and run once on one
sequence of ``context`` tokens with forward hooks; each module contributes what its own class says it costs:

- ``nn.Linear``: ``2 * in * out`` per row (the ``2 m n k`` of a matmul; a bias add is not counted, as in
  ``torch.utils.flop_counter``); ``nn.Conv1d``: ``2 * K * in / groups`` per output element;
- an attention kind: its ``mixing_flops(t_q, t_k)`` (scores and values, or the chunked prefix sums of kernel
  attention, and their element-wise work; declared on the class, normlab.attention);
- a registered norm: its class's ``flops_per_element`` per input element, plus one each for ``weight`` and
  ``bias`` when present (normlab.norms.registry); torch's ``nn.LayerNorm`` (nala's output norm) as LayerNorm;
- a residual-stream connection (hyper-connections, mHC; normlab.model.streams): its ``flops_per_token()`` (the
  stream mixing and dynamic-map matmuls, the depth connection's multiply, the constraints), and the reduction of
  the ``n`` streams before the final norm (``(n - 1) d`` adds per token); nGPT's hypersphere update, scaled q/k
  (in the attention's ``mixing_flops``), ``s_u`` / ``s_v`` and ``s_z`` (one multiply per element);
- the MLP activation (``ACTIVATION_FLOPS`` per hidden element), the two residual additions per block (of every
  stream: ``2 n d`` per token with ``n`` streams), the logit softcap, and the loss (log-softmax and pick:
  ``3 * vocab`` per token, training only).

Training FLOPs are ``3 x`` the forward (the backward pass costs about twice the forward; Kaplan et al. 2020,
"Scaling Laws for Neural Language Models", Sec. 2.1, whose ``C = 6 N`` per token this reproduces for the weight
matmuls). Attention counts the full ``T x T`` matrix the dense kernels compute (causal FlashAttention skips about
half of it). Not counted: embedding lookups, dropout, bias additions, optimizer updates. One FLOP is one add,
multiply, divide or transcendental function of one element.

``torch.utils.flop_counter.FlopCounterMode`` counts only matmuls and convolutions (tests/model/test_flops.py checks the
``matmul`` + ``attention`` parts against it); on CPU it does not count the fused SDPA kernel
(``_scaled_dot_product_flash_attention_for_cpu`` has no formula registered), so softmax attention is compared
there on its explicit path (a score softcap).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

from normlab.model.blocks import MLP, Block
from normlab.model.build import build_model
from normlab.model.config import ModelConfig

ACTIVATION_FLOPS = {"gelu": 8, "gelu_tanh": 8, "swiglu": 5, "selu": 3}
"""Forward FLOPs per MLP hidden element: GELU ``0.5 x (1 + erf(x / sqrt 2))`` (tanh form: about as many),
SwiGLU ``silu(a) * b`` (sigmoid, multiply, gate multiply), SELU (exp, multiply, select)."""
LOSS_FLOPS_PER_LOGIT = 3  # log-softmax: max/subtract, exp, sum (the pick and the log: per token, not counted)
TORCH_NORM_FLOPS = {nn.LayerNorm: 5}  # torch's own norm classes a kind may hold (nala's out_norm)


@dataclass
class FlopCount:
    """Forward FLOPs per token of one model at one context, by part; ``training`` = 3 x forward + loss."""

    context: int
    matmul: float = 0.0  # linear layers and convolutions
    attention: float = 0.0  # token mixing matmuls (scores and values; kernel attention's prefix sums)
    norms: float = 0.0  # every normalization module, QK-norm included
    elementwise: float = 0.0  # activations, softmax / kernel element-wise work, residual adds, softcaps, RoPE
    loss: float = 0.0  # the cross-entropy over the vocabulary (training only)
    not_counted: list[str] = field(default_factory=list)  # modules whose class declares no cost

    @property
    def forward(self) -> float:
        return self.matmul + self.attention + self.norms + self.elementwise

    @property
    def training(self) -> float:
        return 3.0 * (self.forward + self.loss)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "forward": self.forward, "training": self.training}


def count_flops(cfg: ModelConfig, context: int | None = None) -> FlopCount:
    """FLOPs per token of the model ``cfg`` builds, for sequences of ``context`` tokens (default ``cfg.context``).

    Builds the model on the ``meta`` device and runs ``[1, context]`` tokens through it with hooks (module
    docstring). Each part is the total over the sequence divided by ``context``."""
    T = int(context or cfg.context)
    count = FlopCount(context=T)
    with torch.device("meta"):
        model = build_model(cfg).eval()  # eval mode: no batch-statistic updates, no data-dependent branches
    hooks = [m.register_forward_hook(_hook(m, count)) for m in model.modules()]
    for m in model.modules():  # a norm's cost is its class's declaration: skip its arithmetic (and any branch on a
        if hasattr(type(m), "flops_per_element"):  # statistic, which meta tensors cannot take); shape unchanged
            m.forward = _passthrough
    try:
        with torch.no_grad():
            logits = model(torch.zeros(1, T, dtype=torch.long, device="meta"))
    finally:
        for h in hooks:
            h.remove()
    if cfg.logit_softcap is not None:
        count.elementwise += 3 * logits.numel()  # divide, tanh, multiply
    if getattr(model, "logit_scale", None) is not None:  # nGPT's s_z
        count.elementwise += float(logits.numel())
    if getattr(model, "streams", 0):  # summing the n streams before the final norm
        count.elementwise += float((model.streams - 1) * cfg.width * T)
    count.loss += LOSS_FLOPS_PER_LOGIT * logits.numel()
    for part in ("matmul", "attention", "norms", "elementwise", "loss"):
        setattr(count, part, getattr(count, part) / T)
    count.not_counted = sorted(set(count.not_counted))
    return count


def _hook(module: nn.Module, count: FlopCount):
    """The forward hook that adds ``module``'s own cost (its children count themselves)."""

    def linear(m, inp, out):
        count.matmul += 2.0 * m.in_features * m.out_features * (out.numel() // m.out_features)

    def conv(m, inp, out):
        count.matmul += 2.0 * out.numel() * (m.in_channels // m.groups) * m.kernel_size[0]

    def norm(m, inp, out):
        per = _norm_flops(m)
        affine = (getattr(m, "weight", None) is not None) + (getattr(m, "bias", None) is not None)
        count.norms += float(inp[0].numel() * (per + affine))

    def attention(m, inp, out):
        B, T = inp[0].shape[:2]
        cost = m.mixing_flops(T, T)
        count.attention += B * cost["matmul"]
        count.elementwise += B * cost["elementwise"]

    def mlp(m, inp, out):
        hidden = m.fc.out_features * (inp[0].numel() // m.fc.in_features)
        count.elementwise += float(ACTIVATION_FLOPS[m.activation] * hidden)
        if getattr(m, "suv", None) is not None:  # nGPT's s_u / s_v: one multiply per pre-activation
            count.elementwise += float(m.suv.numel() * (inp[0].numel() // m.fc.in_features))

    def connection(m, inp, out):
        cost = m.flops_per_token()
        tokens = inp[0].numel() // (m.streams * m.dim)  # nGPT's one stream: streams = 1
        count.matmul += tokens * cost["matmul"]
        count.elementwise += tokens * cost["elementwise"]

    def block(m, inp, out):
        count.elementwise += 2.0 * inp[0].numel()  # the two residual additions

    def missing(m, inp, out):
        count.not_counted.append(type(m).__name__)

    if isinstance(module, nn.Linear):
        return linear
    if isinstance(module, nn.Conv1d):
        return conv
    if hasattr(module, "mixing_flops"):
        return attention
    if isinstance(module, MLP):
        return mlp
    if hasattr(module, "flops_per_token") and hasattr(module, "depth"):
        return connection
    if isinstance(module, Block):
        return block
    if _norm_flops(module) is not None:
        return norm
    if hasattr(module, "flops_per_element"):  # a registered norm that declares no cost
        return missing
    return lambda m, inp, out: None


def _passthrough(x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    return x


def _norm_flops(module: nn.Module) -> int | None:
    """Forward FLOPs per element of a norm module (its class's ``flops_per_element``), None when not a norm or
    undeclared."""
    for cls, per in TORCH_NORM_FLOPS.items():
        if type(module) is cls:
            return per
    return getattr(type(module), "flops_per_element", None)


def flops_summary(cfg: ModelConfig, tokens_seen: int, elapsed_s: float) -> dict[str, Any]:
    """The summary.json fields of a run: ``flops_per_token`` (training, 3 x forward + loss), the forward count by
    part (``flops_detail``) and ``wall_s_per_token`` (the run's wall time, evaluations included, over its training
    tokens; None before the first step)."""
    count = count_flops(cfg)
    return {"flops_per_token": count.training, "flops_detail": count.as_dict(),
            "wall_s_per_token": elapsed_s / tokens_seen if tokens_seen else None}
