"""QuaRot-style rotation of the residual stream (Ashkboos et al. 2024, "QuaRot: Outlier-Free 4-Bit Inference in
Rotated LLMs", arXiv:2404.00456; repo spcl/QuaRot), fused into the weights.

Precondition: every norm is a parameter-free RMSNorm (``x / sqrt(mean(x^2) + eps)``), reached with normlab's
exact conversions (normlab/convert: fold the gains into the readers, zero-mean the writers, LayerNorm ->
RMSNorm; Jiang et al. 2023). For an orthogonal ``Q [d, d]``, ``rms(x Q) = rms(x)``, so ``RMSNorm(x Q) =
RMSNorm(x) Q`` and, with the residual stream stored as ``x Q``, the function is unchanged when (row vectors,
``nn.Linear`` weights ``W [out, in]``)::

    embeddings          E [V, d] -> E Q          (token and learned position tables)
    readers  W [o, d]   W -> W Q                 (attention qkv, MLP fc / gate, LM head; tied head = E Q too)
    writers  W [d, i]   W -> Q^T W,  b -> Q^T b  (attention proj, MLP proj)

``Q = H diag(s) / sqrt(d)`` with ``H`` a Hadamard matrix of order ``d`` and ``s`` random signs (the randomized
Hadamard transform). Orders: Sylvester ``2^k``; otherwise ``(q+1) 2^k`` with ``q`` a prime ``= 3 mod 4``
(Paley construction I, Kronecker with Sylvester; 768 = 12 x 64 as for GPT-2); otherwise a random orthogonal
matrix (QR of a Gaussian), which QuaRot reports also works, less well. The result says which.
Only the residual-stream rotation (QuaRot's fused ``Q``) is done; QuaRot's online Hadamards before the MLP
down-projection and on the KV cache are not simulated.
"""

from __future__ import annotations

import math
import re

import numpy as np
import torch
from torch import nn

from normlab.errors import NormlabError
from normlab.norms.modules import RMSNorm

_READERS = re.compile(r"tok_emb\.weight|pos_emb\.weight|lm_head\.weight|blocks\.\d+\.attn\.qkv\.weight"
                      r"|blocks\.\d+\.mlp\.(fc|gate)\.weight")
_WRITERS = re.compile(r"blocks\.\d+\.(attn|mlp)\.proj\.(weight|bias)")
_UNTOUCHED = re.compile(r"lm_head\.bias|blocks\.\d+\.attn\.qkv\.bias|blocks\.\d+\.mlp\.(fc|gate)\.bias"
                        r"|blocks\.\d+\.(attn|mlp)_res_scale|blocks\.\d+\.attn\.(q_norm|k_norm)\.weight|embed_scale")


def _is_prime(n: int) -> bool:
    return n >= 2 and all(n % p for p in range(2, int(math.isqrt(n)) + 1))


def sylvester(n: int) -> np.ndarray:
    """Hadamard matrix of order ``n = 2^k`` (Sylvester)."""
    h = np.ones((1, 1))
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h


def paley(q: int) -> np.ndarray:
    """Hadamard matrix of order ``q + 1`` for a prime ``q = 3 mod 4`` (Paley construction I)."""
    residues = {(i * i) % q for i in range(1, q)}
    chi = np.array([0] + [1 if a in residues else -1 for a in range(1, q)])
    jac = np.array([[chi[(i - j) % q] for j in range(q)] for i in range(q)])
    s = np.zeros((q + 1, q + 1))
    s[0, 1:], s[1:, 0], s[1:, 1:] = 1, -1, jac
    return np.eye(q + 1) + s


def hadamard(n: int) -> np.ndarray | None:
    """A Hadamard matrix of order ``n`` (``H H^T = n I``), or None when none of the constructions applies."""
    if n >= 1 and n & (n - 1) == 0:
        return sylvester(n)
    k = 0
    while n % (2 ** (k + 1)) == 0:
        k += 1
    for j in range(k, -1, -1):
        m = n // 2 ** j
        if m % 4 == 0 and _is_prime(m - 1) and (m - 1) % 4 == 3:
            h = np.kron(paley(m - 1), sylvester(2 ** j))
            if np.allclose(h @ h.T, n * np.eye(n)):
                return h
    return None


def random_rotation(d: int, seed: int = 0) -> tuple[torch.Tensor, str]:
    """Orthogonal ``Q [d, d]`` (float64): the randomized Hadamard ``H diag(s) / sqrt(d)`` when a Hadamard of
    order ``d`` is constructible, else a random orthogonal matrix; returns ``(Q, kind)``."""
    gen = torch.Generator().manual_seed(seed)
    h = hadamard(d)
    if h is not None:
        signs = torch.randint(0, 2, (d,), generator=gen).double() * 2 - 1
        return torch.from_numpy(h).double() * signs / math.sqrt(d), "randomized hadamard"
    a = torch.randn(d, d, generator=gen, dtype=torch.float64)
    q, r = torch.linalg.qr(a)
    return q * torch.sign(torch.diagonal(r)), "random orthogonal (no Hadamard of this order constructed)"


def check_rmsnorm_form(model: nn.Module) -> None:
    """Every norm module must be a parameter-free RMSNorm (or absent); else a one-line error."""
    for name, m in model.named_modules():
        if name.endswith(("attn_in", "mlp_in", "final_norm", "attn_out", "mlp_out", "attn_post", "mlp_post",
                          "embed_norm")) and not isinstance(m, nn.Identity):
            if not isinstance(m, RMSNorm) or m.weight is not None or m.bias is not None:
                raise NormlabError(f"cannot rotate: norm '{name}' is not a parameter-free RMSNorm "
                                   "(convert the model first: normlab.convert)")
            if name.endswith(("_out", "_post", "embed_norm")):
                raise NormlabError(f"cannot rotate: norm '{name}' acts on the residual stream itself")


@torch.no_grad()
def rotate_model(model: nn.Module, q: torch.Tensor) -> nn.Module:
    """Fuse the rotation ``q [d, d]`` into ``model`` (in place, computed in float64); returns the model."""
    check_rmsnorm_form(model)
    state = model.state_dict()
    new = {}
    for k, v in state.items():
        x = v.double()
        if _READERS.fullmatch(k):
            new[k] = x @ q
        elif _WRITERS.fullmatch(k):
            new[k] = q.T @ x
        elif _UNTOUCHED.fullmatch(k):
            continue
        else:
            raise NormlabError(f"cannot rotate: unsupported model component '{k}'")
    for k, x in new.items():
        state[k].copy_(x.to(state[k].dtype))
    return model
