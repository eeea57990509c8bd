"""Exact (function-preserving) conversions of Pre-norm GPTs, computed in float64 and cast back once.

Jiang et al. 2023, "Pre-RMSNorm and Pre-CRMSNorm Transformers" (arXiv:2305.14858; repo
ZixuanJiang/pre-rmsnorm-transformer), and TransformerLens ``fold_ln`` for the folding step. With ``d`` the width:

- **fold** a norm's per-channel output affine ``y = core(x) * g + beta`` into each linear that reads it
  (``W [out, d]``, ``b [out]``): ``W' = W diag(g)``, ``b' = b + W beta``; the norm keeps only ``core``.
- **center** every residual-stream writer over its ``d`` outputs (embedding rows ``[V, d]``, position rows
  ``[T, d]``, ``proj.weight [d, in]`` over dim 0, ``proj.bias [d]``): the stream becomes ``C x`` with
  ``C = I - 11^T/d``; LayerNorm is invariant to that, and on a zero-mean stream ``LayerNorm == RMSNorm``.
- **compress** (Pre-CRMSNorm): a zero-mean ``z [d]`` is ``[x, -sum(x)]``, so writers keep ``d - 1`` outputs
  and readers use ``W[:, :-1] - W[:, -1:]`` (``W z = W[:, :-1] x + W[:, -1] z_d``).

Per-channel eval-mode norms (BatchNorm over tokens, PowerNorm, Unified Normalization) fold through the
**eval-affine protocol**, two methods a norm class may define (``dim`` channels, eval mode):

    eval_affine() -> (scale [dim], shift [dim])   # norm(x) == core(x) * scale + shift, core parameter-free
    reset_eval_affine_() -> None                   # in place: afterwards norm(x) == core(x) (scale 1, shift 0)

(``core`` is the identity for BatchNorm / UN, PowerNorm's per-token group scaling for PowerNorm.)

Supported: Pre-LN blocks (``pre``, or ``mix`` without Post-LN blocks), with LayerNorm Scaling (a constant
``c`` after the input norm: ``b' = b + c W beta``) and residual-branch scales (a scaled zero-mean branch stays
zero-mean), rope, learned, alibi or no positions, softmax attention (with QK-norm and score softcap: both act
after ``qkv``), tied or untied embeddings, dropout (conversion runs in eval mode).
Refused (one-line ``NormlabError``): any block norm other than the two input norms and an embedding norm
(Post-LN, Peri-LN output norms, OLMo-2 output norms: they write to the residual stream, so no linear follows
them), DyT (elementwise tanh: no statistic to reproduce, no affine to fold), norms outside the supported set,
attention kinds other than softmax,
unknown model components (any parameter or buffer not listed in ``_KNOWN``).
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from normlab.attention import attention_names, get_attention_class
from normlab.config import RunConfig, derive_config
from normlab.errors import NormlabError
from normlab.model import build_model
from normlab.model.config import ModelConfig
from normlab.model.placements import SITES
from normlab.norms.crmsnorm import CRMSNorm
from normlab.norms.modules import LayerNorm, RMSNorm

KINDS = ("rmsnorm", "crmsnorm", "folded")
PAPER = "Jiang et al. 2023, Pre-RMSNorm and Pre-CRMSNorm Transformers (arXiv:2305.14858)"
_KNOWN = re.compile(
    r"(tok_emb|pos_emb|lm_head)\.weight|lm_head\.bias|blocks\.\d+\.attn\.(qkv|proj)\.(weight|bias)"
    r"|blocks\.\d+\.mlp\.(fc|gate|proj)\.(weight|bias)|blocks\.\d+\.(attn_in|mlp_in)\..+|final_norm\..+"
    r"|blocks\.\d+\.(attn|mlp)_res_scale"  # residual-branch scalars: a scaled zero-mean branch stays zero-mean
    r"|blocks\.\d+\.attn\.(q_norm|k_norm)\.weight"  # QK-norm gains act after qkv: untouched by the conversion
    r"|embed_scale"  # one scalar on the token embeddings: scaling a recentred embedding keeps it zero-mean
)
_ZERO_MEAN_RTOL = 1e-5


@dataclass
class Site:
    """One norm and the linears that read its output. ``scale``/``shift``: float64 ``[dim]``."""

    name: str  # state-dict prefix: 'blocks.0.attn_in', 'final_norm'
    norm: nn.Module
    readers: list[str]  # linear prefixes: 'blocks.0.attn.qkv', 'lm_head'
    scale: torch.Tensor
    shift: torch.Tensor
    fold: bool = True  # False: the norm keeps its affine (a shift the bias-free LM head cannot take)
    in_scale: float = 1.0  # constant between norm and readers (LayerNorm Scaling): W (c (n g + beta)) + b


def _norm_name(norm: nn.Module) -> str:
    return getattr(type(norm), "name", type(norm).__name__)


def norm_affine(norm: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """The per-channel output affine ``(scale, shift)`` (float64 ``[dim]``) of a supported norm, else refuse."""
    name = _norm_name(norm)
    if not getattr(type(norm), "convertible", True):  # a registered norm declaring it (DyT); else nn.Identity etc.
        raise NormlabError(
            f"cannot convert norm '{name}': {type(norm).convertible_why}; layernorm, rmsnorm, crmsnorm and "
            "eval-affine norms convert"
        )
    if isinstance(norm, (LayerNorm, RMSNorm, CRMSNorm)):
        dim = norm.dim
        w = norm.weight.detach().double() if norm.weight is not None else torch.ones(dim, dtype=torch.float64)
        if isinstance(norm, RMSNorm) and norm.unit_offset and norm.weight is not None:
            w = 1.0 + w
        b = norm.bias.detach().double() if norm.bias is not None else torch.zeros(dim, dtype=torch.float64)
        return w, b
    if hasattr(norm, "eval_affine") and hasattr(norm, "reset_eval_affine_"):
        scale, shift = copy.deepcopy(norm).double().eval().eval_affine()
        return scale.detach().double().flatten(), shift.detach().double().flatten()
    raise NormlabError(
        f"cannot convert norm '{name}': supported are layernorm, rmsnorm, crmsnorm and norms with "
        "eval_affine()/reset_eval_affine_() (eval-mode per-channel affine: batchnorm, powernorm, unified)"
    )


def analyse(model: nn.Module, cfg: ModelConfig, *, need_final: bool) -> list[Site]:
    """Check the model is a supported Pre-norm GPT and list its norm sites with their readers.

    Structural: every block must hold exactly the two input norms (``pre``, or ``mix`` with no Post-LN block);
    LayerNorm Scaling (a constant on the input-norm output) and residual-branch scales are supported.
    """
    where = f"placement '{cfg.placement}'"
    if not isinstance(getattr(model, "embed_norm", nn.Identity()), nn.Identity):
        raise NormlabError(f"cannot convert {where} with an embedding norm: its output is the residual stream "
                           "itself (a writer), not the input of a linear, so it cannot be folded")
    sites = []
    for l, block in enumerate(model.blocks):
        for site in sorted(SITES, key=lambda x: x.endswith("_in")):  # other sites first: the clearer message
            m = getattr(block, site)
            if site in ("attn_in", "mlp_in"):
                if isinstance(m, nn.Identity):
                    raise NormlabError(f"cannot convert {where}: block {l} has no {site} norm (not a Pre-LN block)")
                continue
            if not isinstance(m, nn.Identity):
                why = ("Post-LN: the norm sits on the residual stream after the add" if site.endswith("post") else
                       "output-side norm: its output is added to the residual stream")
                raise NormlabError(
                    f"cannot convert {where}: block {l} has a norm at {site} ({why}); no linear follows it, so it "
                    "cannot be folded -- only Pre-LN blocks x + F(Norm(x)) convert exactly"
                )
        in_scale = float(getattr(block, "in_scale", 1.0))  # LayerNorm Scaling multiplies the norm's output
        readers = [f"blocks.{l}.mlp.fc"] + ([f"blocks.{l}.mlp.gate"] if hasattr(block.mlp, "gate") else [])
        for site, rd in (("attn_in", [f"blocks.{l}.attn.qkv"]), ("mlp_in", readers)):
            norm = getattr(block, site)
            scale, shift = norm_affine(norm)
            sites.append(Site(f"blocks.{l}.{site}", norm, rd, scale, shift, in_scale=in_scale))
    for name in model.state_dict():
        if not _KNOWN.fullmatch(name):
            raise NormlabError(f"cannot convert: unsupported model component '{name}'")
    if isinstance(model.final_norm, nn.Identity):
        if need_final:
            raise NormlabError(
                "cannot convert: Pre-LN model without a final norm; the LM head reads the raw residual stream, "
                "whose per-token mean the conversion removes"
            )
    else:
        sites.append(Site("final_norm", model.final_norm, ["lm_head"], *norm_affine(model.final_norm)))
    kinds = {type(s.norm) for s in sites}
    if len(kinds) > 1:
        raise NormlabError(f"cannot convert: mixed norm classes {sorted(k.__name__ for k in kinds)}")
    return sites


def _linears(sd: dict[str, torch.Tensor]) -> list[str]:
    return sorted(k[: -len(".weight")] for k in sd if re.fullmatch(r"blocks\.\d+\.(attn|mlp)\.\w+\.weight", k))


def _fold(sd: dict[str, torch.Tensor], site: Site) -> None:
    """``W' = W diag(scale)``, ``b' = b + c W shift`` for each reader (in place, float64); ``c`` = in_scale."""
    for r in site.readers:
        W = sd[f"{r}.weight"]
        if f"{r}.bias" in sd or bool(site.shift.abs().max() > 0):
            b = sd.get(f"{r}.bias", torch.zeros(W.shape[0], dtype=torch.float64))
            sd[f"{r}.bias"] = b + site.in_scale * (W @ site.shift)
        sd[f"{r}.weight"] = W * site.scale
    for k in [k for k in sd if k.startswith(site.name + ".")]:
        del sd[k]


def _writers(sd: dict[str, torch.Tensor]) -> list[tuple[str, int]]:
    """Residual-stream writers as ``(key, output dim)``."""
    out = [(k, 1) for k in ("tok_emb.weight", "pos_emb.weight") if k in sd]
    for k in sd:
        if re.fullmatch(r"blocks\.\d+\.(attn|mlp)\.proj\.(weight|bias)", k):
            out.append((k, 0))
    return out


def center_writers(sd: dict[str, torch.Tensor]) -> None:
    """Subtract each writer's mean over its ``d`` output coordinates (in place)."""
    for k, dim in _writers(sd):
        sd[k] = sd[k] - sd[k].mean(dim, keepdim=True)


