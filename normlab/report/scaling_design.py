"""What a size sweep's design confounds with size, read from the trained points themselves (docs/scaling.md,
"Confounds"): a crossover or forecast between two variants is a statement about model size only when nothing else
changes with size. Three confounds are visible in the design:

- ``depth_with_width``: depth varies as width grows (a fixed aspect ratio, or a list of sizes that changes both):
  normalization placements differ exactly in how they treat depth (Xiong et al. 2020), so a flip across such sizes
  may be a depth effect;
- ``one_lr``: one learning rate at every size (no ``lr_grid`` / ``train.lr`` axis, no ``lr_transfer``): with Adam the
  best learning rate falls with width (Yang et al. 2022, muP), so a fixed rate favours whichever variant tolerates
  it at the larger sizes;
- ``low_tokens_per_param``: fewer than ``TOKENS_PER_PARAM_LEVEL`` training tokens per non-embedding parameter at
  some size (20 is Hoffmann et al. 2022's compute-optimal ratio), and ``tokens_per_param_varies``: the ratio changes
  by more than ``TPP_SPREAD`` across sizes (a fixed token budget), so the larger models are further from trained
  and the fitted E is that budget's floor.

Pure functions on the points (width, depth, learning rate, learning rates tried, tokens, parameters); no torch.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

TOKENS_PER_PARAM_LEVEL = 20.0   # Hoffmann et al. 2022 ("Chinchilla"): about 20 tokens per parameter
TPP_SPREAD = 2.0                # tokens per parameter varying by more than this factor across sizes is a confound


class _Point(Protocol):
    width: int
    depth: int
    params: int
    tokens: int
    lr: float
    lrs_tried: int


def confounds(points: Iterable[_Point], *, lr_rule: str = "", level: float = TOKENS_PER_PARAM_LEVEL
              ) -> list[dict[str, Any]]:
    """``[{kind, text, ...}]``: the confounds of size visible in ``points`` (all variants' points of a size sweep;
    ``lr_rule``: ``normlab.experiments.sizes.lr_rule``'s text, which says whether the rate was transferred)."""
    pts = [p for p in points if p.params > 0]
    out: list[dict[str, Any]] = []
    if not pts:
        return out
    widths = sorted({p.width for p in pts})
    by_width: dict[int, set[int]] = {}
    for p in pts:
        by_width.setdefault(p.width, set()).add(p.depth)
    depths = sorted({p.depth for p in pts})
    if len(widths) > 1 and len(depths) > 1:
        pairs = sorted({(p.width, p.depth) for p in pts})
        out.append({"kind": "depth_with_width", "depths": depths, "widths": widths,
                    "short": f"depth varies with width ({depths[0]}-{depths[-1]} blocks)",
                    "text": f"depth varies with width ({depths[0]}-{depths[-1]} blocks over widths "
                            f"{widths[0]}-{widths[-1]}: {', '.join(f'w{w}-d{d}' for w, d in pairs)}), so a "
                            "difference that changes with size may be a depth effect; fix the depth to ask about "
                            "width alone, or state the aspect ratio as the question"})
    transferred = lr_rule.startswith("transferred")
    if not transferred and all(p.lrs_tried <= 1 for p in pts):
        lrs = sorted({p.lr for p in pts})
        if len(lrs) == 1:
            out.append({"kind": "one_lr", "lr": lrs[0], "short": f"one learning rate ({lrs[0]:g}) at every size",
                        "text": f"one learning rate ({lrs[0]:g}) at every size, not tuned per size: with Adam the "
                                "best rate falls with width, so the comparison at the larger sizes may be one of "
                                "tolerance to a too-high rate; use an lr_grid (best-of-grid per size)"})
    tpp = {(p.width, p.depth): p.tokens / p.params for p in pts}
    lo, hi = min(tpp.values()), max(tpp.values())
    if lo < level:
        span = _num(lo) if _num(lo) == _num(hi) else f"{_num(lo)}-{_num(hi)}"
        out.append({"kind": "low_tokens_per_param", "min": lo, "max": hi, "level": level,
                    "short": f"{span} tokens per parameter (below {level:g})",
                    "text": f"{span} tokens per parameter, below {level:g} (Hoffmann et al. "
                            "2022's compute-optimal ratio) at "
                            f"{sum(v < level for v in tpp.values())} of {len(tpp)} sizes: the models are not "
                            "trained to capacity, and the fitted E is this token budget's floor"})
    if hi / lo > TPP_SPREAD:
        out.append({"kind": "tokens_per_param_varies", "min": lo, "max": hi,
                    "short": f"tokens per parameter vary {hi / lo:.3g}x across sizes",
                    "text": f"tokens per parameter fall from {_num(hi)} to {_num(lo)} across sizes (a fixed "
                            "token budget): the larger models are further from trained, which changes with size "
                            "as much as N does; use tokens_per_param"})
    return out


def confound_text(found: list[dict[str, Any]]) -> str:
    """One clause naming the confounds briefly, for a crossover or forecast line (the full texts are in the design
    confounds table and the summary); empty when there are none."""
    if not found:
        return ""
    return "confounded with size: " + "; ".join(c["short"] for c in found) + " (see the design confounds)"


def _num(x: float) -> str:
    return f"{x:.2g}" if x < 10 else f"{x:.0f}"
