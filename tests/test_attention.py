"""Attention kinds and positions (docs/attention.md): each kind against an independent naive implementation with
explicit masked T x T matrices or per-row loops (fp64); causality by perturbation; linear attention parallel ==
chunked == recurrent; ALiBi slopes and biases against the closed form; QK-norm and softcap against their formulas;
incremental decoding (``GPT.step``) == full forward; config refusals; every kind x norm x placement; conversions;
training ``tiny`` with each kind via the CLI, generating from it, and the LSSAR evaluation-time switch."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

from normlab.attention import build_attention, set_eval_options
from normlab.attention.linear import (
    linear_attention_chunked,
    linear_attention_parallel,
    linear_attention_recurrent,
)
from normlab.attention import attention_names, get_attention_class
from normlab.attention.positions import RotaryEmbedding, alibi_bias, alibi_slopes
from normlab.errors import NormlabError
from normlab.eval.sampling import generate_tokens
from normlab.model import PLACEMENTS, ModelConfig, build_model
from normlab.norms import norm_names
from tests.helpers import run_inproc

KINDS = attention_names()  # the registry is the one list: a new kind gets every shared test below


def positions_of(kind: str) -> tuple[str, ...]:
    """Position encodings a kind takes: ALiBi only where it forms a score matrix (its declared fact)."""
    return (
        ("rope", "learned", "alibi", "none") if get_attention_class(kind).score_matrix else ("rope", "learned", "none")
    )


# option variants exercised by the causality and step tests (a kind without an entry is tested with its defaults)
VARIANTS = {
    "softmax": [{}, {"qk_norm": True, "attn_softcap": 0.7}, {"positions": "alibi", "attn_softcap": 2.0}],
    "softplus": [{}, {"lssa_reweight": True}, {"lssa_reweight": True, "lssa_power": 3.0, "positions": "alibi"}],
    "linear": [{}, {"linear_conv": 4, "linear_gate": "static", "linear_chunk": 4}, {"linear_gate": "sigmoid",
                                                                                      "qk_norm": True}],
    "nala": [{}, {"linear_conv": 3, "linear_gate": "sigmoid", "linear_chunk": 5}],
}
W, H, HD, CTX = 32, 4, 8, 16


pytestmark = pytest.mark.usefixtures("one_thread")


def mcfg(**kw) -> ModelConfig:
    base = dict(vocab_size=50, context=CTX, width=W, depth=2, heads=H)
    base.update(kw)
    return ModelConfig(**base)


def layer(seed: int = 0, **kw):
    """One attention module in fp64 with randomised (non-trivial) gains, scales and conv weights."""
    cfg = mcfg(**kw).validate()
    torch.manual_seed(seed)
    rope = RotaryEmbedding(HD, CTX) if cfg.positions == "rope" else None
    m = build_attention(cfg, rope).double().eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for n, p in m.named_parameters():
            if n.startswith(("q_norm", "k_norm", "key_scale", "value_scale", "out_norm")):
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))
            elif n.startswith(("qkv.weight", "gate.weight", "key_gate.weight", "value_gate.weight")):
                p.mul_(10.0)  # scores of order 1: masks, caps and kernels all matter
    return m


def heads(m, x):
    """q, k, v ``[B, H, T, hd]`` read from ``m.qkv`` by hand (layout ``[q | k | v]``, heads contiguous)."""
    B, T, _ = x.shape
    q, k, v = m.qkv(x).split(W, dim=-1)
    return [t.view(B, T, H, HD).transpose(1, 2) for t in (q, k, v)]


def naive_rope(x, pos0=0, base=10000.0):
    """RoPE from its definition: interleaved pairs as complex numbers times ``exp(i * pos * base^(-2j/d))``."""
    d = x.shape[-1]
    theta = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    pos = torch.arange(pos0, pos0 + x.shape[-2], dtype=torch.float64)
    turn = torch.polar(torch.ones((), dtype=torch.float64), pos[:, None] * theta)
    z = torch.complex(x[..., 0::2], x[..., 1::2]) * turn
    return torch.stack([z.real, z.imag], dim=-1).flatten(-2)


def merge(y):
    B, _, T, _ = y.shape
    return y.transpose(1, 2).reshape(B, T, W)


def naive_softmax(m, x, cfg):
    q, k, v = heads(m, x)
    T = x.shape[1]
    if cfg.qk_norm:  # RMSNorm over head_dim with the learnable gain, before RoPE
        q = q / torch.sqrt((q * q).mean(-1, keepdim=True) + cfg.norm_eps) * m.q_norm.weight
        k = k / torch.sqrt((k * k).mean(-1, keepdim=True) + cfg.norm_eps) * m.k_norm.weight
    if cfg.positions == "rope":
        q, k = naive_rope(q), naive_rope(k)
    s = q @ k.transpose(-2, -1) / math.sqrt(HD)
    if cfg.attn_softcap:
        c = cfg.attn_softcap
        s = c * torch.tanh(s / c)
    if cfg.positions == "alibi":
        m_h = torch.tensor([2.0 ** (-8 * (h + 1) / H) for h in range(H)], dtype=torch.float64)
        dist = torch.tensor([[i - j for j in range(T)] for i in range(T)], dtype=torch.float64)
        s = s - m_h[:, None, None] * dist
    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    return m.proj(merge(torch.softmax(s, -1) @ v))


def naive_softplus(m, x, cfg):
    q, k, v = heads(m, x)
    B, _, T, _ = q.shape
    if cfg.positions == "rope":
        q, k = naive_rope(q), naive_rope(k)
    out = torch.zeros_like(v)
    slopes = [2.0 ** (-8 * (h + 1) / H) for h in range(H)]
    for b in range(B):
        for h in range(H):
            for i in range(T):
                N = i + 1
                cos = torch.stack([q[b, h, i] @ k[b, h, j] / (q[b, h, i].norm() * k[b, h, j].norm())
                                   for j in range(N)])
                s = math.log(HD) * math.log(N) * cos
                if cfg.positions == "alibi":
                    s = s - slopes[h] * torch.tensor([i - j for j in range(N)], dtype=torch.float64)
                a = F.softplus(s)
                a = a / a.sum()
                if cfg.lssa_reweight:
                    r = torch.relu(N * a - (0.0 if N <= 3 else 1.0)) ** cfg.lssa_power
                    a = r / r.sum()
                out[b, h, i] = a @ v[b, h, :N]
    return m.proj(merge(out))


def naive_kernel_attention(qn, kn, v, qd, kd):
    """Explicit masked T x T form: ``out_i = sum_{j<=i} (qn_i.kn_j) v_j / (sum_{j<=i} qd_i.kd_j + 1e-6)``."""
    T = qn.shape[-2]
    mask = torch.ones(T, T, dtype=torch.float64).tril()
    A = (qn @ kn.transpose(-2, -1)) * mask
    den = ((qd @ kd.transpose(-2, -1)) * mask).sum(-1, keepdim=True)
    return (A @ v) / (den + 1e-6)


def naive_gates_conv(m, x, v, cfg):
    """Key / value scales ``[B|1, H, T, 1]`` and the causal depthwise conv of ``v [B, H, T, hd]`` (or None)."""
    B, T, _ = x.shape
    ks = vs = conv = None
    if cfg.linear_gate == "static":
        ks = m.key_scale.view(H, CTX)[None, :, :T, None]
        vs = m.value_scale.view(H, CTX)[None, :, :T, None]
    elif cfg.linear_gate == "sigmoid":  # exp(log(sigmoid(z)) / 16) = sigmoid(z)^(1/16)
        ks = torch.sigmoid(x @ m.key_gate.weight.T + m.key_gate.bias).transpose(1, 2)[..., None] ** (1 / 16)
        vs = torch.sigmoid(x @ m.value_gate.weight.T + m.value_gate.bias).transpose(1, 2)[..., None] ** (1 / 16)
    if cfg.linear_conv:
        K, vf = cfg.linear_conv, merge(v)
        conv = torch.zeros_like(vf)
        for t in range(T):
            for r in range(K):
                if t - (K - 1) + r >= 0:
                    conv[:, t] += m.conv.weight[:, 0, r] * vf[:, t - (K - 1) + r]
    return ks, vs, conv


def naive_linear(m, x, cfg):
    q, k, v = heads(m, x)
    if cfg.qk_norm:
        q = q / torch.sqrt((q * q).mean(-1, keepdim=True) + cfg.norm_eps) * m.q_norm.weight
        k = k / torch.sqrt((k * k).mean(-1, keepdim=True) + cfg.norm_eps) * m.k_norm.weight
    if cfg.positions == "rope":
        q, k = naive_rope(q), naive_rope(k)
    ks, vs, conv = naive_gates_conv(m, x, v, cfg)
    phq, phk = torch.relu(q) + 1e-6, torch.relu(k) + 1e-6
    vv = v
    if ks is not None:
        phk, vv = phk * ks, v * vs
    y = merge(naive_kernel_attention(phq, phk, vv, phq, phk))
    return m.proj(y if conv is None else y + conv)


def naive_nala(m, x, cfg):
    q, k, v = heads(m, x)
    k3 = k ** 3
    qn = q.norm(dim=-1, keepdim=True)
    p = 3 * (0.5 + torch.tanh(qn))
    phq = torch.cat([(torch.relu(q) / qn) ** p, (torch.relu(-q) / qn) ** p], -1)
    phk = torch.cat([torch.relu(k3), torch.relu(-k3)], -1)
    ks, vs, conv = naive_gates_conv(m, x, v, cfg)
    vv = v
    if ks is not None:
        phk, vv = phk * ks, v * vs
    rq, rk = phq, phk
    if cfg.positions == "rope":  # numerator only, each half rotated with the head_dim rotation
        rq = torch.cat([naive_rope(phq[..., :HD]), naive_rope(phq[..., HD:])], -1)
        rk = torch.cat([naive_rope(phk[..., :HD]), naive_rope(phk[..., HD:])], -1)
    y = merge(naive_kernel_attention(rq, rk, vv, phq, phk))
    if conv is not None:
        y = y + conv
    y = F.layer_norm(y, (W,), m.out_norm.weight, m.out_norm.bias, 1e-5) * F.silu(x @ m.gate.weight.T)
    return m.proj(y)


NAIVE = {"softmax": naive_softmax, "softplus": naive_softplus, "linear": naive_linear, "nala": naive_nala}
REFERENCE_CASES = [
    ("softmax", {}), ("softmax", {"positions": "none"}), ("softmax", {"positions": "alibi"}),
    ("softmax", {"qk_norm": True}), ("softmax", {"attn_softcap": 0.5, "positions": "none"}),
    ("softmax", {"qk_norm": True, "attn_softcap": 0.8, "positions": "alibi"}),
    ("softplus", {}), ("softplus", {"positions": "none"}), ("softplus", {"positions": "alibi"}),
    ("softplus", {"lssa_reweight": True, "positions": "none"}), ("softplus", {"lssa_reweight": True}),
    ("linear", {}), ("linear", {"positions": "none", "linear_chunk": 3}), ("linear", {"qk_norm": True}),
    ("linear", {"linear_conv": 4, "linear_gate": "static", "linear_chunk": 4}),
    ("linear", {"linear_gate": "sigmoid", "positions": "none", "linear_conv": 2}),
    ("nala", {}), ("nala", {"positions": "none"}), ("nala", {"linear_conv": 3, "linear_gate": "sigmoid"}),
]


@pytest.mark.parametrize("kind, opts", REFERENCE_CASES, ids=[f"{k}-{i}" for i, (k, _) in enumerate(REFERENCE_CASES)])
def test_attention_matches_naive_reference(kind, opts):
    cfg = mcfg(attention=kind, **opts).validate()
    m = layer(attention=kind, **opts)
    x = torch.randn(2, 13, W, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    want = NAIVE[kind](m, x, cfg)
    torch.testing.assert_close(m(x), want, atol=1e-10, rtol=1e-10)


def test_alibi_slopes_and_bias_closed_form():
    torch.testing.assert_close(alibi_slopes(8), torch.tensor([2.0 ** -(i + 1) for i in range(8)], dtype=torch.float64))
    torch.testing.assert_close(alibi_slopes(4), torch.tensor([2.0 ** -(2 * i + 2) for i in range(4)],
                                                             dtype=torch.float64))
    # 6 heads (not a power of two): the 4-head slopes, then every other 8-head slope: 2^-1, 2^-3
    torch.testing.assert_close(alibi_slopes(6), torch.tensor([2 ** -2, 2 ** -4, 2 ** -6, 2 ** -8, 2 ** -1, 2 ** -3],
                                                             dtype=torch.float64))
    m = alibi_slopes(4)
    b = alibi_bias(m, 5, 5)
    for h in range(4):
        for i in range(5):
            for j in range(5):
                assert b[h, i, j].item() == pytest.approx(-m[h].item() * (i - j))
    # decoding offset: 2 queries at positions 3, 4 over 5 keys are the last rows of the full matrix
    torch.testing.assert_close(alibi_bias(m, 2, 5, offset=3), b[:, 3:])


def test_softcap_bounds_the_weight_ratio_and_qk_norm_removes_the_qk_scale():
    """softcap c: every score lies in [-c, c], so two visible weights of a row differ by at most exp(2c) however
    large q and k are; QK-norm: scaling the q/k projections changes nothing (RMSNorm divides it out)."""
    c, T = 0.5, HD  # values = one-hot rows: the attention output is the weight matrix itself
    a = layer(attention="softmax", attn_softcap=c, positions="none")
    g = torch.Generator().manual_seed(0)
    q, k = (1e3 * torch.randn(1, H, T, HD, dtype=torch.float64, generator=g) for _ in range(2))
    A = a.attend(q, k, torch.eye(T, dtype=torch.float64).expand(1, H, T, T))
    for i in range(T):
        row = A[0, :, i, : i + 1]
        assert (row.amax(-1) / row.amin(-1) <= math.exp(2 * c) * (1 + 1e-12)).all()  # tanh saturates at 1e3
    torch.testing.assert_close(A.sum(-1), torch.ones(1, H, T, dtype=torch.float64))
    x = torch.randn(1, 9, W, dtype=torch.float64, generator=g)
    b = layer(attention="softmax", qk_norm=True, positions="none", norm_eps=1e-12)  # eps breaks exact invariance
    y1 = b(x)
    with torch.no_grad():
        b.qkv.weight[: 2 * W] *= 50.0
    torch.testing.assert_close(b(x), y1, atol=1e-9, rtol=1e-9)


@pytest.mark.parametrize("T", [1, 7, 16, 37])
def test_linear_parallel_chunked_recurrent_agree(T):
    g = torch.Generator().manual_seed(T)
    qn, kn, qd, kd = (torch.rand(2, 3, T, 6, dtype=torch.float64, generator=g) for _ in range(4))
    v = torch.randn(2, 3, T, 5, dtype=torch.float64, generator=g)
    ref = naive_kernel_attention(qn, kn, v, qd, kd)
    torch.testing.assert_close(linear_attention_parallel(qn, kn, v, qd, kd), ref)
    rec, (S, z) = linear_attention_recurrent(qn, kn, v, qd, kd)
    torch.testing.assert_close(rec, ref)
    for chunk in (1, 3, 4, 8, 64):
        out, (S2, z2) = linear_attention_chunked(qn, kn, v, qd, kd, chunk=chunk)
        torch.testing.assert_close(out, ref)
        torch.testing.assert_close(S2, S)
        torch.testing.assert_close(z2, z)
    if T > 2:  # continuing from a state: two pieces == one pass (chunked and recurrent)
        a, st = linear_attention_chunked(qn[:, :, :5], kn[:, :, :5], v[:, :, :5], qd[:, :, :5], kd[:, :, :5], chunk=2)
        b, _ = linear_attention_chunked(qn[:, :, 5:], kn[:, :, 5:], v[:, :, 5:], qd[:, :, 5:], kd[:, :, 5:], chunk=3,
                                        state=st)
        c, _ = linear_attention_recurrent(qn[:, :, 5:], kn[:, :, 5:], v[:, :, 5:], qd[:, :, 5:], kd[:, :, 5:], state=st)
        torch.testing.assert_close(torch.cat([a, b], 2), ref)
        torch.testing.assert_close(c, ref[:, :, 5:])


def model_cases(kinds=KINDS):
    """``(kind, options)`` cases of the causality and decoding tests: every position encoding a kind takes, then its
    option variants."""
    out = []
    for kind in kinds:
        for pos in positions_of(kind):
            out.append((kind, {"positions": pos}))
        for i, v in enumerate(VARIANTS.get(kind, [{}])[1:]):
            out.append((kind, v))
    return out


MODEL_CASES = model_cases()
MODEL_IDS = [f"{k}-{'-'.join(f'{a}={b}' for a, b in o.items())}" for k, o in MODEL_CASES]


def randomised_model(kind, opts, **kw):
    torch.manual_seed(0)
    m = build_model(mcfg(attention=kind, **opts, **kw)).double().eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for n, p in m.named_parameters():
            if n.endswith(("key_scale", "value_scale")):
                p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))
            elif n.endswith("attn.qkv.weight"):
                p.mul_(10.0)
    return m


@pytest.mark.parametrize("kind, opts", MODEL_CASES, ids=MODEL_IDS)
def test_no_output_depends_on_a_later_token(kind, opts):
    m = randomised_model(kind, opts)
    x = torch.randint(0, 50, (2, 12), generator=torch.Generator().manual_seed(0))
    for t in (0, 6, 11):
        y = x.clone()
        y[:, t] = (y[:, t] + 1) % 50
        a, b = m(x), m(y)
        torch.testing.assert_close(a[:, :t], b[:, :t], atol=0, rtol=0)
        assert not torch.allclose(a[:, t], b[:, t])


@pytest.mark.parametrize("norm", ["layernorm", "crmsnorm"])
@pytest.mark.parametrize("kind, opts", MODEL_CASES, ids=MODEL_IDS)
def test_step_by_step_equals_full_forward(kind, opts, norm):
    m = randomised_model(kind, opts, norm=norm)
    x = torch.randint(0, 50, (2, 14), generator=torch.Generator().manual_seed(0))
    full = m(x)
    state = m.init_state(2)
    pieces, i = [], 0
    for n in (5, 1, 1, 4, 3):  # a prefill, single tokens, more chunks
        logits, new = m.step(x[:, i:i + n], state)
        assert new is not state and state[0].pos == i  # the passed state is left as it was
        state, i = new, i + n
        pieces.append(logits)
    torch.testing.assert_close(torch.cat(pieces, 1), full, atol=1e-10, rtol=1e-10)
    assert state[0].pos == 14


@pytest.mark.parametrize("kind", KINDS)
def test_generate_cache_path_equals_fallback(kind):
    m = randomised_model(kind, VARIANTS.get(kind, [{}])[-1])
    a = list(generate_tokens(m, [3, 1, 4, 1, 5], 24, context=CTX, use_cache=True, temperature=0))  # crosses window
    b = list(generate_tokens(m, [3, 1, 4, 1, 5], 24, context=CTX, use_cache=False, temperature=0))
    assert a == b


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_with_every_norm_and_placement(kind):
    """Every attention kind builds, runs finite and stays causal with every norm at every placement."""
    positions = positions_of(kind)
    for i, (norm, placement) in enumerate((n, p) for n in norm_names() for p in sorted(PLACEMENTS)):
        torch.manual_seed(i)
        m = build_model(mcfg(attention=kind, norm=norm, placement=placement, depth=2,
                             positions=positions[i % len(positions)])).eval()
        x = torch.randint(0, 50, (2, 10))
        y = x.clone()
        y[:, 6] = (y[:, 6] + 1) % 50
        a, b = m(x), m(y)
        assert torch.isfinite(a).all(), (norm, placement)
        torch.testing.assert_close(a[:, :6], b[:, :6], msg=f"{norm} {placement}")


@pytest.mark.parametrize("opts, frag", [
    ({"attention": "flash"}, "unknown model.attention 'flash'"),
    ({"positions": "sinusoidal"}, "unknown model.positions"),
    ({"attention": "linear", "positions": "alibi"}, "alibi"),
    ({"attention": "nala", "positions": "alibi"}, "alibi"),
    ({"attention": "softplus", "attn_softcap": 50.0}, "attn_softcap"),
    ({"attention": "linear", "attn_softcap": 50.0}, "attn_softcap"),
    ({"attn_softcap": -1.0}, "attn_softcap must be > 0"),
    ({"attention": "softplus", "qk_norm": True}, "qk_norm"),
    ({"attention": "nala", "qk_norm": True}, "qk_norm"),
    ({"lssa_reweight": True}, "lssa_reweight"),
    ({"attention": "softplus", "lssa_power": 0.0}, "lssa_power must be > 0"),
    ({"linear_conv": 4}, "linear_conv"),
    ({"attention": "softplus", "linear_gate": "static"}, "linear_gate"),
    ({"attention": "linear", "linear_gate": "dynamic"}, "unknown model.linear_gate"),
    ({"attention": "linear", "linear_conv": -1}, "model.linear_conv must be >= 0"),
    ({"attention": "linear", "linear_chunk": 0}, "linear_chunk"),
])
def test_meaningless_pairs_are_refused_in_one_line(opts, frag):
    with pytest.raises(NormlabError, match=frag) as e:
        mcfg(**opts).validate()
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("kind", attention_names())
def test_each_kind_declares_the_ranges_of_its_options_once(kind):
    """A kind's ``ranges`` are the one declaration of its numeric options' ranges: the config fields declare none
    of them (``normlab.config.RANGES``), and a value just outside one is refused, whichever kind the config chooses,
    in one line by ``ModelConfig.validate`` and by a run config (``--set``) with the message of every numeric key."""
    from normlab.config import RANGES, config_from_dict

    cls = get_attention_class(kind)
    for key, rng in cls.ranges.items():
        assert f"model.{key}" not in RANGES
        cast = int if rng.integer else float
        for bad in [cast(v) for v in ((rng.lo - 1 if rng.integer else rng.lo) if rng.lo is not None else None,
                                      (rng.hi + 1 if rng.integer else 2 * rng.hi) if rng.hi is not None else None)
                    if v is not None]:
            msg = f"model.{key} must be {rng.text(bad)}, got {bad!r}"
            for chosen in attention_names():
                with pytest.raises(NormlabError) as e:
                    mcfg(attention=chosen, positions="rope", **{key: bad}).validate()
                assert str(e.value) == msg
            with pytest.raises(NormlabError) as e:
                config_from_dict({"model": {"attention": kind, key: bad}})
            assert str(e.value) == msg


def test_static_gate_and_learned_positions_refuse_long_inputs():
    from normlab.attention import check_attention_context

    with pytest.raises(NormlabError, match="cannot extrapolate"):
        check_attention_context(mcfg(attention="linear", linear_gate="static"), CTX + 1)
    check_attention_context(mcfg(attention="linear", linear_gate="static"), CTX)
    m = build_model(mcfg(attention="linear", linear_gate="static", positions="none"))
    with pytest.raises(ValueError, match="static KV-gate"):
        m(torch.zeros(1, CTX + 1, dtype=torch.long))
    state = m.init_state(1)
    _, state = m.step(torch.zeros(1, CTX, dtype=torch.long), state)
    with pytest.raises(ValueError, match="static KV-gate"):
        m.step(torch.zeros(1, 1, dtype=torch.long), state)


def test_rope_softplus_and_linear_extrapolate_past_context():
    """RoPE/ALiBi/NoPE models accept sequences longer than the training context (tables grow on demand)."""
    for kind, pos in (("softmax", "rope"), ("softplus", "alibi"), ("linear", "rope"), ("nala", "none")):
        m = build_model(mcfg(attention=kind, positions=pos)).eval()
        assert torch.isfinite(m(torch.randint(0, 50, (1, 3 * CTX)))).all()


def test_softmax_options_convert_exactly_and_other_kinds_refuse():
    from normlab.convert import convert_model
    from tests.test_convert import make, tokens

    for kind in ("rmsnorm", "crmsnorm", "folded"):
        rc, model = make(qk_norm=True, attn_softcap=3.0, positions="alibi")
        _, out, _ = convert_model(model, rc, kind)
        torch.testing.assert_close(out(tokens()), model(tokens()), atol=1e-5, rtol=1e-5)
    test_convert_and_export_follow_the_declared_facts("softmax")
    for att in (k for k in KINDS if not get_attention_class(k).convertible):
        test_convert_and_export_follow_the_declared_facts(att)


@pytest.mark.parametrize("kind", KINDS)
def test_convert_and_export_follow_the_declared_facts(kind):
    """``convertible``: ``normlab convert``'s rmsnorm conversion of a model with this kind reproduces its logits;
    else a one-line refusal naming the kind. ``exportable``: a GPT-NeoX-shaped config (Pre-LN, rope, gelu) maps
    onto ``gpt_neox``; else the HF export refuses, naming the kind."""
    from normlab.convert import convert_model
    from normlab.interop.arch import hf_arch
    from tests.test_convert import make, tokens

    cls = get_attention_class(kind)
    rc, model = make(attention=kind)
    if cls.convertible:
        _, out, _ = convert_model(model, rc, "rmsnorm")
        torch.testing.assert_close(out(tokens()), model(tokens()), atol=1e-5, rtol=1e-5)
    else:
        with pytest.raises(NormlabError, match=f"cannot convert model.attention '{kind}'") as e:
            convert_model(model, rc, "rmsnorm")
        assert "\n" not in str(e.value)
    cfg = mcfg(attention=kind, positions="rope").validate()
    if cls.exportable:
        assert hf_arch(cfg) == "gpt_neox"
    else:
        with pytest.raises(NormlabError, match=f"cannot export to HF exactly: model.attention '{kind}'"):
            hf_arch(cfg)


# -- end to end: train tiny with each kind, generate, switch LSSAR at evaluation ----------------------------------

STEPS = ["--set", "train.steps=20", "--set", "train.eval_every=20", "--set", "train.checkpoint_every=20",
         "--set", "train.log_every=1", "--set", "train.eval_batches=1"]
OPTS = {"softmax": ["model.qk_norm=true"], "softplus": [], "linear": ["model.linear_conv=4",
                                                                     "model.linear_gate=sigmoid"], "nala": []}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    cache, root = tmp_path_factory.mktemp("cache"), tmp_path_factory.mktemp("runs")
    out = {}
    for kind in KINDS:
        sets = [a for o in [f"model.attention={kind}", *OPTS.get(kind, [])] for a in ("--set", o)]
        run_inproc("train", "tiny", *STEPS, *sets, "--out", str(root / kind), cache=cache, check=True)
        out[kind] = root / kind
    return out, cache


@pytest.mark.parametrize("kind", KINDS)
def test_tiny_trains_and_generates_with_every_kind(runs, kind):
    run_dirs, cache = runs
    rows = [json.loads(line) for line in (run_dirs[kind] / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in rows if "loss" in r]
    assert len(losses) == 20 and all(math.isfinite(v) for v in losses)
    assert sum(losses[-3:]) / 3 < losses[0] - 1.0, losses
    proc = run_inproc("generate", str(run_dirs[kind]), "--prompt", "abc", "--max-new-tokens", "12",
                      "--temperature", "0", "--json", cache=cache, check=True)
    rep = json.loads(proc.stdout)
    assert rep["cache"] is True and len(rep["tokens"]) == 12


def test_convert_cli_refuses_linear_attention_in_one_line(runs):
    run_dirs, cache = runs
    proc = run_inproc("convert", str(run_dirs["linear"]), "--to", "rmsnorm", cache=cache)
    assert proc.returncode == 2 and proc.stderr.strip().startswith("error: cannot convert model.attention 'linear'")
    assert len(proc.stderr.strip().splitlines()) == 1


def test_lssar_switches_at_evaluation_without_retraining(runs, capsys, monkeypatch):
    from normlab.cli import build_parser
    from normlab.commands.eval import run_eval
    from normlab.commands.extrapolate import run_extrapolate
    from normlab.rundir.readers import load_run

    run_dirs, cache = runs
    monkeypatch.setenv("NORMLAB_CACHE_DIR", str(cache))
    rd = run_dirs["softplus"]

    def ev(overrides):
        args = build_parser().parse_args(["eval", str(rd), "--batch-size", "8", "--max-tokens", "1024", "--json",
                                          *[x for o in overrides for x in ("--set", o)]])
        assert run_eval(args) == 0
        return json.loads(capsys.readouterr().out)

    plain, re = ev([]), ev(["model.lssa_reweight=true", "model.lssa_power=15"])
    assert re["overrides"] == ["model.lssa_reweight=true", "model.lssa_power=15"]
    assert re["loss"] != plain["loss"] and math.isfinite(re["loss"])
    assert json.loads((rd / "eval_val.json").read_text())["loss"] == plain["loss"]  # plain result kept
    assert json.loads((rd / "eval_val_overrides.json").read_text())["loss"] == re["loss"]
    # the library path: same switch on a loaded model
    run = load_run(rd)
    base = run.model(torch.arange(40).view(1, 40) % 7)
    cfg = run.cfg.model
    cfg.lssa_reweight = True
    set_eval_options(run.model, cfg)
    assert not torch.allclose(run.model(torch.arange(40).view(1, 40) % 7), base)
    with pytest.raises(NormlabError, match="only evaluation-time keys"):
        ev(["model.attention=softmax"])
    args = build_parser().parse_args(["extrapolate", str(rd), "--factors", "1,2", "--max-tokens", "512", "--memory-gb",
                                      "1.0", "--batch-size", "4", "--json", "--set", "model.lssa_reweight=true"])
    assert run_extrapolate(args) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["overrides"] == ["model.lssa_reweight=true"] and (rd / "extrapolation_overrides.png").is_file()
    assert [r["factor"] for r in rep["results"]] == [1, 2]


# ------------------------------------------------------------------ a new kind is one registered class


def test_registered_kinds_declare_their_facts():
    """What the registry promises: the shipped kinds discovered in order, every fact declared, and facts that agree with
    the modules (a kind without a score matrix has no attention_probs; eval keys are config keys)."""
    import dataclasses

    from normlab.attention.registry import ATTENTION_FACTS

    assert KINDS[:4] == ("linear", "nala", "softmax", "softplus")  # discovered: the modules in alphabetical order
    fields = {f.name for f in dataclasses.fields(ModelConfig)}
    for k in attention_names():  # read now: a kind registered by a test is checked too
        cls = get_attention_class(k)
        assert cls.kind == k and all(hasattr(cls, f) for f in ATTENTION_FACTS)
        assert set(cls.eval_keys) <= set(cls.options) and set(cls.options) <= fields
        assert callable(getattr(cls, "attention_probs", None)) == cls.score_matrix, k
        assert not cls.eval_keys or callable(getattr(cls, "apply_eval_options", None)), k
    with pytest.raises(NormlabError, match="unknown model.attention 'flash'"):
        get_attention_class("flash")
    with pytest.raises(ValueError, match="registered twice"):
        __import__("normlab.attention.registry", fromlist=["x"]).register_attention("softmax")(type("Again", (), {}))


@pytest.mark.parametrize("kind", KINDS)
def test_score_matrix_decides_alibi_sinks_and_extrapolation_memory(kind):
    """``score_matrix`` is one fact read three ways: ALiBi is accepted exactly for kinds that form scores; the
    sink diagnostics measure exactly those (rows of probabilities that sum to 1, zero above the diagonal, and
    ``proj(A v)`` reproducing the module's output, checked inside ``attention_probs``) and give a one-line reason
    for the others; extrapolation counts the ``heads x T x T`` scores in its memory estimate exactly for them."""
    from normlab.diagnostics import sink_analysis
    from normlab.diagnostics.sinks import attention_probs
    from normlab.eval.extrapolation import window_bytes_estimate

    has = get_attention_class(kind).score_matrix
    if has:
        mcfg(attention=kind, positions="alibi").validate()
    else:
        with pytest.raises(NormlabError, match=f"model.attention '{kind}' never forms"):
            mcfg(attention=kind, positions="alibi").validate()
    m = randomised_model(kind, {})
    idx = torch.randint(0, 50, (2, 12), generator=torch.Generator().manual_seed(0))
    rep = sink_analysis(m, idx)
    assert rep["available"] is has, rep
    if has:
        assert rep["attention"] == [kind]
        A = attention_probs(m, idx)  # [L, B, H, T, T]
        torch.testing.assert_close(A.sum(-1), torch.ones_like(A[..., 0]))
        assert float(A.triu(1).abs().max()) == 0.0
    else:
        assert kind in rep["reason"] and "\n" not in rep["reason"]
    # extrapolate sizes its batches from the estimate with (or without) the heads x T x T scores
    import numpy as np

    from normlab.eval.extrapolation import extrapolate

    toks = np.random.default_rng(0).integers(0, 50, 40 * CTX + 1)
    gb = 1e-3
    rep = extrapolate(m, toks, np.ones(50), train_context=CTX, factors=[1.0], attention=kind, memory_gb=gb,
                      batch_size=10_000)
    need = {q: window_bytes_estimate(CTX, width=W, heads=H, vocab=50, mlp_ratio=4.0, quadratic=q) for q in (1, 0)}
    assert need[1] > need[0] and int(gb * 2**30 // need[1]) != int(gb * 2**30 // need[0])
    assert rep["results"][0]["batch_size"] == int(gb * 2**30 // need[has])


def switched(value):
    """Another value of an option for the eval-time test: a bool flipped, a number divided by 3."""
    return (not value) if isinstance(value, bool) else value / 3


@pytest.mark.parametrize("kind", [k for k in KINDS if get_attention_class(k).eval_keys])
def test_eval_keys_switch_a_trained_model_as_if_built_with_them(kind):
    """Every eval-time key of a kind, changed on a built model (``set_eval_options``, what ``normlab eval --set``
    does), gives exactly the model built with the changed config and the same weights, and changes its output."""
    import dataclasses

    cls = get_attention_class(kind)
    base = mcfg(attention=kind).validate()
    changed = dataclasses.replace(base, **{k: switched(getattr(base, k)) for k in cls.eval_keys}).validate()
    m = randomised_model(kind, {})
    torch.manual_seed(0)
    ref = build_model(changed).double().eval()
    ref.load_state_dict(m.state_dict())
    x = torch.randint(0, 50, (2, 12), generator=torch.Generator().manual_seed(0))
    before = m(x)
    set_eval_options(m, changed)
    torch.testing.assert_close(m(x), ref(x), atol=0, rtol=0)
    assert not torch.allclose(m(x), before)


def test_attention_command_lists_the_registry(tmp_path):
    """``normlab attention --json``: the registered kinds in order with the facts their classes declare."""
    rows = json.loads(run_inproc("attention", "--json", cache=tmp_path, check=True).stdout)["attention"]
    assert [r["name"] for r in rows] == list(attention_names())
    for r in rows:
        cls = get_attention_class(r["name"])
        assert r == {"name": cls.kind, "description": cls.description, "paper": cls.paper,
                     "score_matrix": cls.score_matrix, "options": list(cls.options), "eval_keys": list(cls.eval_keys),
                     "convertible": cls.convertible, "exportable": cls.exportable}
    text = run_inproc("attention", cache=tmp_path, check=True).stdout
    assert all(k in text for k in attention_names())


class _MeanAttention(__import__("normlab.attention.base", fromlist=["AttentionBase"]).AttentionBase):
    """A scratch kind for the test below: every query averages the values of all keys up to it (uniform causal
    attention, A[i, k] = 1 / (i + 1)); ``x [B, T, C] -> [B, T, C]``; KV cache (values only) when decoding."""

    description = "causal mean of the values (test only)"

    @classmethod
    def from_config(cls, cfg, rope, **common):
        return cls(cfg.width, cfg.heads, **common)

    @staticmethod
    def weights(t_q, t_k, dtype):
        """``[t_q, t_k]``: 1 / (number of visible keys) where visible (queries = the last ``t_q`` positions)."""
        from normlab.attention.base import causal_mask

        allowed = causal_mask(t_q, t_k).to(dtype)
        return allowed / allowed.sum(-1, keepdim=True)

    def attention_probs(self, x):
        B, T, _ = x.shape
        return self.weights(T, T, torch.float64).expand(B, self.heads, T, T)

    def forward(self, x, state=None):
        from normlab.attention.base import append_kv

        _, k, v = self.split_heads(x)
        _, v = append_kv(state, k, v)
        y = self.weights(x.shape[1], v.shape[2], v.dtype) @ v
        if state is not None:
            state.pos += x.shape[1]
        return self.out(self.merge_heads(y))


def test_a_scratch_kind_is_picked_up_by_config_model_and_diagnostics(monkeypatch, tmp_path):
    """The issue's "Done when" for attention: a kind defined here, registered for this test only, is picked up by
    config validation, build_model (forward, decoding), the CLI listing, diagnostics, convert/export refusals
    and every shared test, with no other edit."""
    from normlab.diagnostics import attention_probs, sink_stats
    from tests.helpers import scratch_attention

    name = scratch_attention(monkeypatch, "mean", _MeanAttention)
    assert name in __import__("normlab.attention", fromlist=["attention_names"]).attention_names()
    cfg = mcfg(attention="mean", positions="alibi")  # it declares a score matrix: ALiBi is allowed
    cfg.validate()
    with pytest.raises(NormlabError, match="re-weight softplus attention, not 'mean'"):
        mcfg(attention="mean", lssa_reweight=True).validate()  # another kind's option is refused by its message
    with pytest.raises(NormlabError, match="unknown model.linear_gate"):  # a key's own domain, whatever the kind
        mcfg(attention="mean", linear_gate="dynamic").validate()
    # the shared tests, unchanged, on the new kind
    cases = model_cases([name])
    assert [o for _, o in cases] == [{"positions": p} for p in ("rope", "learned", "alibi", "none")]
    for case in cases:
        test_no_output_depends_on_a_later_token(*case)
        test_step_by_step_equals_full_forward(*case, "layernorm")
    test_generate_cache_path_equals_fallback("mean")
    test_every_kind_with_every_norm_and_placement("mean")
    test_score_matrix_decides_alibi_sinks_and_extrapolation_memory("mean")
    test_convert_and_export_follow_the_declared_facts("mean")  # declares neither: both refuse it by name
    test_attention_command_lists_the_registry(tmp_path)
    test_registered_kinds_declare_their_facts()
    torch.manual_seed(0)
    m = build_model(mcfg(attention="mean", depth=2)).eval()
    A = attention_probs(m, torch.randint(0, 50, (2, 16)))
    T = 16  # uniform causal attention: first-token importance = H_T / T (harmonic number)
    assert sink_stats(A)["first_token_importance"][0][0] == pytest.approx(sum(1 / i for i in range(1, T + 1)) / T)


def test_a_scratch_convertible_exportable_kind_joins_the_refusals(monkeypatch):
    """``convertible`` / ``exportable`` are read from the registry, not from a list of names: a kind registered in
    this test (softmax attention under another name, declaring both) converts exactly and exports through the
    shared test, and the refusals other kinds get name it among the kinds that would convert / export."""
    from normlab.attention.softmax import CausalSelfAttention
    from normlab.convert import convert_model
    from normlab.interop.arch import hf_arch
    from tests.helpers import scratch_attention
    from tests.test_convert import make

    class SoftmaxCopy(CausalSelfAttention):
        description = "softmax attention under another name (test only)"

    scratch_attention(monkeypatch, "softmax_copy", SoftmaxCopy)
    assert SoftmaxCopy.convertible and SoftmaxCopy.exportable  # declared by the parent class, inherited
    test_convert_and_export_follow_the_declared_facts("softmax_copy")
    rc, model = make(attention="linear")
    with pytest.raises(NormlabError, match="projections of softmax, softmax_copy attention only"):
        convert_model(model, rc, "rmsnorm")
    with pytest.raises(NormlabError, match=r"model.attention 'linear' \(softmax or softmax_copy would export\)"):
        hf_arch(mcfg(attention="linear", positions="rope").validate())
