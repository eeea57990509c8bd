"""normlab.diagnostics.capture: a model with residual streams is captured as the sum of its streams, checked against
the Pre-LN model an HC model equals at initialisation (every stream holds the Pre-LN stream, so the sum is n times
it)."""

from __future__ import annotations

import torch

from normlab.diagnostics.capture import capture_stream
from normlab.model import ModelConfig, build_model


def test_streams_are_captured_as_their_sum():
    torch.manual_seed(0)
    kw = dict(vocab_size=32, context=8, width=16, depth=3, heads=2)
    pre = build_model(ModelConfig(**kw))
    hc = build_model(ModelConfig(**kw, residual="hc", streams=3))
    hc.load_state_dict(pre.state_dict(), strict=False)
    idx = torch.randint(0, 32, (2, 8))
    a, b = capture_stream(pre, idx), capture_stream(hc, idx)
    assert len(a.hidden) == len(b.hidden) == 4 and all(h.shape == (2, 8, 16) for h in b.hidden)
    for x, h in zip(a.hidden, b.hidden):
        torch.testing.assert_close(h, 3 * x, rtol=1e-5, atol=1e-6)
