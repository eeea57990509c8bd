"""Seeded random order-K Markov sources with an exact entropy rate.

A source over an alphabet of ``V`` symbols with order ``K`` has ``N = V**K`` contexts. A context is the last
``K`` symbols, encoded as the integer ``c = sum_i s[t-K+i] * V**(K-1-i)`` (oldest symbol most significant);
emitting symbol ``s`` from context ``c`` moves the chain to context ``(c * V + s) % N``. The transition table
``P`` has shape ``[N, V]``: ``P[c, s] = Pr(next symbol = s | context c)``; every row is drawn from a symmetric
Dirichlet(concentration) with a numpy ``Generator``.

Entropy rate (Cover & Thomas, "Elements of Information Theory", Thm 4.2.4): for a stationary Markov chain
``H = sum_c pi(c) * H(P(.|c))`` where ``pi`` is the stationary distribution over contexts. One symbol is
rendered as one byte, so bits per symbol == bits per byte.
"""

from __future__ import annotations

import bisect
import math

import numpy as np

from normlab.errors import NormlabError

# Printable symbols, one byte each; symbol i is rendered as SYMBOLS[i].
SYMBOLS = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789+/"
MAX_ALPHABET = len(SYMBOLS)  # 64
MAX_STATES = 2**16  # V**K contexts
MAX_TABLE = 2**20  # V**(K+1) transition probabilities (8 MiB of float64)
_DIRECT_FIRST_MAX = 1024  # contexts up to which the dense solve is tried first
_DIRECT_SOLVE_MAX = 4096  # contexts up to which a dense solve is allowed (a 128 MiB matrix, ~2 s)
_MAX_ITER = 20_000  # damped power iterations before giving up (a deterministic bound, not a timeout)
_TOL = 1e-12


def _check_table(P: np.ndarray, alphabet: int) -> int:
    """Validate a transition table ``P [N, V]`` and return ``N``."""
    P = np.asarray(P)
    if P.ndim != 2 or P.shape[1] != alphabet:
        raise NormlabError(f"transition table must have shape [V**K, {alphabet}]; got {list(P.shape)}")
    if np.any(P < 0) or not np.allclose(P.sum(axis=1), 1.0, atol=1e-9):
        raise NormlabError("transition table rows must be probability distributions (>= 0, sum 1)")
    return P.shape[0]


def _step(pi: np.ndarray, P: np.ndarray) -> np.ndarray:
    """One chain step on the context distribution: ``pi' = pi T``.

    Context ``c`` and symbol ``s`` go to ``(c*V + s) % N``; the flat index of ``(c, s)`` in ``P`` is
    ``c*V + s``, so reshaping the ``[N, V]`` flow to ``[V, N]`` and summing the first axis adds up exactly
    the flows entering each context.
    """
    n, v = P.shape
    return (pi[:, None] * P).reshape(v, n).sum(axis=0)


def _direct_solve(P: np.ndarray) -> np.ndarray:
    """Solve ``pi (T - I) = 0, sum(pi) = 1`` with a dense ``[N, N]`` matrix (LinAlgError if singular)."""
    n, v = P.shape
    T = np.zeros((n, n))
    np.add.at(T, (np.repeat(np.arange(n), v), np.arange(n * v) % n), P.reshape(-1))
    A = T.T  # a view: build the system in place to keep one n x n array
    A[np.diag_indices(n)] -= 1.0
    A[-1, :] = 1.0
    b = np.zeros(n)
    b[-1] = 1.0
    return np.linalg.solve(A, b)


def _power(P: np.ndarray, max_iter: int) -> np.ndarray:
    """Damped power iteration from uniform: ``pi <- 0.1 pi + 0.9 pi T`` until the L1 change is < 1e-14."""
    n = P.shape[0]
    pi = np.full(n, 1.0 / n)
    for _ in range(max_iter):
        new = 0.1 * pi + 0.9 * _step(pi, P)
        done = np.abs(new - pi).sum() < 1e-14
        pi = new
        if done:
            break
    return pi


