"""Position encodings: RoPE (Su et al. 2021, "RoFormer", arXiv:2104.09864), ALiBi slopes and biases (Press et al.
2022), and the helpers shared by the attention kinds. Learned absolute positions live in ``GPT`` (an embedding
table added to the token embeddings); ``none`` (NoPE) adds nothing."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any, ClassVar

import torch
from torch import nn


class RotaryEmbedding(nn.Module):
    """Rotary position embedding over ``head_dim`` (pairs ``(x[2i], x[2i+1])`` rotated by ``pos * base^(-2i/d)``).

    ``forward(q, k, offset)``: q, k ``[B, H, T, head_dim]`` -> rotated q, k, positions ``offset .. offset+T-1``.

    The tables (angles in float64, then rounded once to each dtype) are built for positions ``0 .. context-1`` at
    construction (float32 and bfloat16: what training uses) and again when the module moves to another device
    (``_apply``), never inside a training forward: a compiled model sees constant tables and does not recompile
    after its first step (float64 / float16 tables are built on their first use). Positions past ``context``
    (extrapolation, long generation) get a table computed for that call and not kept. float32 / float64 inputs
    rotate as one complex multiply ``(x0 + i x1)(cos + i sin)`` (``view_as_complex``: no copy of a strided q / k
    view); other dtypes (bf16, fp16, which have no complex kernels on CPU), and every dtype under
    ``torch.compile``, as ``x * cos2 + swap(x) * sin2``. Both
    are ``torch.autograd.Function``s with ``setup_context`` and a generated vmap rule (``torch.func`` composes),
    whose backward is the transposed rotation (angle ``-pos * theta``). On CUDA in eager mode (bf16 / fp16, e.g.
    under autocast) the pair form runs as one compiled kernel forward and one backward (``_fused_pair_kernel``:
    ``torch.compile`` of the pure rotation, inside the autograd Function; not under a compiled model, a
    ``torch.func`` transform or a double backward, which keep the eager ops; the eager form, with one logged warning,
    where it cannot be compiled). On the CPU the rotation runs as it always did.
    """

    _COMPLEX: ClassVar[dict[torch.dtype, torch.dtype]] = {
        torch.float32: torch.complex64,
        torch.float64: torch.complex128,
    }
    _REAL = (torch.bfloat16, torch.float16)

    def __init__(self, head_dim: int, context: int, base: float = 10000.0, heads: int = 1):
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"RoPE needs an even head_dim, got {head_dim}")
        self.head_dim, self.context, self.base, self.heads = head_dim, context, base, heads
        # device anchor: a zero-size buffer that .to() / .cuda() move (the tables follow it in _apply)
        self.register_buffer("_anchor", torch.empty(0), persistent=False)
        self._tables: dict[tuple[torch.dtype, str], Any] = {}
        self._build()

    def angles(self, start: int, length: int) -> torch.Tensor:
        """``pos * base^(-2i/d)`` for positions ``start .. start+length-1``: float64 ``[length, head_dim/2]``."""
        inv_freq = 1.0 / (self.base ** (torch.arange(0, self.head_dim, 2, dtype=torch.float64) / self.head_dim))
        return torch.outer(torch.arange(start, start + length, dtype=torch.float64), inv_freq)

    def _table(self, dtype: torch.dtype, device: torch.device, start: int, length: int, form: str) -> Any:
        """``form`` ``complex``: ``[length, hd/2]`` ``cos + i sin`` (float32 / float64 only); ``pair``: the tables
        ``(cos2, sin2)`` ``[length, hd]`` (``cos2 = [c0, c0, c1, c1, ...]``, ``sin2 = [-s0, s0, -s1, s1, ...]``)."""
        a = self.angles(start, length)
        cos, sin = a.cos(), a.sin()
        if form == "complex":
            return torch.complex(cos, sin).to(device=device, dtype=self._COMPLEX[dtype])
        return (cos.repeat_interleave(2, -1).to(device=device, dtype=dtype),
                torch.stack((-sin, sin), -1).flatten(-2).to(device=device, dtype=dtype))

    # built at construction: what training uses (fp32 eager, fp32 compiled, bf16 autocast); the others on first use
    _PREBUILT = ((torch.float32, "complex"), (torch.float32, "pair"), (torch.bfloat16, "pair"))

    def _build(self) -> None:
        self._tables, self._qkv_tables, self._qkv_conj, self._split = {}, {}, {}, {}
        for key in self._PREBUILT:
            self._lookup(key, qkv=False), self._lookup(key, qkv=True)
            if key[1] == "complex":
                self._split_lookup(key[0])

    def _split_lookup(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """``rotate_split``'s tables: the q and k rows of the fused-projection table and of its conjugate,
        ``[context, 2, heads, hd/2]`` each (float32 at construction, float64 on first use)."""
        if dtype not in self._split:
            key = (dtype, "complex")
            self._split[dtype] = tuple(_capped(t[:, :2]) for t in (self._lookup(key, qkv=True), self._conj_lookup(key)))
        return self._split[dtype]

    def _conj_lookup(self, key: tuple[torch.dtype, str]) -> torch.Tensor:
        """The conjugate of the fused-projection table (the backward's rotation by ``-pos * theta``), resolved once
        on the ``[context, hd/2]`` table and laid out like the table itself (``_with_identity``: materialised over
        the heads up to its size cap, a broadcast view above it): a lazy ``conj()`` view would be resolved into a
        fresh copy on every backward."""
        if key not in self._qkv_conj:
            tab = self._table(key[0], self._anchor.device, 0, self.context, key[1])
            self._qkv_conj[key] = _with_identity(tab.conj().resolve_conj(), self.heads)
        return self._qkv_conj[key]

    def _lookup(self, key: tuple[torch.dtype, str], qkv: bool) -> Any:
        """The full-context table for ``key`` (built once; float64 / float16 on their first use)."""
        tables = self._qkv_tables if qkv else self._tables
        if key not in tables:
            tab = self._table(key[0], self._anchor.device, 0, self.context, key[1])
            tables[key] = _with_identity(tab, self.heads) if qkv else tab
        return tables[key]

    def _apply(self, fn, recurse: bool = True):  # .to() / .cuda() / .cpu(): rebuild the tables on the new device
        before = self._anchor.device
        out = super()._apply(fn, recurse)
        if self._anchor.device != before:
            self._build()
        return out

    def _form(self, dtype: torch.dtype) -> str:
        """``complex`` for float32 / float64 in eager mode; ``pair`` for other dtypes and under ``torch.compile``
        (inductor has no complex codegen, and fuses the pair form's multiply-adds into one kernel)."""
        if dtype not in self._COMPLEX and dtype not in self._REAL:
            raise TypeError(f"RoPE rotates floating tensors, got {dtype}")
        return "complex" if dtype in self._COMPLEX and not torch.compiler.is_compiling() else "pair"

    @staticmethod
    def _apply_table(x: torch.Tensor, tab: Any) -> torch.Tensor:
        if isinstance(tab, torch.Tensor):
            return _ComplexRotation.apply(x, tab)
        return _PairRotation.apply(x, *tab)

    def rotate(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """Rotate ``x [..., T, head_dim]`` (any strides) as positions ``offset .. offset+T-1``; same dtype."""
        T, key = x.shape[-2], (x.dtype, self._form(x.dtype))
        if offset + T <= self.context and x.device == self._anchor.device:
            tab = _rows(self._lookup(key, qkv=False), offset, T)
        else:  # past the table (or another device): a table for this call only
            tab = self._table(x.dtype, x.device, offset, T, key[1])
        return self._apply_table(x, tab)

    def forward(self, q: torch.Tensor, k: torch.Tensor, offset: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        return self.rotate(q, offset), self.rotate(k, offset)

    def rotate_split(self, qkv: torch.Tensor, offset: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The fused projection ``qkv [B, T, 3, H, head_dim]`` -> ``q, k, v [B, H, T, head_dim]``, q and k rotated as
        positions ``offset .. offset+T-1``: ``rotate_qkv`` followed by the head split, with the same values (v is
        never multiplied: ``rotate_qk`` rotates q and k alone, and v is the projection's own view). In
        float32 / float64 eager mode within the table, one autograd node does both: v is not multiplied by its
        identity factor, and the backward writes ``d qkv`` in the projection's layout in one pass (instead of
        stacking the three head gradients, rotating them and copying them back into that layout)."""
        T, H = qkv.shape[1], qkv.shape[3]
        if (qkv.dtype in self._COMPLEX and offset + T <= self.context and H == self.heads
                and qkv.device == self._anchor.device and not torch.compiler.is_compiling()):
            tabs = self._split_lookup(qkv.dtype)
            tab, conj = tabs if offset == 0 and T == self.context else (t[offset : offset + T] for t in tabs)
            fn = _ComplexRotateSplit if torch._C._are_functorch_transforms_active() else _ComplexRotateSplitEager
            return fn.apply(qkv, tab, conj)
        q, k = self.rotate_qk(qkv, offset).permute(2, 0, 3, 1, 4).unbind(0)
        return q, k, qkv[:, :, 2].transpose(1, 2)

    def rotate_qk(self, qkv: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """q and k of the fused projection ``qkv [B, T, 3, H, head_dim]`` rotated, as ``[B, T, 2, H, head_dim]``: the
        fused-projection table's q and k rows (``rotate_qkv``'s, less v's identity rows) on the ``[:, :, :2]`` view, so
        the pair form (bf16 / fp16, and every dtype under ``torch.compile``: the CUDA path) touches two thirds of
        ``rotate_qkv``'s elements, with the same values for q and k (elementwise, the same table entries)."""
        T, H, key = qkv.shape[1], qkv.shape[3], (qkv.dtype, self._form(qkv.dtype))
        if offset + T <= self.context and H == self.heads and qkv.device == self._anchor.device:
            tab = _rows(self._lookup(key, qkv=True), offset, T)
        else:
            tab = _with_identity(self._table(qkv.dtype, qkv.device, offset, T, key[1]), H)
        tab = tab[:, :2] if isinstance(tab, torch.Tensor) else tuple(t[:, :2] for t in tab)
        return self._apply_table(qkv[:, :, :2], tab)

    def rotate_qkv(self, qkv: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """Rotate q and k of the fused projection ``qkv [B, T, 3, H, head_dim]`` (v passes unchanged: its factor is
        ``1 + 0i``) in one kernel each way; the result keeps the ``[B, T, 3, H, hd]`` layout, so q, k, v split from
        it are the same strided views the attention kernel gets without RoPE (learned positions)."""
        T, H, key = qkv.shape[1], qkv.shape[3], (qkv.dtype, self._form(qkv.dtype))
        if offset + T <= self.context and H == self.heads and qkv.device == self._anchor.device:
            tab = _rows(self._lookup(key, qkv=True), offset, T)
        else:
            tab = _with_identity(self._table(qkv.dtype, qkv.device, offset, T, key[1]), H)
        return self._apply_table(qkv, tab)


def _rows(tab: Any, offset: int, T: int) -> Any:
    """Rows ``offset .. offset+T-1`` of a table or of a pair of tables."""
    if isinstance(tab, torch.Tensor):
        return tab[offset : offset + T]
    return tuple(t[offset : offset + T] for t in tab)


TABLE_CAP = 2**22  # entries: a complex table over the heads is materialised up to this size (32 MiB in complex64)


def _capped(t: torch.Tensor) -> torch.Tensor:
    """``t`` contiguous when it has at most ``TABLE_CAP`` entries (one long loop in the multiply), else as it is (a
    broadcast view over the heads: no memory per head for long contexts)."""
    return t.contiguous() if t.numel() <= TABLE_CAP else t


def _with_identity(tab: Any, heads: int) -> Any:
    """A ``[T, hd/2]`` complex table (or ``[T, hd]`` pair tables) as ``[T, 3, heads, .]`` for the ``(q, k, v)``
    heads of a fused projection, v's rows the identity (``1 + 0i``; ``cos2 = 1, sin2 = 0``). Materialised over the
    heads (not a broadcast view): the multiply then runs as one long contiguous loop, about 3x faster on CPU than
    broadcasting a ``[T, 3, 1, .]`` table over ``heads`` (inner loops of ``hd/2`` elements)."""

    def qkv(t: torch.Tensor, v_row: torch.Tensor) -> torch.Tensor:
        out = torch.stack((t, t, v_row), 1)[:, :, None].expand(-1, -1, heads, -1)
        # materialised for the eager complex multiply (up to 2^22 entries: 32 MiB in complex64); the pair form runs
        # compiled (inductor broadcasts in its fused kernel) or in bf16, so it stays a broadcast view
        return _capped(out) if t.is_complex() else out

    if isinstance(tab, torch.Tensor):
        return qkv(tab, torch.ones_like(tab))
    cos2, sin2 = tab
    return qkv(cos2, torch.ones_like(cos2)), qkv(sin2, torch.zeros_like(sin2))


def _as_complex(x: torch.Tensor) -> torch.Tensor:
    """``x [..., hd]`` (float32/64) as complex ``[..., hd/2]`` pairs ``x[2i] + i x[2i+1]``: a view when the last dim
    is unit-stride and the others even (the attention layer's permuted q / k), else of a contiguous copy."""
    pairs = x.unflatten(-1, (-1, 2))
    if x.stride(-1) != 1 or any(s % 2 for s in x.stride()[:-1]):
        pairs = pairs.contiguous()
    return torch.view_as_complex(pairs)


class _ComplexRotation(torch.autograd.Function):
    """``y = x * f`` on complex pairs, ``f = cos + i sin`` ``[T, hd/2]`` a constant; ``dx = g * conj(f)`` (the
    rotation by the opposite angle is the transpose of a rotation). One elementwise kernel each way."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
        return torch.view_as_real(_as_complex(x) * f).flatten(-2)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        ctx.save_for_backward(inputs[1])

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        (f,) = ctx.saved_tensors
        return torch.view_as_real(_as_complex(g) * f.conj()).flatten(-2), None


def _rotate_split_forward(qkv: torch.Tensor, f: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    qk = torch.view_as_real(_as_complex(qkv[:, :, :2]) * f).flatten(-2)  # [B, T, 2, H, hd]
    return qk[:, :, 0].transpose(1, 2), qk[:, :, 1].transpose(1, 2), qkv[:, :, 2].transpose(1, 2)


def _rotate_split_backward(fc: torch.Tensor, gq: torch.Tensor, gk: torch.Tensor, gv: torch.Tensor) -> torch.Tensor:
    gq, gk, gv = gq.transpose(1, 2), gk.transpose(1, 2), gv.transpose(1, 2)  # [B, T, H, hd]
    if torch.is_grad_enabled() or torch._C._are_functorch_transforms_active():
        rot = torch.view_as_real(_as_complex(torch.stack((gq, gk), 2)) * fc).flatten(-2)
        return torch.cat((rot, gv.unsqueeze(2)), 2)
    out = gv.new_empty(gv.shape[0], gv.shape[1], 3, *gv.shape[2:])
    out[:, :, 2].copy_(gv)
    oc = torch.view_as_complex(out.unflatten(-1, (-1, 2)))
    torch.mul(_as_complex(gq), fc[:, 0], out=oc[:, :, 0])
    torch.mul(_as_complex(gk), fc[:, 1], out=oc[:, :, 1])
    return out


class _ComplexRotateSplit(torch.autograd.Function):
    """``qkv [B, T, 3, H, hd] -> q, k, v [B, H, T, hd]`` with ``q, k`` rotated: ``y = x * f`` on complex pairs,
    ``f [T, 2, H, hd/2]`` (cos + i sin for q and k) a constant, v a view of the input. Backward: ``d qkv = (dq *
    conj(f), dk * conj(f), dv)`` written straight into a ``[B, T, 3, H, hd]`` tensor, the layout the projection's
    backward wants (the transposed rotation, as in ``_ComplexRotation``). Under double backward or a ``torch.func``
    transform the backward uses out-of-place ops (same values). This form (``setup_context``, a generated vmap rule)
    is the one ``torch.func`` transforms use; outside them ``_ComplexRotateSplitEager`` runs the same functions."""

    generate_vmap_rule = True

    @staticmethod
    def forward(qkv: torch.Tensor, f: torch.Tensor, f_conj: torch.Tensor):
        return _rotate_split_forward(qkv, f)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        ctx.save_for_backward(inputs[2])

    @staticmethod
    def backward(ctx, gq: torch.Tensor, gk: torch.Tensor, gv: torch.Tensor):
        return _rotate_split_backward(ctx.saved_tensors[0], gq, gk, gv), None, None


class _ComplexRotateSplitEager(torch.autograd.Function):
    """``_ComplexRotateSplit`` in the classic ``forward(ctx, ...)`` form, for calls outside ``torch.func``
    transforms: the same forward and backward, with less per-call overhead in ``apply`` (at the demo shape,
    ``B=16, T=64, H=4, hd=16``, one forward + backward costs about 2/3 of the ``setup_context`` form's)."""

    @staticmethod
    def forward(ctx, qkv: torch.Tensor, f: torch.Tensor, f_conj: torch.Tensor):
        ctx.save_for_backward(f_conj)
        return _rotate_split_forward(qkv, f)

    @staticmethod
    def backward(ctx, gq: torch.Tensor, gk: torch.Tensor, gv: torch.Tensor):
        return _rotate_split_backward(ctx.saved_tensors[0], gq, gk, gv), None, None


def _swap_pairs(x: torch.Tensor) -> torch.Tensor:
    """``[x0, x1, x2, x3, ...] -> [x1, x0, x3, x2, ...]`` over the last dim (a copy)."""
    return torch.stack((x[..., 1::2], x[..., 0::2]), -1).flatten(-2)


def _pair_rotate(x: torch.Tensor, cos2: torch.Tensor, sin2: torch.Tensor) -> torch.Tensor:
    """The pair form of the rotation: ``x [..., T, hd]``, ``cos2, sin2`` broadcast to it -> ``x * cos2 + swap(x) *
    sin2`` (same shape; pairs ``(x[2i], x[2i+1])`` rotated by the angle whose cosine / sine the tables hold)."""
    return x * cos2 + _swap_pairs(x) * sin2


def _pair_rotate_transposed(g: torch.Tensor, cos2: torch.Tensor, sin2: torch.Tensor) -> torch.Tensor:
    """The transpose of ``_pair_rotate`` (the rotation by the opposite angle): ``g * cos2 + swap(g * sin2)``."""
    return g * cos2 + _swap_pairs(g * sin2)


log = logging.getLogger(__name__)

FUSED_DEVICES = ("cuda",)  # device types whose eager pair rotation runs as one compiled kernel each way
_fused: dict[str, Any] = {}  # "kernels": the compiled (forward, transposed) pair, built on first use; "failed": why
# they could not run (no triton, an inductor failure), after which the eager pair form runs for the process


def _fused_pair_kernel(device: torch.device, transposed: bool = False) -> Callable[..., torch.Tensor] | None:
    """The compiled pair rotation (``transposed``: its transpose, the backward) for an eager call on ``device``, or
    ``None`` where the eager pair form (``_pair_rotate``, a chain of elementwise kernels) runs instead: on devices
    other than ``FUSED_DEVICES`` (the CPU path stays as it is, bit for bit), under ``torch.compile`` of the caller
    (inductor fuses the pair form there itself), under a ``torch.func`` transform (the stacked trainer's vmap: the
    generated vmap rule batches the eager ops), with grad mode on (a double backward differentiates the eager ops;
    ``_PairRotation``'s forward and plain backward run with it off), and after a failure.

    Each kernel is ``torch.compile(fullgraph=True, dynamic=None)`` of a pure function: one fused elementwise kernel
    (bf16 / fp16 computed in float32, rounded once). ``dynamic=None`` (automatic dynamic shapes) is a bounded number
    of recompiles, not one per step: the first shape (training's ``[B, T, 3, H, hd]`` with the table rows
    ``offset .. offset+T-1``) compiles a static kernel; the table's row offset is a storage offset, which guards do
    not check (moving the offset, as generation does, recompiles nothing); the first call with another B or T
    recompiles once with that size symbolic, and sizes 0 / 1 (generation's T = 1, batch 1) specialise once each:
    about five graphs per input layout (``rotate``'s ``[B, H, T, hd]`` view, ``rotate_qkv``'s fused layout) and
    dtype. Past dynamo's recompile limit (8 per function) ``fullgraph`` raises; that, a missing triton or any
    inductor failure is caught on the call: one warning through ``logging``, then the eager pair form for the rest
    of the process (same values to bf16 round-off, never a crash)."""
    if (torch.compiler.is_compiling() or device.type not in FUSED_DEVICES or torch.is_grad_enabled()
            or torch._C._are_functorch_transforms_active() or "failed" in _fused):
        return None
    if "kernels" not in _fused:
        try:
            _fused["kernels"] = tuple(_guarded(torch.compile(f, fullgraph=True, dynamic=None), f)
                                      for f in (_pair_rotate, _pair_rotate_transposed))
        except Exception as err:  # torch.compile refused (e.g. an unsupported Python): the eager form
            _fall_back(err)
            return None
    return _fused["kernels"][transposed]


def _fall_back(err: Exception) -> None:
    _fused["failed"] = err
    log.warning("RoPE: the compiled pair rotation could not run on this machine (%s: %s); the eager pair form "
                "runs instead", type(err).__name__, str(err).splitlines()[0] if str(err) else "")


def _guarded(compiled: Callable[..., torch.Tensor], eager: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """``compiled``, falling back to ``eager`` (and switching the compiled kernels off) when it fails; a genuine
    error of the call (a shape mismatch) is raised again by the eager form, an out-of-memory error as it is. ``x``
    goes in detached: ``requires_grad`` is guarded, and grad mode is off wherever this runs."""

    def run(x: torch.Tensor, cos2: torch.Tensor, sin2: torch.Tensor) -> torch.Tensor:
        try:  # detached (grad mode is off here): an eval call compiles nothing more than a training call
            return compiled(x.detach(), cos2, sin2)
        except torch.OutOfMemoryError:
            raise
        except Exception as err:
            _fall_back(err)
            return eager(x, cos2, sin2)

    return run


class _PairRotation(torch.autograd.Function):
    """``y = x * cos2 + swap(x) * sin2`` with ``dx = g * cos2 + swap(g * sin2)`` (swap is its own transpose, so this
    is the rotation by the opposite angle). For dtypes without complex kernels (bf16, fp16). ``x [..., T, hd]``,
    ``cos2, sin2 [T, hd]`` constants (or ``[T, 3, H, hd]`` broadcast views for the fused projection). On CUDA in
    eager mode each way is one compiled kernel (``_fused_pair_kernel``), elsewhere the eager ops."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x: torch.Tensor, cos2: torch.Tensor, sin2: torch.Tensor) -> torch.Tensor:
        return (_fused_pair_kernel(x.device) or _pair_rotate)(x, cos2, sin2)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        ctx.save_for_backward(inputs[1], inputs[2])

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        cos2, sin2 = ctx.saved_tensors
        return (_fused_pair_kernel(g.device, transposed=True) or _pair_rotate_transposed)(g, cos2, sin2), None, None


# ALiBi: Press et al. 2022, "Train Short, Test Long: Attention with Linear Biases Enables Input Length
# Extrapolation" (arXiv:2108.12409; repo ofirpress/attention_with_linear_biases). NoPE (``positions: none``):
# no position signal at all; a causal decoder still infers positions from the mask (Haviv et al. 2022,
# "Transformer Language Models without Positional Encodings Still Learn Positional Information";
# Kazemnejad et al. 2023, "The Impact of Positional Encoding on Length Generalization in Transformers").


def alibi_slopes(heads: int) -> torch.Tensor:
    """Per-head ALiBi slopes ``m_h`` (float64 ``[heads]``), Press et al. 2022.

    For ``n`` a power of two: the geometric sequence ``2^(-8/n), 2^(-16/n), ..., 2^(-8)`` (start = ratio =
    ``2^(-8/n)``). Otherwise, as in the authors' code: the slopes of the closest power of two ``p < n``, then every
    other slope of ``2p`` for the remaining ``n - p`` heads.
    """

    def power_of_two(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    if heads < 1:
        raise ValueError(f"heads must be >= 1, got {heads}")
    if heads & (heads - 1) == 0:
        return torch.tensor(power_of_two(heads), dtype=torch.float64)
    p = 2 ** math.floor(math.log2(heads))
    return torch.tensor(power_of_two(p) + power_of_two(2 * p)[0::2][: heads - p], dtype=torch.float64)


def alibi_bias(slopes: torch.Tensor, t_q: int, t_k: int, offset: int = 0) -> torch.Tensor:
    """ALiBi score bias ``-m_h * (i - j)`` for queries at positions ``offset .. offset+t_q-1`` and keys
    ``0 .. t_k-1``: ``[heads, t_q, t_k]`` (dtype and device of ``slopes``).

    Future keys (``j > i``) get a positive bias here; the causal mask removes them. Added to the scores before the
    softmax (or softplus), so a key ``d`` tokens back is down-weighted by ``exp(-m_h d)`` in softmax attention.
    The authors' code adds ``m_h * j`` instead, which equals ``-m_h (i - j)`` up to a per-row constant that softmax
    ignores; the true distance is used here because softplus attention is not shift-invariant.
    """
    i = torch.arange(offset, offset + t_q, device=slopes.device, dtype=slopes.dtype)
    j = torch.arange(t_k, device=slopes.device, dtype=slopes.dtype)
    return -slopes[:, None, None] * (i[:, None] - j[None, :])
