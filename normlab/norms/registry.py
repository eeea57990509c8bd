"""Name -> norm class registry (timm ``create_norm`` style).

Every registered norm has the same constructor shape::

    cls(dim: int, *, eps: float = 1e-5, affine: bool = True, bias: bool = True, **options)

and names its parameters ``weight`` / ``bias`` so optimizers, diagnostics and conversions can treat all norms
uniformly. Each class carries ``name``, ``paper`` and ``description`` class attributes used by ``normlab norms``,
and declares its facts as class attributes (``register_norm`` fills in the defaults of ``NORM_FACTS`` for those a
class does not set), so no code elsewhere asks ``if name == ...``:

- ``auto_embed_scale`` (``"none"``): what ``model.embed_scale: auto`` means for a model using it (DyT sets
  ``"learnable"``: without statistics its input scale matters);
- ``compressed_stream`` (False): the model stores its residual stream in ``width - 1`` coordinates
  (CRMSNorm; ``normlab.model.crms``);
- ``extra_params`` (()): parameter names besides ``weight`` / ``bias`` (DyT's ``alpha``);
- ``scalar_params`` (()): scalar parameters the diagnostics report per site (DyT's ``alpha``);
- ``needs_warmup`` (False): the norm takes a ``warmup`` option (statistics warm-up, PowerNorm / Unified
  Normalization) that defaults to the run's LR warm-up (``train.warmup_steps``);
- ``convertible`` (True): whether ``normlab convert`` can reproduce it exactly (DyT: no statistic, no affine);
- ``resolve_options`` (None): ``(dim, group, options) -> options``, resolving option values that depend on the
  model's width or the site's group (DyT's ``alpha_init: auto``); ``resolve_norm_options`` calls it;
- ``flops_per_element`` (None = not declared): forward FLOPs per input element of the normalization itself, the
  per-channel gain and bias excluded (one FLOP per add, multiply, divide or transcendental; the FLOPs counter
  ``normlab.model.flops`` adds one per element for ``weight`` and one for ``bias`` when present).
"""

from __future__ import annotations

import inspect
from typing import Any

from torch import nn

from normlab.errors import NormlabError, did_you_mean, unknown

_REGISTRY: dict[str, type[nn.Module]] = {}
NORM_FACTS: dict[str, Any] = {"paper": "", "description": "", "auto_embed_scale": "none",
                              "compressed_stream": False, "extra_params": (), "scalar_params": (),
                              "needs_warmup": False, "convertible": True, "convertible_why": "",
                              "flops_per_element": None, "resolve_options": None}


def register_norm(name: str):
    """Class decorator: register ``cls`` under ``name`` (must be unique)."""

    def deco(cls: type[nn.Module]) -> type[nn.Module]:
        if name in _REGISTRY:
            raise ValueError(f"norm '{name}' registered twice")
        cls.name = name
        for fact, default in NORM_FACTS.items():
            if not hasattr(cls, fact):
                setattr(cls, fact, default)
        _REGISTRY[name] = cls
        return cls

    return deco


def norm_names() -> list[str]:
    """All registered norm names, sorted."""
    return sorted(_REGISTRY)


def get_norm_class(name: str) -> type[nn.Module]:
    """Look a norm class up by name; unknown names raise a one-line NormlabError."""
    if name not in _REGISTRY:
        raise unknown("norm", name, _REGISTRY)
    return _REGISTRY[name]


def build_norm(name: str, dim: int, /, **kwargs: Any) -> nn.Module:
    """Instantiate norm ``name`` over the last dimension ``dim``.

    Keyword options a class does not accept are an error (so a typo in a config option is not silently dropped);
    so are ``self`` and ``dim``, which are not options (the width is ``dim``).
    """
    cls = get_norm_class(name)
    params = inspect.signature(cls.__init__).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    allowed = [k for k, p in params.items() if k not in ("self", "dim") and p.kind in named]
    bad = [k for k in kwargs if k in ("self", "dim") or not takes_any and k not in allowed]
    if bad:
        raise NormlabError(
            f"norm '{name}' does not take option(s) {', '.join(bad)}{did_you_mean(bad[0], allowed)}; allowed: "
            f"{', '.join(allowed)}"
        )
    for k, v in kwargs.items():  # a flag declared ``bool`` (``bool | None``) takes true/false (null) only
        ann = str(params[k].annotation) if k in params else ""
        if ann in ("bool", "bool | None") and not (isinstance(v, bool) or v is None and ann == "bool | None"):
            raise NormlabError(f"norm '{name}' option {k} must be true or false, got {v!r}")
    return cls(dim, **kwargs)


def resolve_norm_options(name: str, dim: int, group: str, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` for a norm ``name`` of width ``dim`` at a site of ``group`` (``attn``, ``mlp``, ``final``,
    ``embed``), with the values its class resolves (``resolve_options``) filled in; unchanged for an unknown name
    (``get_norm_class`` reports that)."""
    hook = getattr(_REGISTRY.get(name), "resolve_options", None)
    return hook(dim, group, options) if hook is not None else options


def auto_embed_scale(name: str) -> str:
    """The token-embedding scale ``model.embed_scale: auto`` resolves to for norm ``name`` (``none`` unless the
    class sets ``auto_embed_scale``)."""
    return get_norm_class(name).auto_embed_scale


def list_norms() -> list[dict[str, str]]:
    """``[{name, paper, description}]`` for every registered norm (used by ``normlab norms``)."""
    return [
        {"name": n, "paper": c.paper, "description": c.description}
        for n, c in sorted(_REGISTRY.items())
    ]
