"""Residual streams as a choice: the plain residual addition, hyper-connections (HC), manifold-constrained
hyper-connections (mHC) and nGPT's hypersphere update, looked up by name (``model.residual``) in one registry.

A model with ``n = model.streams`` residual streams carries ``h [B, T, n, d]`` instead of ``x [B, T, d]``: the
embedding is copied into every stream (expansion), and the streams are summed before the final norm (reduction),
as the reference package's ``expand_stream`` / ``reduce_stream`` (lucidrains/hyper-connections). Around each
sublayer ``F`` (attention or MLP; sublayer ``k = 2 l`` or ``2 l + 1`` of block ``l``) a connection module mixes the
streams (Zhu et al. 2025, eqs. 1-5; mHC, Xie et al. 2025, eq. 3)::

    x_in  = H_pre h               H_pre  [n]     weights of the streams feeding F        ("width connection")
    h'    = H_res h + H_post F(x_in)   H_res [n, n], H_post [n]                          ("depth connection")

- ``hc`` (Zhu et al., "Hyper-Connections", ICLR 2025, arXiv:2409.19606): static ``H_pre = A_m``, ``H_res = A_r^T``,
  ``H_post = B``, initialised to ``e_{k mod n}``, the identity and ones (so at init the model is a Pre-LN model
  whose branch reads stream ``k mod n``); the dynamic variant (``model.hc_dynamic``) adds
  ``s * tanh(norm(h) W)`` per token with ``W`` zero-initialised and the scales ``s`` 0.01.
- ``mhc`` (Xie et al. / DeepSeek-AI, "mHC: Manifold-Constrained Hyper-Connections", arXiv:2512.24880): the same
  unconstrained maps, then ``H_pre = sigmoid(.)``, ``H_post = 2 sigmoid(.)`` (non-negative) and ``H_res =
  SinkhornKnopp(.)`` (doubly stochastic: ``exp``, then ``model.sinkhorn_iters`` alternating column / row
  normalisations), so that the product of the ``H_res`` over depth stays doubly stochastic (gain 1).

Both follow the reference package ``hyper-connections`` (lucidrains, ``HyperConnections`` and
``ManifoldConstrainedHyperConnections``; tests/fixtures/hyper_connections_reference.json checks forward and
gradients against it): the dynamic maps are computed per stream from ``RMSNorm(h_s) [d]`` (the package's
RMSNorm ``normalize(h_s) * sqrt(d) * (1 + gamma)``, the HC paper's LayerNorm replaced as the package does),
``[n, d] @ [d, n + 1]``. The mHC paper instead projects the flattened ``[n d]`` vector of all streams (eq. 7,
``phi [n d, n^2]``); normlab follows the package so that HC and mHC differ only in the constraints (the variable the
mHC paper's claim is about) and so that both can be checked against one reference (docs/streams.md).

Shapes: ``h [B, T, n, d]``; ``H_pre [B, T, n]``; ``H_res [B, T, n, n]`` (``h'_i = sum_j H_res[i, j] h_j``);
``H_post [B, T, n]``; the branch input and output ``[B, T, d]``.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from normlab.errors import unknown

_REGISTRY: dict[str, type[nn.Module] | None] = {"add": None}
PAPERS = {"add": "He et al. 2016, Deep Residual Learning (the plain residual addition)"}


def register_residual(name: str, paper: str):
    """Class decorator: register a stream connection class under ``name`` (``model.residual``)."""

    def deco(cls: type[nn.Module]) -> type[nn.Module]:
        if name in _REGISTRY:
            raise ValueError(f"residual kind '{name}' registered twice")
        cls.name, cls.paper = name, paper
        _REGISTRY[name] = cls
        PAPERS[name] = paper
        return cls

    return deco


def residual_names() -> list[str]:
    """``add`` (one stream, the plain residual) and every registered connection kind, sorted."""
    return sorted(_REGISTRY)


def get_connection_class(name: str) -> type[nn.Module] | None:
    """The connection class of ``name`` (None for ``add``); unknown names raise a one-line NormlabError."""
    if name not in _REGISTRY:
        raise unknown("model.residual", name, _REGISTRY)
    return _REGISTRY[name]


def sinkhorn_knopp(logits: torch.Tensor, iters: int) -> torch.Tensor:
    """Sinkhorn-Knopp projection of ``logits [..., n, n]`` onto the doubly stochastic matrices (Sinkhorn & Knopp
    1967; mHC eq. 9): ``M = exp(logits)`` (after subtracting each column's max, which the first normalisation
    cancels), then ``iters`` times: normalise each column (dim -2), then each row (dim -1), to sum 1. Computed in
    float32, as the reference package. ``iters = 0`` returns ``exp`` unnormalised."""
    dtype = logits.dtype
    z = logits.float()
    m = (z - z.amax(dim=-2, keepdim=True).detach()).exp()
    for _ in range(iters):  # the package's F.normalize(m, p=1, dim), written out for m >= 0 (exp): torch's L1
        m = m * m.sum(dim=-2, keepdim=True).clamp_min(1e-12).reciprocal()  # vector norm is slow on CPU here
        m = m * m.sum(dim=-1, keepdim=True).clamp_min(1e-12).reciprocal()
    return m.to(dtype)


def _mv(h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``h [..., n, d] @ w [d] -> [..., n]`` as a matrix product with a ``[d, 1]`` matrix (a matrix-vector product
    ``mv``, which torch's FlopCounterMode does not count, would hide it from the FLOPs check)."""
    return (h @ w.unsqueeze(-1)).squeeze(-1)