def writers_zero_mean(sd: dict[str, torch.Tensor]) -> str | None:
    """The first writer whose mean over the output dim is not ~0 (relative to its size), else None."""
    for k, dim in _writers(sd):
        t = sd[k]
        if t.numel() and t.mean(dim).abs().max() > _ZERO_MEAN_RTOL * t.abs().max() + 1e-12:
            return k
    return None


def compress(sd: dict[str, torch.Tensor], readers: list[str]) -> None:
    """Keep ``d - 1`` outputs of every writer; readers become ``W[:, :-1] - W[:, -1:]`` (in place)."""
    for k, dim in _writers(sd):
        sd[k] = sd[k][:, :-1] if dim == 1 else sd[k][:-1]
    for r in readers:
        W = sd[f"{r}.weight"]
        sd[f"{r}.weight"] = W[:, :-1] - W[:, -1:]


def convert_model(model: nn.Module, run_cfg: RunConfig, kind: str) -> tuple[RunConfig, nn.Module, dict[str, Any]]:
    """Convert ``model`` (built from ``run_cfg``) to ``kind``; returns ``(new config, new model (eval), info)``.

    The new model is built from the new config (``build_model``) and loaded with the converted weights, so
    it is exactly what a run directory written from it loads back. ``info``: which sites were folded or kept.
    """
    if kind not in KINDS:
        raise NormlabError(f"unknown conversion '{kind}'; allowed: {', '.join(KINDS)}")
    cfg = run_cfg.model
    if not get_attention_class(cfg.attention).convertible:
        ok = ", ".join(k for k in attention_names() if get_attention_class(k).convertible)
        raise NormlabError(f"cannot convert model.attention '{cfg.attention}': exact conversions know the fused "
                           f"qkv/proj projections of {ok} attention only (a kind declares convertible)")
    model = model.eval()
    sites = analyse(model, cfg, need_final=kind != "folded")
    norm_cls = type(sites[0].norm)
    if kind == "rmsnorm" and norm_cls is not LayerNorm:
        raise NormlabError(f"--to rmsnorm needs a Pre-LN LayerNorm model, got norm '{cfg.norm}'")
    if kind == "crmsnorm" and norm_cls not in (LayerNorm, RMSNorm):
        raise NormlabError(f"--to crmsnorm needs a Pre-LN layernorm or rmsnorm model, got norm '{cfg.norm}'")
    eval_affine = norm_cls not in (LayerNorm, RMSNorm, CRMSNorm)

    sd = {k: (v.detach().double().clone() if v.is_floating_point() else v.clone())
          for k, v in model.state_dict().items()}
    if kind == "crmsnorm" and norm_cls is RMSNorm:
        bad = writers_zero_mean(sd)
        if bad:
            raise NormlabError(
                f"--to crmsnorm: this rmsnorm model's residual writer '{bad}' is not zero-mean over the width, "
                "so the stream cannot be stored in width - 1 coordinates (convert the Pre-LN original instead)"
            )
    for s in sites:
        if s.fold:
            _fold(sd, s)
    if kind in ("rmsnorm", "crmsnorm") and norm_cls is LayerNorm:
        center_writers(sd)
    if kind == "crmsnorm":
        compress(sd, [r for s in sites for r in s.readers])

    m: dict[str, Any] = {}  # the model keys the converted run's config changes
    kept = [s for s in sites if not s.fold]
    if kind == "rmsnorm":
        m["norm"], m["norm_options"] = "rmsnorm", {"affine": False}
        if kept:
            m["norm_options"].update({"affine@final": True, "bias@final": True})
    elif kind == "crmsnorm":
        m["norm"], m["norm_options"] = "crmsnorm", {"affine": False}
    elif not eval_affine:
        m["norm_options"] = {"affine": False}
        if kept:
            m["norm_options"].update({f"{k}@final": v for k, v in cfg.norm_kwargs("final").items()})
            m["norm_options"]["affine@final"] = True
    # eval-affine norms keep their config; their state is reset in place below
    folded_shift = any(bool(s.shift.abs().max() > 0) for s in sites if s.fold and s.name != "final_norm")
    m["bias"] = bool(cfg.bias or folded_shift)
    if "lm_head.bias" in sd:  # a folded final shift: model.head_bias gives the LM head its bias
        m["head_bias"] = True
    m["tie_embeddings"] = bool(cfg.tie_embeddings and torch.equal(sd["tok_emb.weight"], sd["lm_head.weight"]))
    new_cfg = derive_config(run_cfg, {f"model.{k}": v for k, v in m.items()})

    for s in sites:  # norm state of the converted model: kept as is, reset in place, or parameter-free
        if not s.fold:
            if kind == "rmsnorm":  # LayerNorm gain/bias become the final RMSNorm's gain/bias
                sd[f"{s.name}.weight"], sd[f"{s.name}.bias"] = s.scale, s.shift
        elif eval_affine:
            reset = copy.deepcopy(s.norm)
            reset.reset_eval_affine_()
            sd.update({f"{s.name}.{k}": v for k, v in reset.state_dict().items()})

    torch.manual_seed(run_cfg.seed)
    out = build_model(new_cfg.model).eval()
    target = out.state_dict()
    for k, v in target.items():  # linears that gained a bias (model.bias switched on) start from zero
        if k not in sd and k.endswith(".bias") and k[: -len(".bias")] in _linears(sd) + ["lm_head"]:
            sd[k] = torch.zeros(v.shape, dtype=torch.float64)
    missing, extra = sorted(set(target) - set(sd)), sorted(set(sd) - set(target))
    if missing or extra:
        raise NormlabError(f"internal: converted weights do not match the converted config (missing {missing[:3]}, "
                           f"unexpected {extra[:3]})")
    for k, v in target.items():
        if tuple(sd[k].shape) != tuple(v.shape):
            raise NormlabError(f"internal: '{k}' converted to shape {tuple(sd[k].shape)}, "
                               f"config expects {tuple(v.shape)}")
    out.load_state_dict({k: sd[k].to(v.dtype) for k, v in target.items()})
    info = {"norm_from": cfg.norm, "norm_to": new_cfg.model.norm,
            "folded_sites": [s.name for s in sites if s.fold], "kept_sites": [s.name for s in kept]}
    return new_cfg, out, info
