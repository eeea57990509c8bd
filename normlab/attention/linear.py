"""Causal linear attention with division normalisation (``model.attention: linear``).

LINA: Wang et al. 2026 (repo techmonsterwang/LINA), after Katharopoulos et al. 2020, "Transformers are RNNs: Fast
Autoregressive Transformers with Linear Attention". Kernel ``phi(x) = relu(x) + 1e-6``; for query ``i``:

    out_i = phi(q_i) S_i / (phi(q_i) . z_i + 1e-6),   S_i = sum_{j<=i} phi(k_j) v_j^T,   z_i = sum_{j<=i} phi(k_j)

(the authors' vision code is bidirectional and divides sums by N; causal prefix sums are used here, and the
1/N factors cancel up to the epsilon). Three equal evaluations of the same map (tests check them against each other):

- :func:`linear_attention_parallel` -- the masked ``T x T`` form (reference; O(T^2) time and memory);
- :func:`linear_attention_chunked` -- chunks of ``C`` tokens: an exact masked ``C x C`` product inside each chunk
  plus the prefix state of the chunks before it (O(T C d + T d^2) time, O(T (C + d^2 / C)) memory: linear in T);
- :func:`linear_attention_recurrent` -- token by token on ``(S, z)``, the generation path.

The numerator and the denominator may use different features (``qn, kn`` vs ``qd, kd``): NaLaFormer rotates its
features with RoPE in the numerator only (normlab.attention.nala).

Options of the module (LINA's released variants):

- ``conv`` ``K > 0``: a causal depthwise 1-D convolution (kernel ``K``, e.g. 4) added to the attention output
  before the output projection. ``conv_source`` says what it convolves:

  * ``input`` -- LINA's locality branch (Wang et al. 2026, repo techmonsterwang/LINA,
    ``LinearAttentionDecoder.dw_conv``: ``nn.Conv2d(dim, dim, 5, padding=2, groups=dim)`` applied to the block's
    attention input ``x``, with a bias, then ``x = attn_out + conv_out; proj(x)``), made causal and 1-D here:
    ``conv(x) [B, T, width]`` from ``x [B, T, width]`` (needs ``in_width == width``); the bias is always on, as theirs.
  * ``value`` -- NaLaFormer's locality branch (Meng et al. 2025, repo ZacharyMeng/NaLaFormer, the ``lepe``
    depthwise conv on the values ``v``), made causal and 1-D: ``conv(v)`` per channel; bias as ``model.bias``.
- ``gate``: the KV gate. ``static``: learnable data-independent scales per head and position (ones init; their
  ``key_scale`` / ``value_scale`` of shape ``[1, H, N, 1]``) on ``phi(k)`` and ``v``; positions past ``context`` have
  no scale (refused). ``sigmoid``: data-dependent per token and head, ``exp(log(sigmoid(W x)) / 16)`` in ``(0, 1]``
  from two ``Linear(in_width, H)`` (``key_gate``, ``value_gate``), as in their ``kvscale6`` variant.

``qk_norm`` (as for softmax attention: RMSNorm over head_dim with a gain, before RoPE and the kernel) bounds the
feature magnitudes.

Positions: RoPE rotates q and k before the kernel (as LINA's ``pe_func``); learned / none need nothing here; ALiBi is
refused (no score matrix to bias). Incremental decoding state: ``S [B, H, dk, dv]``, ``z [B, H, dk]`` and the last
``K - 1`` convolution inputs (values or attention inputs).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from normlab.attention.base import AttentionBase, AttentionState
from normlab.attention.positions import RotaryEmbedding
from normlab.attention.registry import register_attention
from normlab.errors import NormlabError, unknown
from normlab.norms.modules import RMSNorm
from normlab.validate import I

KERNEL_EPS = 1e-6  # phi(x) = relu(x) + KERNEL_EPS
DEN_EPS = 1e-6  # out = num / (den + DEN_EPS)
GATE_NORM = 16.0  # sigmoid gate: exp(log(sigmoid(W x)) / GATE_NORM)
GATES = ("none", "static", "sigmoid")
CONV_SOURCES = ("value", "input")  # NaLaFormer's value conv / LINA's input conv (see the module docstring)


def relu_kernel(x: torch.Tensor) -> torch.Tensor:
    """``phi(x) = relu(x) + 1e-6`` (LINA's kernel): positive features, so the denominator stays positive."""
    return F.relu(x) + KERNEL_EPS


def linear_attention_parallel(qn, kn, v, qd=None, kd=None) -> torch.Tensor:
    """Masked ``T x T`` form: ``out_i = sum_{j<=i} (qn_i.kn_j) v_j / (sum_{j<=i} qd_i.kd_j + 1e-6)``.

    ``qn, kn [B, H, T, dk]``, ``v [B, H, T, dv]``; ``qd, kd`` default to ``qn, kn``. Returns ``[B, H, T, dv]``.
    """
    qd, kd = (qn if qd is None else qd), (kn if kd is None else kd)
    T = qn.shape[-2]
    mask = torch.ones(T, T, dtype=torch.bool, device=qn.device).tril()
    num = ((qn @ kn.transpose(-2, -1)) * mask) @ v
    den = ((qd @ kd.transpose(-2, -1)) * mask).sum(-1, keepdim=True)
    return num / (den + DEN_EPS)


def linear_attention_chunked(qn, kn, v, qd=None, kd=None, *, chunk: int = 64, state=None):
    """Chunk-wise prefix sums. Returns ``(out [B, H, T, dv], (S [B, H, dk, dv], z [B, H, dkd]))``.

    ``state = (S0, z0)`` continues from earlier tokens (None = start of sequence). Inside a chunk the masked
    ``C x C`` product is exact; across chunks the states before each chunk (``S``: sums of ``kn^T v``, ``z``: sums of
    ``kd``) are exclusive prefix sums over the ``n = T / C`` chunks, taken as one ``n x n`` strictly-lower-triangular
    matmul (no Python loop over T, no cumsum over T). ``T`` need not be a multiple of ``chunk`` (zero padding: padded
    keys and values add nothing, padded queries are dropped).
    """
    qd, kd = (qn if qd is None else qd), (kn if kd is None else kd)
    same = qd is qn and kd is kn  # one set of features (linear): the denominator reuses the numerator's weights
    B, H, T, dk = qn.shape
    dv, dkd = v.shape[-1], kd.shape[-1]
    S0, z0 = state if state is not None else (None, None)
    C = max(1, min(chunk, T))
    n = -(-T // C)
    if n * C != T:
        pad = (0, 0, 0, n * C - T)
        qn, kn, v, qd, kd = (F.pad(t, pad) for t in (qn, kn, v, qd, kd))
    qc, kc, vc = qn.reshape(B, H, n, C, dk), kn.reshape(B, H, n, C, dk), v.reshape(B, H, n, C, dv)
    before = torch.ones(n, n, dtype=qn.dtype, device=qn.device).tril(-1)  # chunk c sees chunks < c
    mask = torch.ones(C, C, dtype=qn.dtype, device=qn.device).tril()
    kv = kc.transpose(-2, -1) @ vc  # [B, H, n, dk, dv]: each chunk's sum of kn^T v
    S = (before @ kv.reshape(B, H, n, dk * dv)).view(B, H, n, dk, dv)  # state before each chunk
    if S0 is not None:
        S = S + S0.unsqueeze(2)
    A = (qc @ kc.transpose(-2, -1)) * mask  # [B, H, n, C, C]
    num = qc @ S + A @ vc
    if same:  # the denominator's in-chunk part is the row sum of the numerator's weights
        qdc, zc, den_in = qc, kc.sum(-2), A.sum(-1, keepdim=True)
    else:
        qdc, kdc = qd.reshape(B, H, n, C, dkd), kd.reshape(B, H, n, C, dkd)
        zc, den_in = kdc.sum(-2), ((qdc @ kdc.transpose(-2, -1)) * mask).sum(-1, keepdim=True)
    z = before @ zc  # [B, H, n, dkd]: sum of kd before each chunk
    if z0 is not None:
        z = z + z0.unsqueeze(2)
    den = qdc @ z.unsqueeze(-1) + den_in + DEN_EPS  # [B, H, n, C, 1]
    out = (num / den).reshape(B, H, n * C, dv)[:, :, :T]
    return out, (S[:, :, -1] + kv[:, :, -1], z[:, :, -1] + zc[:, :, -1])


def chunked_matmul_flops(T: int, chunk: int, dk: int, dv: int, dkd: int | None = None, *, same: bool = True,
                         denominator: bool = True) -> float:
    """Matmul FLOPs of :func:`linear_attention_chunked` for one head of one ``T``-token sequence (``2 m n k`` per
    product, padding to whole chunks included): ``kn^T v`` per chunk, the prefix over chunks, the masked ``C x C``
    scores, ``q S`` and ``A v``; with ``denominator`` the prefix of ``kd``, ``qd . z`` and, when the denominator
    has its own features (``same`` False), their ``C x C`` scores. ``denominator=False`` is TransNormer's
    ``norm_linear_chunked``."""
    dkd = dk if dkd is None else dkd
    C = max(1, min(chunk, T))
    n = -(-T // C)
    f = 2 * n * C * dk * dv + 2 * n * n * dk * dv + 2 * n * C * C * dk + 2 * n * C * dk * dv + 2 * n * C * C * dv
    if denominator:
        f += 2 * n * n * dkd + 2 * n * C * dkd + (0 if same else 2 * n * C * C * dkd)
    return float(f)


def linear_attention_recurrent(qn, kn, v, qd=None, kd=None, state=None):
    """Token by token: ``S += kn_t v_t^T``, ``z += kd_t``, ``out_t = qn_t S / (qd_t . z + 1e-6)``.

    Same arguments and return value as :func:`linear_attention_chunked`.
    """
    qd, kd = (qn if qd is None else qd), (kn if kd is None else kd)
    B, H, T, dk = qn.shape
    if state is None:
        S = qn.new_zeros(B, H, dk, v.shape[-1])
        z = qn.new_zeros(B, H, kd.shape[-1])
    else:
        S, z = state
    outs = []
    for t in range(T):
        S = S + kn[:, :, t, :, None] * v[:, :, t, None, :]
        z = z + kd[:, :, t]
        num = (qn[:, :, t, None, :] @ S).squeeze(-2)
        den = (qd[:, :, t] * z).sum(-1, keepdim=True) + DEN_EPS
        outs.append(num / den)
    return torch.stack(outs, dim=2), (S, z)


@register_attention("linear")
class LinearAttention(AttentionBase):
    """Causal linear attention. ``x [B, T, in_width] -> [B, T, out_width]``.

    Parameters: ``qkv``, ``proj``; with ``qk_norm`` ``q_norm.weight`` / ``k_norm.weight``; with ``conv``
    ``conv.weight [width, 1, K]`` (+ ``conv.bias [width]``: always with ``conv_source='input'``, as LINA); with
    ``gate='static'``
    ``key_scale`` / ``value_scale`` (flat ``[heads * context]``, ones: 1-D, so the optimizer groups them with the
    biases: no weight decay); with ``gate='sigmoid'`` ``key_gate`` / ``value_gate`` (``Linear(in_width, H)``).
    Subclasses change the features (:meth:`features`) and the output transform (:meth:`finish`).
    """

    paper = "Wang et al. 2026, LINA (repo techmonsterwang/LINA); after Katharopoulos et al. 2020 (arXiv:2006.16236)"
    description = "relu kernel features, causal division normalisation; optional depthwise conv and KV gate"
    score_matrix = False  # kernel features and a running state: no T x T matrix (no ALiBi, no sinks)
    options = {k: (d, "model.linear_conv / model.linear_gate apply to linear and nala attention, not '{att}'")
               for k, d in (("linear_conv", 0), ("linear_gate", "none"), ("linear_conv_source", "value"))}
    # linear_conv: a kernel size, 0 = off; linear_chunk: a speed knob, not an option (any kind may carry it)
    ranges = {"linear_conv": I(0, 1024), "linear_chunk": I(1, 2**20)}

    @classmethod
    def check_keys(cls, cfg) -> None:
        if cfg.linear_gate not in GATES:
            raise unknown("model.linear_gate", cfg.linear_gate, GATES)
        if cfg.linear_conv_source not in CONV_SOURCES:
            raise unknown("model.linear_conv_source", cfg.linear_conv_source, CONV_SOURCES)

    @classmethod
    def check_context(cls, cfg, context: int) -> None:
        """``linear_gate: static`` has one scale per training position: a longer context is a one-line error."""
        if cfg.linear_gate == "static" and context > cfg.context:
            raise NormlabError(f"context {context} exceeds the static KV-gate table ({cfg.context} positions); "
                               "model.linear_gate 'static' cannot extrapolate")

    @classmethod
    def check_config(cls, cfg) -> None:
        if cfg.linear_conv_source != "value" and not cfg.linear_conv:
            raise NormlabError("model.linear_conv_source picks what model.linear_conv convolves; set model.linear_conv "
                               "(a kernel size, e.g. 4) too")

    @classmethod
    def from_config(cls, cfg, rope: RotaryEmbedding | None, **common) -> "LinearAttention":
        return cls(cfg.width, cfg.heads, context=cfg.context, conv=cfg.linear_conv,
                   conv_source=cfg.linear_conv_source, gate=cfg.linear_gate, chunk=cfg.linear_chunk,
                   qk_norm=cfg.qk_norm, norm_eps=cfg.norm_eps, rope=rope, **common)

    def __init__(self, width: int, heads: int, *, in_width: int | None = None, out_width: int | None = None,
                 bias: bool = False, dropout: float = 0.0, rope: RotaryEmbedding | None = None, context: int = 0,
                 conv: int = 0, conv_source: str = "value", gate: str = "none", chunk: int = 64,
                 qk_norm: bool = False, norm_eps: float = 1e-6):
        super().__init__(width, heads, in_width=in_width, out_width=out_width, bias=bias, dropout=dropout)
        if gate not in GATES:
            raise ValueError(f"gate must be one of {GATES}, got {gate!r}")
        if conv_source not in CONV_SOURCES:
            raise ValueError(f"conv_source must be one of {CONV_SOURCES}, got {conv_source!r}")
        if conv > 0 and conv_source == "input" and self.in_width != width:
            raise ValueError(f"conv_source 'input' convolves the attention input channel by channel: it needs "
                             f"in_width == width, got {self.in_width} and {width}")
        self.rope, self.chunk, self.gate_kind, self.context = rope, chunk, gate, context
        self.conv_source = conv_source
        conv_bias = True if conv_source == "input" else bias  # LINA's dw_conv has a bias (nn.Conv2d default)
        self.conv = nn.Conv1d(width, width, conv, groups=width, bias=conv_bias) if conv > 0 else None
        if qk_norm:  # as in softmax attention: RMSNorm over head_dim (learnable gain) before RoPE and the kernel
            self.q_norm = RMSNorm(self.head_dim, eps=norm_eps)
            self.k_norm = RMSNorm(self.head_dim, eps=norm_eps)
        else:
            self.q_norm = self.k_norm = None
        if gate == "static":
            if context < 1:
                raise ValueError("gate 'static' needs the context length (per-position scales)")
            self.key_scale = nn.Parameter(torch.ones(heads * context))
            self.value_scale = nn.Parameter(torch.ones(heads * context))
        elif gate == "sigmoid":
            self.key_gate = nn.Linear(self.in_width, heads, bias=True)
            self.value_gate = nn.Linear(self.in_width, heads, bias=True)

    # -- the pieces a subclass may change -------------------------------------------------------------------
    def features(self, q: torch.Tensor, k: torch.Tensor, offset: int):
        """``(qn, kn, qd, kd)``: numerator and denominator features of q, k ``[B, H, T, hd]`` (positions from
        ``offset``). LINA: RoPE, then ``relu + 1e-6``; the same features on both sides."""
        if self.rope is not None:
            q, k = self.rope(q, k, offset)
        q, k = relu_kernel(q), relu_kernel(k)
        return q, k, q, k

    def finish(self, y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Transform of the merged attention output ``y [B, T, width]`` before ``proj`` (identity here)."""
        return y

    # -------------------------------------------------------------------------------------------------------
    def gates(self, x: torch.Tensor, offset: int):
        """Key and value scales ``[B or 1, H, T, 1]`` (None without a gate)."""
        T = x.shape[1]
        if self.gate_kind == "static":
            if offset + T > self.context:
                raise ValueError(f"sequence position {offset + T} exceeds the static KV-gate table ({self.context} "
                                 "positions); model.linear_gate 'static' cannot extrapolate")
            ks = self.key_scale.view(self.heads, self.context)[:, offset : offset + T]
            vs = self.value_scale.view(self.heads, self.context)[:, offset : offset + T]
            return ks[None, :, :, None], vs[None, :, :, None]
        if self.gate_kind == "sigmoid":
            ks = torch.exp(F.logsigmoid(self.key_gate(x)) / GATE_NORM)  # [B, T, H]
            vs = torch.exp(F.logsigmoid(self.value_gate(x)) / GATE_NORM)
            return ks.transpose(1, 2)[..., None], vs.transpose(1, 2)[..., None]
        return None, None

    def local(self, v: torch.Tensor, state: AttentionState | None) -> torch.Tensor:
        """Causal depthwise conv over ``v [B, T, width]`` (the values, or the attention input with
        ``conv_source='input'``); left context: zeros, or the cached last ``K - 1`` inputs when decoding."""
        K = self.conv.kernel_size[0]
        prev = state.tensors.get("conv") if state is not None else None
        if prev is None:
            prev = v.new_zeros(v.shape[0], K - 1, v.shape[2])
        ext = torch.cat([prev, v], dim=1)  # [B, K-1+T, width]
        if state is not None:
            state.tensors["conv"] = ext[:, ext.shape[1] - (K - 1):]
        return self.conv(ext.transpose(1, 2)).transpose(1, 2)

    feature_dim = 1  # features per head_dim channel (nala: 2, the sign split)

    def mixing_flops(self, t_q: int, t_k: int) -> dict[str, float]:
        """Forward FLOPs of one full-sequence token mixing (``t_q == t_k``, all heads): ``matmul`` from
        :func:`chunked_matmul_flops` (the numerator and denominator share features unless RoPE rotates the
        numerator's, as nala does); ``elementwise``: the kernel on q and k (2 per element), the division (1 per
        output element), RoPE (3 per q / k element), the conv (counted as a module) excluded."""
        dk = self.feature_dim * self.head_dim
        same = self.feature_dim == 1 or self.rope is None
        mm = self.heads * chunked_matmul_flops(t_q, self.chunk, dk, self.head_dim, same=same)
        rope = 3 * 2 * t_q * dk * self.heads if self.rope is not None else 0
        return {"matmul": mm, "elementwise": float(2 * 2 * t_q * dk * self.heads + t_q * self.width + rope)}

    def forward(self, x: torch.Tensor, state: AttentionState | None = None) -> torch.Tensor:
        B, T, _ = x.shape
        offset = state.pos if state is not None else 0
        q, k, v = self.split_heads(x)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        work = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype  # prefix sums in >= fp32
        v_raw = v
        qn, kn, qd, kd = (t.to(work) for t in self.features(q, k, offset))
        v = v.to(work)
        ks, vs = self.gates(x, offset)
        if ks is not None:
            same = kd is kn
            kn = kn * ks
            kd, v = (kn if same else kd * ks), v * vs
        prev = (state.tensors["S"], state.tensors["z"]) if state is not None and "S" in state.tensors else None
        y, (S, z) = linear_attention_chunked(qn, kn, v, qd, kd, chunk=self.chunk, state=prev)
        y = self.merge_heads(y.to(q.dtype))
        if self.conv is not None:
            y = y + self.local(x if self.conv_source == "input" else self.merge_heads(v_raw), state)
        if state is not None:
            state.tensors["S"], state.tensors["z"] = S, z
            state.pos += T
        return self.out(self.finish(y, x))
