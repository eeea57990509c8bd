"""The model-size axis of a sweep (``normlab compare``; docs/scaling.md): ``sizes`` or ``size_grid``, tokens per run
fixed or ``tokens_per_param``, and the learning rate per size (fixed, best of an ``lr_grid``, or ``lr_transfer``).

    sizes:                          # (width, depth) pairs; heads = width / head_dim unless given
      - [64, 2]
      - {width: 96, depth: 3, heads: 3}
    size_grid:                      # or: widths at a fixed aspect ratio, depth = round(width / aspect)
      widths: [64, 96, 128, 192]
      aspect: 32
      head_dim: 32                  # default: the base config's width / heads
    tokens_per_param: 20            # optional: train.steps = ceil(t * N / (batch_size * grad_accum * context))
    lr_transfer:                    # optional: train.lr(width) = train.lr * (base_width / width) ** exponent
      base_width: 64
      exponent: 1.0

``N`` is the non-embedding parameter count (Kaplan et al. 2020, "Scaling Laws for Neural Language Models": the
token and position embeddings are left out, which gives cleaner power laws), counted exactly by building the
model on PyTorch's ``meta`` device (no memory, no compute). It is computed from the base config with the size's
overrides and no variant, so every variant of one size trains on the same number of tokens.

With ``tokens_per_param`` the warm-up, evaluation and checkpoint intervals keep the fraction of the run they have
in the base config (so every run has the same number of evaluations, which the step-to-step noise needs). Without
it every size trains for the base config's ``train.steps`` (tokens fixed). The learning rate per size is: the base
``train.lr`` (``fixed``), the best of an ``lr_grid`` / a ``train.lr`` axis chosen per (variant, size) by the
scaling analysis (``best-of-grid``), or ``lr_transfer``'s rule (``transferred``), which is the width-scaling of
Adam's hidden-layer learning rate in muP (Yang et al. 2022, "Tensor Programs V") applied to the one global
learning rate -- a stated heuristic, not muP itself. The rule is recorded in the sweep spec and the report.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from normlab.errors import NormlabError, check_keys

SIZE_KEYS = ("sizes", "size_grid", "tokens_per_param", "lr_transfer")
SIZE_OWNED = ("model.width", "model.depth", "model.heads")


@dataclass
class SizePoint:
    """One model size: its overrides (width, depth, heads; steps and lr when derived) and what it means."""

    label: str
    overrides: dict[str, Any]
    width: int
    depth: int
    heads: int
    params: int | None = None          # non-embedding parameters N
    tokens: int | None = None          # training tokens D
    tokens_per_param: float | None = None


def _pos_int(v: Any, what: str) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise NormlabError(f"{what} must be an integer >= 1, got {v!r}")
    return v


def _pos_num(v: Any, what: str) -> float:
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v <= 0:
        raise NormlabError(f"{what} must be a number > 0, got {v!r}")
    return float(v)


def _mapping(v: Any, what: str, allowed: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(v, dict):
        raise NormlabError(f"{what} must be a mapping with keys {', '.join(allowed)}, got {type(v).__name__}")
    check_keys(v, allowed, what)
    return v


def _heads(width: int, head_dim: int, source: str) -> int:
    if width % head_dim:
        raise NormlabError(f"{source}: width {width} is not a multiple of head_dim {head_dim}; give heads explicitly "
                           "or choose widths divisible by head_dim")
    return width // head_dim


def _shapes(raw: dict[str, Any], base_width: int, base_heads: int, source: str) -> list[tuple[int, int, int]]:
    """``[(width, depth, heads), ...]`` from ``sizes`` or ``size_grid``."""
    if "sizes" in raw and "size_grid" in raw:
        raise NormlabError(f"{source}: give either 'sizes' or 'size_grid', not both")
    default_hd = max(1, base_width // max(1, base_heads))
    out: list[tuple[int, int, int]] = []
    if "sizes" in raw:
        sizes = raw["sizes"]
        if not isinstance(sizes, list) or not sizes:
            raise NormlabError(f"{source}: sizes must be a non-empty list of [width, depth] pairs or "
                               "{width, depth, heads} mappings")
        for i, s in enumerate(sizes):
            what = f"{source}: sizes #{i + 1}"
            if isinstance(s, (list, tuple)):
                if len(s) != 2:
                    raise NormlabError(f"{what} must be a [width, depth] pair, got {s!r}")
                w, d = _pos_int(s[0], f"{what} width"), _pos_int(s[1], f"{what} depth")
                h = _heads(w, default_hd, what)
            else:
                m = _mapping(s, what, ("width", "depth", "heads"))
                if "width" not in m or "depth" not in m:
                    raise NormlabError(f"{what} needs width and depth")
                w, d = _pos_int(m["width"], f"{what} width"), _pos_int(m["depth"], f"{what} depth")
                h = _pos_int(m["heads"], f"{what} heads") if "heads" in m else _heads(w, default_hd, what)
            out.append((w, d, h))
    else:
        g = _mapping(raw["size_grid"], f"{source}: size_grid", ("widths", "aspect", "head_dim"))
        widths = g.get("widths")
        if not isinstance(widths, list) or not widths:
            raise NormlabError(f"{source}: size_grid.widths must be a non-empty list of integers")
        if "aspect" not in g:
            raise NormlabError(f"{source}: size_grid.aspect (width / depth, e.g. 32) is required")
        aspect = _pos_num(g["aspect"], f"{source}: size_grid.aspect")
        hd = _pos_int(g.get("head_dim", default_hd), f"{source}: size_grid.head_dim")
        for w in widths:
            w = _pos_int(w, f"{source}: size_grid.widths entry")
            out.append((w, max(1, round(w / aspect)), _heads(w, hd, f"{source}: size_grid")))
    if len(set((w, d) for w, d, _ in out)) != len(out):
        raise NormlabError(f"{source}: two sizes have the same (width, depth): {[(w, d) for w, d, _ in out]}")
    return out


def count_params(config: dict[str, Any]) -> int:
    """Non-embedding parameters of the model a full config dict describes, built on the ``meta`` device."""
    import torch

    from normlab.config import planned_config
    from normlab.model.build import build_model

    cfg = planned_config({**config, "seed": 0})
    with torch.device("meta"):
        return build_model(cfg.model).num_params(non_embedding=True)


def run_tokens(config: dict[str, Any]) -> int:
    """Training tokens of a run: steps x batch_size x grad_accum x context."""
    t, m = config["train"], config["model"]
    return int(t["steps"]) * int(t["batch_size"]) * int(t.get("grad_accum", 1)) * int(m["context"])


def size_points(raw: dict[str, Any], base: dict[str, Any], common: dict[str, Any], source: str,
                apply: Any) -> tuple[list[SizePoint], dict[str, Any]]:
    """Expand the size keys of a sweep mapping into ``SizePoint``s and their resolved spec entries.

    ``base``: the base config mapping; ``common``: the sweep's flattened ``set``; ``apply(data, overrides)``: how
    the sweep applies dotted overrides. Returns ``([], {})`` when the sweep has no size keys.
    """
    present = [k for k in SIZE_KEYS if k in raw]
    if not present:
        return [], {}
    if "sizes" not in raw and "size_grid" not in raw:
        raise NormlabError(f"{source}: '{present[0]}' needs a size axis ('sizes' or 'size_grid')")
    for k in SIZE_OWNED:
        if k in common:
            raise NormlabError(f"{source}: set: '{k}' is given by the size axis; remove it from 'set'")
    merged = apply(base, common)
    m, t = merged.get("model", {}), merged.get("train", {})
    from normlab.config import planned_config

    try:
        ref = planned_config({**merged, "seed": 0}).to_dict()
    except NormlabError as e:
        raise NormlabError(f"{source}: base config with 'set': {e}") from None
    m, t = ref["model"], ref["train"]
    shapes = _shapes(raw, m["width"], m["heads"], source)

    tpp = raw.get("tokens_per_param")
    if tpp is not None:
        tpp = _pos_num(tpp, f"{source}: tokens_per_param")
    transfer = None
    if raw.get("lr_transfer") is not None:
        tr = _mapping(raw["lr_transfer"], f"{source}: lr_transfer", ("base_width", "exponent"))
        if "base_width" not in tr:
            raise NormlabError(f"{source}: lr_transfer.base_width (the width train.lr is tuned for) is required")
        transfer = {"base_width": _pos_int(tr["base_width"], f"{source}: lr_transfer.base_width"),
                    "exponent": float(_pos_num(tr.get("exponent", 1.0), f"{source}: lr_transfer.exponent"))}
        if "lr_grid" in raw:
            raise NormlabError(f"{source}: give either lr_transfer or lr_grid, not both")

    per_step = int(t["batch_size"]) * int(t["grad_accum"]) * int(m["context"])
    base_steps = int(t["steps"])
    points: list[SizePoint] = []
    for w, d, h in shapes:
        ov: dict[str, Any] = {"model.width": w, "model.depth": d, "model.heads": h}
        try:
            n = count_params(apply(merged, ov))
        except NormlabError as e:
            raise NormlabError(f"{source}: size width={w}, depth={d}, heads={h}: {e}") from None
        steps = base_steps
        if tpp is not None:
            steps = max(1, math.ceil(tpp * n / per_step))
            frac = steps / base_steps
            ov["train.steps"] = steps
            ov["train.warmup_steps"] = min(steps - 1, round(int(t["warmup_steps"]) * frac)) if steps > 1 else 0
            for key in ("eval_every", "checkpoint_every", "log_every"):
                ov[f"train.{key}"] = max(1, round(int(t[key]) * frac))
        if transfer is not None:
            ov["train.lr"] = float(t["lr"]) * (transfer["base_width"] / w) ** transfer["exponent"]
        points.append(SizePoint(f"w{w}-d{d}", ov, w, d, h, n, steps * per_step, tpp))
    points.sort(key=lambda p: p.params or 0)
    stored: dict[str, Any] = {"sizes": [{"width": p.width, "depth": p.depth, "heads": p.heads} for p in points]}
    if tpp is not None:
        stored["tokens_per_param"] = tpp
    if transfer is not None:
        stored["lr_transfer"] = transfer
    return points, stored


def lr_rule(transfer: dict[str, Any] | None, lrs_per_cell: int) -> str:
    """How the learning rate per size was chosen: ``transferred`` (``transfer``: the sweep's ``lr_transfer``),
    ``best-of-grid`` (several learning rates per variant and size: an ``lr_grid`` or a ``train.lr`` axis), or
    ``fixed``."""
    if transfer:
        t = transfer
        return f"transferred: train.lr x ({t['base_width']} / width)^{t['exponent']:g}"
    if lrs_per_cell > 1:
        return "best-of-grid: the learning rate with the lowest mean final loss per variant and size"
    return "fixed: the same train.lr at every size"