def stationary_distribution(P: np.ndarray, alphabet: int) -> np.ndarray:
    """Stationary distribution ``pi [N]`` of the context chain of transition table ``P [N, V]``.

    Two methods, tried in turn until one passes the check ``pi >= 0, ||pi T - pi||_1 < 1e-12``:
    a dense linear solve of ``pi (T - I) = 0, sum(pi) = 1`` (only for N <= 4096 contexts; first for
    N <= 1024), and damped power iteration from uniform, ``pi <- 0.1 pi + 0.9 pi T`` (the damping makes
    periodic chains converge too), until the L1 change is below 1e-14: at most 2000 steps before the solve
    for 1024 < N <= 4096, else at most 20000. A singular solve (a reducible chain from exact zeros in ``P``)
    falls through to the iteration.
    """
    P = np.asarray(P, dtype=np.float64)
    n = _check_table(P, alphabet)
    if n == 1:
        return np.ones(1)
    direct = n <= _DIRECT_SOLVE_MAX
    if direct and n <= _DIRECT_FIRST_MAX:
        methods = [_direct_solve, lambda P: _power(P, _MAX_ITER)]
    elif direct:
        methods = [lambda P: _power(P, 2000), _direct_solve, lambda P: _power(P, _MAX_ITER)]
    else:
        methods = [lambda P: _power(P, _MAX_ITER)]
    for method in methods:
        try:
            pi = method(P)
        except np.linalg.LinAlgError:
            continue
        if np.all(np.isfinite(pi)) and np.all(pi > -1e-12):
            pi = np.clip(pi, 0.0, None)
            pi /= pi.sum()
            if np.abs(_step(pi, P) - pi).sum() < _TOL:
                return pi
    raise NormlabError(
        "Markov chain did not reach its stationary distribution; use a larger concentration or a lower order"
    )


def entropy_rate(P: np.ndarray, alphabet: int, pi: np.ndarray | None = None) -> float:
    """Exact entropy rate in bits per symbol: ``sum_c pi(c) * -sum_s P[c,s] log2 P[c,s]`` (0 log 0 = 0)."""
    P = np.asarray(P, dtype=np.float64)
    if pi is None:
        pi = stationary_distribution(P, alphabet)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(P > 0, -P * np.log2(np.where(P > 0, P, 1.0)), 0.0)
    return float(np.dot(pi, terms.sum(axis=1)))


def check_size(order: int, alphabet: int) -> None:
    """Refuse chains whose context count or transition table would be too large."""
    if alphabet**order > MAX_STATES or alphabet ** (order + 1) > MAX_TABLE:
        raise NormlabError(
            f"synthetic markov with alphabet={alphabet} order={order} is too large; allowed: "
            f"alphabet**order <= 2**16 contexts and alphabet**(order+1) <= 2**20 transition probabilities"
        )


def sample(P: np.ndarray, order: int, alphabet: int, length: int, rng: np.random.Generator,
           pi: np.ndarray | None = None) -> bytes:
    """Sample ``length`` symbols (returned as symbol indices 0..V-1, one per byte) starting from ``pi``.

    The first context is drawn from the stationary distribution, so the first ``order`` symbols are its
    digits and the whole sequence is a stationary process. Then one uniform per symbol, drawn in one call,
    is inverted through the context's cumulative row (``bisect`` on a Python list: ~0.3 us per symbol).
    """
    P = np.asarray(P, dtype=np.float64)
    n = _check_table(P, alphabet)
    if pi is None:
        pi = stationary_distribution(P, alphabet)
    c = int(rng.choice(n, p=pi))
    out = bytearray(length)
    digits = [(c // alphabet ** (order - 1 - i)) % alphabet for i in range(order)]
    for i, d in enumerate(digits[:length]):
        out[i] = d
    if length <= order:
        return bytes(out)
    cdf = np.cumsum(P, axis=1)
    cdf[:, -1] = 1.0  # uniforms are < 1, so the last symbol with mass closes every row
    rows = cdf.tolist()
    uniforms = rng.random(length - order).tolist()
    br = bisect.bisect_right
    t = order
    for u in uniforms:
        s = br(rows[c], u)
        out[t] = s
        c = (c * alphabet + s) % n
        t += 1
    return bytes(out)


def generate(order: int, alphabet: int, length: int, concentration: float, seed: int) -> tuple[bytes, dict]:
    """Draw a random order-K source and ``length`` printable bytes from it.

    Returns ``(data, info)`` with ``info`` holding ``entropy_rate_bpb`` (exact, bits per byte) and the
    smallest stationary context probability.
    """
    check_size(order, alphabet)
    rng = np.random.default_rng(seed)
    n = alphabet**order
    P = rng.dirichlet(np.full(alphabet, float(concentration)), size=n)
    pi = stationary_distribution(P, alphabet)
    h = entropy_rate(P, alphabet, pi)
    symbols = sample(P, order, alphabet, length, rng, pi)
    table = bytes(SYMBOLS[i] if i < alphabet else 0 for i in range(256))
    data = symbols.translate(table)
    if not math.isfinite(h):
        raise NormlabError("synthetic markov entropy rate is not finite; use a larger concentration")
    return data, {"entropy_rate_bpb": h, "max_entropy_bpb": math.log2(alphabet)}
