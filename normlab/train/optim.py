"""Optimizers with explicit parameter groups (nanoGPT ``configure_optimizers``) and norm-aware optimization.

Weight decay applies to matrices of linear layers only by default; norm gains/biases, all biases, residual-branch
scalars (``*_res_scale``) and embeddings are not decayed (switches ``train.wd_norm`` and ``train.wd_embeddings``).
The grouping is returned so the run can log it (``param_groups.json``).

Optimizers (``optim.name``): ``adamw`` (torch), ``adamp`` / ``sgdp`` (Heo et al. 2021, "AdamP: Slowing Down the
Slowdown for Momentum Optimizers on Scale-invariant Weights"; the authors' ``adamp`` package), which remove the
radial component of the update of weights they detect as scale-invariant.

Norm-aware pieces (docs/optim.md):

- :func:`weights_feeding_norms`: the weight matrices whose output reaches a normalization layer before anything
  else reads it -- the weights whose scale a norm divides out.
- :class:`NormalizeAndProject` (Lyle et al. 2024, "Normalization and effective learning rates in reinforcement
  learning"): after each step, rescale each of those weights to its Frobenius norm at initialisation.
- :class:`EffectiveLR`: per-step ``||dW|| / ||W||`` of the same weights (the effective step size AdamP and NaP
  are about).
- :func:`orthograd_` (``optim.perp_grad``; perp-Grad of Prieto et al. 2025, "Grokking at the Edge of Numerical
  Stability"): the gradient of every parameter without its component along the parameter, rescaled to the
  original gradient norm, applied as a step pre-hook of any of the optimizers above.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.optim.optimizer as optimizer_hooks
from torch import nn
from torch.optim.adam import adam

from normlab.config import OptimConfig, TrainConfig
from normlab.errors import NormlabError
from normlab.norms.registry import _REGISTRY


def is_norm_module(m: nn.Module) -> bool:
    """True for any registered hidden-state norm (and torch's own norm layers)."""
    return isinstance(m, tuple(_REGISTRY.values()) + (nn.LayerNorm, nn.RMSNorm))


def param_groups(model: nn.Module, tcfg: TrainConfig) -> tuple[list[dict], dict[str, list[str]]]:
    """Split parameters into decay / no-decay groups. Returns (torch param groups, {group: [names]})."""
    kinds: dict[str, str] = {}
    for mname, m in model.named_modules():
        for pname, p in m.named_parameters(recurse=False):
            full = f"{mname}.{pname}" if mname else pname
            if is_norm_module(m):
                kinds[full] = "norm"
            elif isinstance(m, nn.Embedding):
                kinds[full] = "embedding"
            elif pname.endswith("res_scale") or getattr(m, "no_weight_decay", False):
                kinds[full] = "scale"  # ReZero / SkipInit branch scalars; hyper-connection maps (model.streams)
            elif p.ndim < 2:
                kinds[full] = "bias"
            else:
                kinds[full] = "matrix"
    decay_kinds = {"matrix"} | ({"norm"} if tcfg.wd_norm else set()) | ({"embedding"} if tcfg.wd_embeddings else set())
    named = dict(model.named_parameters())  # deduplicates tied weights
    decay = [n for n in named if kinds[n] in decay_kinds]
    no_decay = [n for n in named if kinds[n] not in decay_kinds]
    groups = [
        {"params": [named[n] for n in decay], "weight_decay": tcfg.weight_decay},
        {"params": [named[n] for n in no_decay], "weight_decay": 0.0},
    ]
    return groups, {"decay": decay, "no_decay": no_decay}


def build_optimizer(model: nn.Module, tcfg: TrainConfig,
                    ocfg: OptimConfig | None = None) -> tuple[torch.optim.Optimizer, dict[str, list[str]]]:
    """The optimizer named by ``ocfg.name`` over the explicit groups.

    Returns the optimizer and, for logging, ``{decay, no_decay, feeds_norm}`` (parameter names; ``feeds_norm`` is
    :func:`weights_feeding_norms`, the set NaP projects and ``eff_lr`` records).
    """
    ocfg = ocfg or OptimConfig()
    groups, names = param_groups(model, tcfg)
    betas = (tcfg.beta1, tcfg.beta2)
    opt: torch.optim.Optimizer
    if ocfg.name == "adamw":
        on_cuda = all(p.is_cuda for g in groups for p in g["params"]) and any(g["params"] for g in groups)
        opt = torch.optim.AdamW(groups, lr=tcfg.lr, betas=betas, eps=1e-8, **adamw_kernel(on_cuda))
    elif ocfg.name == "adamp":
        AdamP = _adamp_class("AdamP")
        opt = AdamP(groups, lr=tcfg.lr, betas=betas, eps=1e-8, delta=ocfg.delta, wd_ratio=ocfg.wd_ratio,
                    nesterov=False)
        opt.register_step_pre_hook(_python_int_steps)
    elif ocfg.name == "sgdp":
        SGDP = _adamp_class("SGDP")
        opt = SGDP(groups, lr=tcfg.lr, momentum=ocfg.momentum, dampening=0, nesterov=False, eps=1e-8,
                   delta=ocfg.delta, wd_ratio=ocfg.wd_ratio)
    else:  # OptimConfig.validate() lists the allowed names
        raise NormlabError(f"unknown optim.name '{ocfg.name}'")
    if ocfg.perp_grad:  # after clipping (the loop clips before opt.step), as the authors' OrthoGrad wrapper
        opt.register_step_pre_hook(_orthograd_hook)
    names["feeds_norm"] = list(weights_feeding_norms(model))
    return opt, names


def adamw_kernel(on_cuda: bool) -> dict[str, bool]:
    """AdamW's implementation: the fused kernel (one launch for every tensor) for parameters on a CUDA device, the
    ``foreach`` (multi-tensor) one elsewhere, as the CPU runs always used. Both compute the same element-wise update
    (Loshchilov & Hutter 2019, "Decoupled Weight Decay Regularization"), to fp32 round-off."""
    return {"fused": True} if on_cuda else {"foreach": True}


ORTHO_EPS = 1e-30  # as the authors' orthograd.py (LucasPrietoAl/grokking-at-the-edge-of-numerical-stability)


@torch.no_grad()
def orthograd_(params: Any) -> None:
    """perp-Grad in place (Prieto et al. 2025, arXiv:2501.04697, Section 6; the authors' ``OrthoGrad``): for every
    parameter ``w`` (flattened, any shape) with gradient ``g``::

        g_perp = g - (w . g / (w . w + 1e-30)) w        # remove the naive-loss-minimisation direction
        g     <- g_perp * ||g|| / (||g_perp|| + 1e-30)  # keep the gradient's norm

    The first line is the paper's definition; the rescaling is what their released optimizer does. Parameters
    without a gradient are skipped; computed in float32 (float64 for float64 gradients), written back in the
    gradient's dtype."""
    for p in params:
        if p.grad is None:
            continue
        work = torch.float64 if p.grad.dtype == torch.float64 else torch.float32
        w, g = p.detach().reshape(-1).to(work), p.grad.reshape(-1).to(work)
        g_perp = g - (torch.dot(w, g) / (torch.dot(w, w) + ORTHO_EPS)) * w
        g_perp = g_perp * (g.norm() / (g_perp.norm() + ORTHO_EPS))
        p.grad.copy_(g_perp.view_as(p.grad).to(p.grad.dtype))


def _orthograd_hook(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    """Step pre-hook: :func:`orthograd_` over every parameter the optimizer updates."""
    orthograd_(p for g in opt.param_groups for p in g["params"])


def _adamp_class(name: str) -> type[torch.optim.Optimizer]:
    """``AdamP`` or ``SGDP`` from the authors' package (imported only when chosen)."""
    try:
        import adamp
    except ImportError:
        raise NormlabError(
            f"optim.name '{name.lower()}' needs the adamp package: pip install 'adamp>=0.3,<0.4'"
        ) from None
    return getattr(adamp, name)


def step_together(opts: list[torch.optim.Optimizer]) -> bool:
    """One AdamW update of several optimizers at once (a stacked group's members, normlab.train.stacked): every
    parameter group of every optimizer is bucketed by its hyperparameters (learning rate, betas, eps, weight decay,
    kernel), and each bucket is one call of torch's own functional update (``torch.optim.adam.adam``, the call
    ``AdamW.step`` makes per group, after the same ``_init_group``), so the members that share a learning rate
    share a fused (CUDA) or multi-tensor (CPU) launch instead of one ``step()`` each. The update is element-wise,
    so a parameter ends bit for bit where its own ``step()`` puts it. Returns False, having changed nothing, unless
    every optimizer is a plain ``torch.optim.AdamW`` (no AMSGrad, maximize, capturable or differentiable groups,
    no step hooks: perp-Grad's and AdamP's hooks, SGDP, fall back to each ``step()``)."""

    if not opts or optimizer_hooks._global_optimizer_pre_hooks or optimizer_hooks._global_optimizer_post_hooks:
        return False
    for o in opts:
        if (type(o) is not torch.optim.AdamW or o._optimizer_step_pre_hooks or o._optimizer_step_post_hooks
                or getattr(o, "grad_scale", None) is not None or getattr(o, "found_inf", None) is not None):
            return False
        if any(g["amsgrad"] or g["maximize"] or g["capturable"] or g["differentiable"]
               or isinstance(g["lr"], torch.Tensor) for g in o.param_groups):
            return False
    buckets: dict[tuple, tuple[list[torch.Tensor], ...]] = {}
    with torch.no_grad():
        for o in opts:
            for g in o.param_groups:
                lists: tuple[list[torch.Tensor], ...] = ([], [], [], [], [], [])
                has_complex = o._init_group(g, *lists)  # the state of a first step, as step() creates it
                if has_complex:
                    return False  # nothing updated yet: every check comes before the first update
                key = (g["lr"], *g["betas"], g["eps"], g["weight_decay"], g["foreach"], g["fused"],
                       g["decoupled_weight_decay"])
                bucket = buckets.setdefault(key, ([], [], [], [], [], []))
                for whole, part in zip(bucket, lists):
                    whole.extend(part)
        for (lr, beta1, beta2, eps, wd, foreach, fused, decoupled), lists in buckets.items():
            adam(*lists, foreach=foreach, fused=fused, decoupled_weight_decay=decoupled,
                                  amsgrad=False, beta1=beta1, beta2=beta2, lr=lr, weight_decay=wd, eps=eps,
                                  maximize=False)
    return True


def _python_int_steps(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    """AdamP keeps ``state['step']`` as a Python int and computes its bias corrections in float64 from it.

    Checkpoints store optimizer state as tensors; a resumed 0-dim int64 tensor would make ``beta ** step`` a
    float32 tensor and break bit-exact resume. This step pre-hook turns such tensors back into ints.
    """
    for state in opt.state.values():
        step = state.get("step")
        if torch.is_tensor(step):
            state["step"] = int(step.item())


def _is_norm_site(m: nn.Module | None) -> bool:
    """A norm site holds a norm when it is not ``nn.Identity`` (the placement left it empty)."""
    return m is not None and not isinstance(m, nn.Identity)


def weights_feeding_norms(model: nn.Module) -> dict[str, nn.Parameter]:
    """Weight matrices whose output is read by a normalization layer and by nothing else.

    A weight ``W`` "feeds a norm" when every path from its output reaches a norm before any linear layer, the LM
    head or the sublayers read it (residual additions are followed; dropout is ignored). So:

    - the residual-stream writers ``blocks[i].attn.proj.weight`` / ``blocks[i].mlp.proj.weight``:
      *Peri-LN / output* -- they feed the block's output norm directly (each one exactly scale-invariant);
      *Post-LN* -- they feed the post norm ``Norm(x + F(x))``; *Pre-LN* -- they feed every later input norm and the
      final norm (with ``model.final_norm: false`` the LM head reads the raw stream, so none qualifies);
      *Mix-LN* -- per block, as its Post-LN or Pre-LN part.
    - the embeddings ``tok_emb.weight`` / ``pos_emb.weight``: when the embedding norm is on, or in Pre-LN where
      block 0's input norm reads them; not in Post-LN or ``output`` (block 0's sublayer reads them raw), and
      ``tok_emb.weight`` never when tied to the LM head (``model.tie_embeddings``: the logits scale with it).

    In Pre-/Post-LN a single writer is not scale-invariant on its own (the stream sums all writers); the whole set
    is. Norm gains, biases and the query/key/value and MLP input matrices are never included. A "norm" is any
    site that is not ``nn.Identity`` (so ``identity``/DyT sites count: NaP then is only a norm constraint).
    Returns ``{parameter name: parameter}`` in ``model.named_parameters()`` order.
    """
    fed: set[int] = set()  # ids of weights some norm reads
    raw: set[int] = set()  # ids of weights something other than a norm reads
    pending: list[nn.Parameter] = []  # writers whose (un-normalised) output is in the residual stream now

    embeddings = [model.tok_emb.weight] + ([model.pos_emb.weight] if model.pos_emb is not None else [])
    if model.lm_head.weight is model.tok_emb.weight:
        raw.add(id(model.tok_emb.weight))
    if _is_norm_site(getattr(model, "embed_norm", None)):
        fed.update(id(w) for w in embeddings)
    else:
        pending.extend(embeddings)
    for blk in model.blocks:
        for norm_in, sub, norm_out, norm_post in ((blk.attn_in, blk.attn, blk.attn_out, blk.attn_post),
                                                  (blk.mlp_in, blk.mlp, blk.mlp_out, blk.mlp_post)):
            (fed if _is_norm_site(norm_in) else raw).update(id(w) for w in pending)  # the sublayer reads the stream
            if _is_norm_site(norm_out):
                fed.add(id(sub.proj.weight))
            else:
                pending.append(sub.proj.weight)
            if _is_norm_site(norm_post):  # x = Norm(x + h): the stream is replaced by a norm's output
                fed.update(id(w) for w in pending)
                pending = []
    (fed if _is_norm_site(model.final_norm) else raw).update(id(w) for w in pending)
    return {n: p for n, p in model.named_parameters() if id(p) in fed and id(p) not in raw}


class NormalizeAndProject:
    """Normalize-and-Project (NaP; Lyle et al. 2024, "Normalization and effective learning rates in reinforcement
    learning", arXiv:2407.01800): after every optimizer step, rescale each weight that feeds a norm
    (:func:`weights_feeding_norms`) back to its Frobenius norm at initialisation, ``W <- W * ||W_0|| / ||W||``, so
    its effective learning rate stays constant instead of decaying as ``||W||`` grows.

    Build it right after ``build_model`` under the run's seed, before loading a checkpoint: the target norms are
    then those of the seeded initialisation, which a resumed run rebuilds exactly (they are also recorded in the
    checkpoint's ``state.json`` as ``nap_init_norms`` and checked on resume by :meth:`check`).
    """

    def __init__(self, model: nn.Module):
        self.params = weights_feeding_norms(model)
        self.init_norms = {n: p.detach().norm() for n, p in self.params.items()}  # float32 0-dim tensors

    @torch.no_grad()
    def project(self) -> None:
        """Rescale every tracked weight to its initial Frobenius norm (in place)."""
        for n, p in self.params.items():
            p.mul_(self.init_norms[n] / p.norm())

    def to_json(self) -> dict[str, float]:
        """``{name: initial norm}`` (exact: float32 values are exact Python floats)."""
        return {n: float(v) for n, v in self.init_norms.items()}

    def check(self, recorded: dict[str, float] | None, where: str) -> None:
        """Refuse to resume when the checkpoint's recorded init norms differ from the rebuilt model's."""
        if recorded is not None and recorded != self.to_json():
            raise NormlabError(f"{where}: the NaP init norms recorded in the checkpoint differ from the rebuilt "
                               "model's initialisation (was the init code changed?); cannot resume exactly")


class EffectiveLR:
    """Effective step size ``||W_after - W_before|| / ||W_before||`` per weight feeding a norm.

    ``W_after`` is taken after the whole update (optimizer step, then NaP's projection when on). Call
    :meth:`before` just before ``opt.step()`` and :meth:`after` once the update is done; ``after`` returns flat
    metrics ``{"eff_lr/<param name>": value, ..., "eff_lr_mean": mean}`` (flat keys, so every metric is a number).
    """

    def __init__(self, params: dict[str, nn.Parameter]):
        self.params = params
        self._before: dict[str, torch.Tensor] = {}

    @torch.no_grad()
    def before(self) -> None:
        self._before = {n: p.detach().clone() for n, p in self.params.items()}

    @torch.no_grad()
    def after(self) -> dict[str, float]:
        out = {f"eff_lr/{n}": float((p - self._before[n]).norm() / self._before[n].norm().clamp_min(1e-12))
               for n, p in self.params.items()}
        self._before = {}
        if out:
            out["eff_lr_mean"] = sum(out.values()) / len(out)
        return out
