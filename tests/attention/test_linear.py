"""normlab.attention.linear: LINA's input convolution (causal, convolving the input; generation equal to the full
forward) and its config checks."""

from __future__ import annotations


import torch

from tests.helpers import run_inproc

torch.set_num_threads(1)


def _lina(conv_source: str, seed: int = 0):
    from normlab.attention.linear import LinearAttention

    torch.manual_seed(seed)
    return LinearAttention(16, 2, conv=4, conv_source=conv_source).double()


def test_lina_input_conv_is_causal_and_convolves_the_input():
    """Future tokens do not change past outputs; the branch is conv1d of the attention input x (left-padded with
    K-1 zeros), i.e. out = proj(attention(x) + conv(x)), checked against the attention without the branch."""
    att = _lina("input")
    x = torch.randn(3, 10, 16, dtype=torch.float64)
    y = att(x)
    x2 = x.clone()
    x2[:, 6:] = torch.randn(3, 4, 16, dtype=torch.float64) * 5
    y2 = att(x2)
    assert torch.equal(y[:, :6], y2[:, :6]) and not torch.allclose(y[:, 6:], y2[:, 6:])
    # reference: the same module without its conv, plus proj(conv of x) computed by hand
    conv = att.conv
    att.conv = None
    base = att(x)
    att.conv = conv
    K = conv.kernel_size[0]
    w, b = conv.weight[:, 0, :], conv.bias  # [C, K], [C]
    xp = torch.cat([x.new_zeros(3, K - 1, 16), x], dim=1)
    local = torch.stack([(xp[:, t:t + K, :] * w.T).sum(1) + b for t in range(10)], dim=1)
    assert torch.allclose(y, base + local @ att.proj.weight.T, atol=1e-12)
    # the value conv is a different map of the same shapes
    val = _lina("value")
    val.load_state_dict({k: v for k, v in att.state_dict().items() if k != "conv.bias"}, strict=False)
    assert not torch.allclose(val(x), y)


def test_lina_input_conv_generation_matches_the_full_forward():
    from normlab.model import GPT, ModelConfig

    torch.manual_seed(0)
    m = GPT(ModelConfig(vocab_size=32, context=16, width=16, depth=2, heads=2, attention="linear", linear_conv=3,
                        linear_conv_source="input")).double().eval()
    idx = torch.randint(0, 32, (2, 12))
    full = m(idx)
    state = m.init_state(2)
    parts = []
    for a, b in ((0, 5), (5, 6), (6, 12)):
        out, state = m.step(idx[:, a:b], state)
        parts.append(out)
    assert torch.allclose(torch.cat(parts, 1), full, atol=1e-10)


def test_linear_conv_source_needs_a_kernel(tmp_path):
    from tests.helpers import assert_bad_input

    assert_bad_input(run_inproc("train", "tiny", "--set", "model.attention=linear", "--set",
                                "model.linear_conv_source=input", "--out", str(tmp_path / "r"), cache=tmp_path / "c"),
                     "linear_conv")
    p = run_inproc("train", "tiny", "--set", "model.attention=linear", "--set", "model.linear_conv=2", "--set",
                   "model.linear_conv_source=keys", "--out", str(tmp_path / "r2"), cache=tmp_path / "c")
    assert_bad_input(p, "linear_conv_source")
