"""Where norms sit in a block, as data (x-transformers idea, without one flag per norm).

A block has six optional norm sites around its two sublayers ``F`` (attention, MLP)::

    h = F(in_norm(x)); h = out_norm(h); x = post_norm(x + h)

- ``pre``  (Pre-LN, Xiong et al. 2020):   ``x = x + F(Norm(x))``; final norm before the LM head.
- ``post`` (original Transformer, Vaswani et al. 2017): ``x = Norm(x + F(x))``; no final norm.

A placement maps the block index ``l`` (0-based) and depth ``L`` to the set of sites that hold a norm; absent sites
are ``nn.Identity``. Later placements (peri, mix, output, ...) are more entries in ``PLACEMENTS``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

SITES = ("attn_in", "attn_out", "attn_post", "mlp_in", "mlp_out", "mlp_post")


@dataclass(frozen=True)
class Placement:
    """``sites(l, L)`` -> norm sites present in block ``l``; ``final_norm``: default for the final norm."""

    name: str
    sites: Callable[[int, int], frozenset[str]]
    final_norm: bool
    paper: str


PLACEMENTS: dict[str, Placement] = {
    "pre": Placement(
        "pre", lambda l, L: frozenset({"attn_in", "mlp_in"}), True,
        "Xiong et al. 2020, On Layer Normalization in the Transformer Architecture",
    ),
    "post": Placement(
        "post", lambda l, L: frozenset({"attn_post", "mlp_post"}), False,
        "Vaswani et al. 2017, Attention Is All You Need",
    ),
}