class _StreamRMSNorm(nn.Module):
    """The reference package's norm of the dynamic maps: ``normalize(h) * sqrt(d) * (1 + gamma)``, ``gamma [d]``
    zero-initialised (RMSNorm with eps on the L2 norm; ``h [..., d] -> [..., d]``)."""

    def __init__(self, dim: int):
        super().__init__()
        self.scale = math.sqrt(dim)
        self.gamma = nn.Parameter(torch.zeros(dim))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return F.normalize(h, dim=-1) * self.scale * (self.gamma + 1)


def unit(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """``x / ||x||_2`` along ``dim`` (nGPT's ``justnorm``; no eps, as the authors' code)."""
    return x / x.norm(p=2, dim=dim, keepdim=True)


class _Connection(nn.Module):
    """Shared parameters of HC and mHC around sublayer ``layer`` with ``streams`` streams of width ``dim``.

    ``static_alpha [n, n + 1]``: column 0 is ``A_m`` (init ``e_{layer mod n}``), columns 1.. are ``A_r`` (init the
    identity): ``x_in = sum_s alpha[s, 0] h_s`` and ``h'_t = sum_s alpha[s, 1 + t] h_s`` (so ``H_res = A_r^T``);
    ``static_beta [n]`` (ones) = ``B``. Dynamic (``dynamic=True``): ``dynamic_alpha_fn [d, n + 1]`` and
    ``dynamic_beta_fn [d]`` (zeros), applied to ``_StreamRMSNorm(h_s)``, with scales of init 0.01.
    ``forward(h [B, T, n, d]) -> (x_in [B, T, d], h_res [B, T, n, d] (= H_res h), post [B, T, n], H_res [B, T, n,
    n])``; ``depth(y [B, T, d], h_res, post) -> h_res + post * y`` ``[B, T, n, d]``.
    """

    # every parameter here parametrises an identity-like map (or a gate on it): weight decay would pull the static
    # maps towards zero, so the optimizer puts the module's parameters in the no-decay group (normlab.train.optim)
    no_weight_decay = True
    multi_stream = True  # the model carries n streams [B, T, n, d]
    normalized = False  # nGPT: the model's facts that go with a hypersphere residual (GPT, attention, MLP)

    def __init__(self, streams: int, dim: int, layer: int, *, dynamic: bool = True, sinkhorn_iters: int = 20,
                 alpha_init: float = 0.05):
        super().__init__()
        n = streams
        self.streams, self.dim, self.layer, self.dynamic, self.sinkhorn_iters = n, dim, layer, dynamic, sinkhorn_iters
        a0 = torch.zeros(n, 1)
        a0[layer % n, 0] = 1.0
        self.static_alpha = nn.Parameter(torch.cat((a0, torch.eye(n)), dim=1))
        self.static_beta = nn.Parameter(torch.ones(n))
        if dynamic:
            self.norm = _StreamRMSNorm(dim)
            self.dynamic_alpha_fn = nn.Parameter(torch.zeros(dim, n + 1))
            self.dynamic_beta_fn = nn.Parameter(torch.zeros(dim))

    def maps(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The unconstrained ``alpha [B, T, n, n + 1]`` and ``beta [B, T, n]`` (static + dynamic), or the static
        ``[n, n + 1]`` and ``[n]``, which broadcast over the tokens."""
        raise NotImplementedError

    def static(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The static maps ``[n, n + 1]``, ``[n]`` (broadcast over tokens), as copies: a view of a parameter made
        under ``no_grad`` carries ``requires_grad`` without a graph, which torch's module hooks refuse."""
        return self.static_alpha.clone(), self.static_beta.clone()

    def constrain(self, alpha: torch.Tensor, beta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return alpha, beta

    def forward(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        alpha, beta = self.constrain(*self.maps(h))
        mixed = alpha.transpose(-1, -2) @ h  # [.., n + 1, n] @ [B, T, n, d] -> [B, T, n + 1, d]
        return mixed[..., 0, :], mixed[..., 1:, :], beta, alpha[..., 1:].transpose(-1, -2)

    def depth(self, y: torch.Tensor, h_res: torch.Tensor, post: torch.Tensor) -> torch.Tensor:
        return h_res + post.unsqueeze(-1) * y.unsqueeze(-2)

    def flops_per_token(self) -> dict[str, float]:
        """Forward FLOPs per token of this connection (normlab.model.flops): ``matmul`` the stream mixing
        ``[n + 1, n] @ [n, d]`` and the dynamic projections ``[n, d] @ [d, n + 1]`` and ``[n, d] @ [d]``;
        ``elementwise`` the depth connection's multiply (its add is the block's residual add), the norm, tanh and
        scales, the constraints (sigmoid ~ 4, Sinkhorn ~ 4 per entry per normalisation)."""
        n, d = self.streams, self.dim
        matmul = 2.0 * (n + 1) * n * d
        elementwise = float(n * d)  # post * y
        if self.dynamic:
            matmul += 2.0 * n * d * (n + 1) + 2.0 * n * d
            elementwise += 4.0 * n * d + 4.0 * n * (n + 2)  # norm (square, sum, divide, gain) + act/scale/add
        elementwise += self.constraint_flops()
        return {"matmul": matmul, "elementwise": elementwise}

    def constraint_flops(self) -> float:
        return 0.0

    def extra_repr(self) -> str:
        return f"streams={self.streams}, dim={self.dim}, layer={self.layer}, dynamic={self.dynamic}"


@register_residual("hc", "Zhu et al. 2025, Hyper-Connections (ICLR 2025, arXiv:2409.19606)")
class HyperConnection(_Connection):
    """Hyper-connections (Zhu et al. 2025, arXiv:2409.19606; Algorithm 2 of its Appendix J; reference: the
    ``hyper-connections`` package's ``HyperConnections``, ``tanh=True``). Unconstrained maps::

        alpha = static_alpha + dynamic_alpha_scale * tanh(norm(h) @ dynamic_alpha_fn)    [B, T, n, n + 1]
        beta  = static_beta  + dynamic_beta_scale  * tanh(norm(h) @ dynamic_beta_fn)     [B, T, n]

    (static only with ``dynamic=False``: SHC, the paper's static variant). ``h [B, T, n, d]``.
    """

    description = "n residual streams mixed by learnable (static + dynamic) width and depth connections"

    def __init__(self, streams: int, dim: int, layer: int, *, dynamic: bool = True, sinkhorn_iters: int = 20,
                 alpha_init: float = 0.05):
        super().__init__(streams, dim, layer, dynamic=dynamic, sinkhorn_iters=sinkhorn_iters)
        if dynamic:
            self.dynamic_alpha_scale = nn.Parameter(torch.full((), 1e-2))
            self.dynamic_beta_scale = nn.Parameter(torch.full((), 1e-2))

    def maps(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.dynamic:
            return self.static()
        normed = self.norm(h)
        alpha = torch.tanh(normed @ self.dynamic_alpha_fn) * self.dynamic_alpha_scale + self.static_alpha
        beta = torch.tanh(_mv(normed, self.dynamic_beta_fn)) * self.dynamic_beta_scale + self.static_beta
        return alpha, beta


@register_residual("mhc", "Xie et al. 2025, mHC: Manifold-Constrained Hyper-Connections (arXiv:2512.24880)")
class ManifoldHyperConnection(_Connection):
    """Manifold-constrained hyper-connections (DeepSeek-AI, arXiv:2512.24880, eqs. 7-9; reference: the
    ``hyper-connections`` package's ``ManifoldConstrainedHyperConnections``). Unconstrained maps without tanh::

        alpha = static_alpha + [pre_branch_scale | residual_scale * 1_n] * (norm(h) @ dynamic_alpha_fn)
        beta  = static_beta  + h_post_scale * (norm(h) @ dynamic_beta_fn)

    then ``H_pre = sigmoid(alpha[..., 0])``, ``H_res^T = SinkhornKnopp(alpha[..., 1:], sinkhorn_iters)``,
    ``H_post = 2 sigmoid(beta)``. ``h [B, T, n, d]``.
    """

    description = "hyper-connections with a doubly stochastic (Sinkhorn-Knopp) stream mixing and non-negative gates"

    def __init__(self, streams: int, dim: int, layer: int, *, dynamic: bool = True, sinkhorn_iters: int = 20,
                 alpha_init: float = 0.05):
        super().__init__(streams, dim, layer, dynamic=dynamic, sinkhorn_iters=sinkhorn_iters)
        if dynamic:
            self.pre_branch_scale = nn.Parameter(torch.full((1,), 1e-2))
            self.residual_scale = nn.Parameter(torch.full((1,), 1e-2))
            self.h_post_scale = nn.Parameter(torch.full((), 1e-2))

    def maps(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.dynamic:
            return self.static()
        normed = self.norm(h)
        scale = torch.cat((self.pre_branch_scale, self.residual_scale.expand(self.streams)))
        alpha = (normed @ self.dynamic_alpha_fn) * scale + self.static_alpha
        beta = _mv(normed, self.dynamic_beta_fn) * self.h_post_scale + self.static_beta
        return alpha, beta

    def static(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The static maps ``[n, n + 1]``, ``[n]`` (broadcast over tokens), as copies: a view of a parameter made
        under ``no_grad`` carries ``requires_grad`` without a graph, which torch's module hooks refuse."""
        return self.static_alpha.clone(), self.static_beta.clone()

    def constrain(self, alpha: torch.Tensor, beta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        res = sinkhorn_knopp(alpha[..., 1:], self.sinkhorn_iters)
        return torch.cat((alpha[..., :1].sigmoid(), res), dim=-1), beta.sigmoid() * 2

    def constraint_flops(self) -> float:
        n = self.streams
        return 4.0 * (n + 1) + 4.0 * n + n * n * (2 + 8 * self.sinkhorn_iters)


@register_residual("ngpt", "Loshchilov et al. 2025, nGPT: Normalized Transformer with Representation Learning on the "
                           "Hypersphere (ICLR 2025, arXiv:2410.01131)")
class HypersphereStep(nn.Module):
    """nGPT's residual update on the unit hypersphere (Loshchilov, Hsieh, Sun & Ginsburg 2025, arXiv:2410.01131,
    eqs. 10-11; code NVIDIA/ngpt ``Block.forward``)::

        h <- Norm(h + |alpha| * (Norm(F(h)) - h))        Norm(x) = x / ||x||_2,  alpha [d] the eigen learning rate

    ``alpha`` (``alpha_A`` around attention, ``alpha_M`` around the MLP) is stored scaled as the authors do:
    parameter ``alpha [d]`` initialised to ``1/sqrt(d)``, used as ``alpha * (alpha_init * sqrt(d))`` (so its
    effective learning rate is ``sqrt(d)`` times the optimizer's; ``alpha_init`` 0.05, ``model.ngpt_alpha_init``).
    The branch reads ``h`` itself (no input norm: ``h`` is unit-norm). ``forward(h [B, T, d]) -> (h, h, None,
    None)``; ``depth(y [B, T, d], h, None) -> [B, T, d]`` unit-norm. The other parts of nGPT (unit-norm
    embeddings and weight rows, scaled q/k, s_u / s_v, scaled logits) are the model's (``normalized = True``;
    normlab.model.gpt, docs/streams.md).
    """

    description = "nGPT: hidden states on the unit hypersphere, updated by eigen learning rates"
    no_weight_decay = True
    multi_stream = False
    normalized = True

    def __init__(self, streams: int, dim: int, layer: int, *, dynamic: bool = True, sinkhorn_iters: int = 20,
                 alpha_init: float = 0.05):
        super().__init__()
        self.dim, self.layer, self.alpha_init, self.base = dim, layer, alpha_init, 1.0 / math.sqrt(dim)
        self.streams = 1
        self.alpha = nn.Parameter(torch.full((dim,), self.base))

    def forward(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None, None]:
        return h, h, None, None

    def depth(self, y: torch.Tensor, h: torch.Tensor, _post: Any = None) -> torch.Tensor:
        lr = (self.alpha * (self.alpha_init / self.base)).abs()
        a = unit(h)
        return unit(a + lr * (unit(y) - a))

    def flops_per_token(self) -> dict[str, float]:
        """Three unit normalisations (square, sum, divide: 3 per element) and the update (subtract, multiply, add)
        per token; no matmul (the residual add is counted by the block)."""
        return {"matmul": 0.0, "elementwise": 9.0 * self.dim + 2.0 * self.dim}

    def extra_repr(self) -> str:
        return f"dim={self.dim}, layer={self.layer}, alpha_init={self.alpha_init}"


def build_connections(cfg: Any, block: int) -> tuple[nn.Module, nn.Module] | None:
    """The (attention, MLP) connections of block ``block`` for ``cfg`` (a ModelConfig), None for ``add``."""
    cls = get_connection_class(cfg.residual)
    if cls is None:
        return None
    kw: dict[str, Any] = dict(dynamic=cfg.hc_dynamic, sinkhorn_iters=cfg.sinkhorn_iters, alpha_init=cfg.ngpt_alpha_init)
    return (cls(cfg.streams, cfg.width, 2 * block, **kw), cls(cfg.streams, cfg.width, 2 * block + 1, **kw))
