"""normlab.model.streams: hyper-connections (HC) and mHC against the reference package (``hyper-connections``,
tests/fixtures/hyper_connections_reference.json, written by tests/fixtures/make_hyper_connections_reference.py),
Sinkhorn-Knopp against a closed form, and the model with streams against the Pre-LN model it
equals at initialisation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from normlab.config import config_from_dict
from normlab.errors import NormlabError
from normlab.model import ModelConfig, build_model
from normlab.model.streams import get_connection_class, residual_names, sinkhorn_knopp

REF = json.loads((Path(__file__).resolve().parents[1] / "fixtures" / "hyper_connections_reference.json").read_text())
B, T, N, D = REF["shape"]


def ours(case):
    cls = get_connection_class(case["kind"])
    m = cls(N, D, REF["layer_index"], dynamic=not case["static"], sinkhorn_iters=case["sinkhorn_iters"] or 20)
    # the package's initial values are ours (before the fixture moved them)
    for name, p in m.named_parameters():
        key = "norm.gamma" if name == "norm.gamma" else name
        torch.testing.assert_close(p.detach(), torch.tensor(case["init"][key]).reshape(p.shape), rtol=0, atol=0)
    with torch.no_grad():
        for name, p in m.named_parameters():
            p.copy_(torch.tensor(case["params"][name]).reshape(p.shape))
    return m


@pytest.mark.parametrize("case", REF["cases"], ids=lambda c: f"{c['kind']}-it{c['sinkhorn_iters']}-"
                         f"{'static' if c['static'] else 'dynamic'}")
def test_connection_matches_the_reference_package(case):
    """Forward and the gradients of sum(y * upstream) against the package around the same linear branch. Tolerance
    rtol 1e-5 / atol 1e-6 (float32: the package contracts with einsum, we with matmul, so sums run in another
    order; Sinkhorn's 20 normalisations amplify that a little)."""
    m = ours(case)
    branch = torch.nn.Linear(D, D, bias=False)
    with torch.no_grad():
        branch.weight.copy_(torch.tensor(REF["branch_weight"]))
    x = torch.tensor(REF["x"]).reshape(B, T, N, D).requires_grad_()
    inp, res, post, h_res = m(x)
    y = m.depth(branch(inp), res, post)
    (y * torch.tensor(REF["upstream"]).reshape(B, T, N, D)).sum().backward()
    tol = dict(rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(y.detach().flatten(), torch.tensor(case["y"]), **tol)
    torch.testing.assert_close(x.grad.flatten(), torch.tensor(case["grad_x"]), **tol)
    torch.testing.assert_close(branch.weight.grad, torch.tensor(case["grad_branch"]), **tol)
    got = {n: p.grad for n, p in m.named_parameters()}
    if case["static"]:  # the package's dynamic maps (zeroed) still get gradients; ours has none
        assert set(got) == {"static_alpha", "static_beta"}
    else:
        assert set(got) == set(case["grads"])
    for name, g in got.items():
        torch.testing.assert_close(g, torch.tensor(case["grads"][name]).reshape(g.shape), **tol)
    if case["kind"] == "mhc":  # H_res doubly stochastic (columns exact after the last row step of alpha = H_res^T)
        torch.testing.assert_close(h_res.sum(-2), torch.ones(B, T, N), atol=1e-6, rtol=0)
        assert (h_res >= 0).all() and (post >= 0).all() and (post <= 2).all()


def test_sinkhorn_closed_form():
    # 2 x 2: exp(logits) = [[a, b], [c, d]]; one column then row normalisation, by hand
    z = torch.tensor([[0.3, -1.2], [0.8, 0.1]], dtype=torch.float64)
    e = z.exp()
    col = e / e.sum(0, keepdim=True)
    one = col / col.sum(1, keepdim=True)
    torch.testing.assert_close(sinkhorn_knopp(z, 1), one.to(z.dtype))
    many = sinkhorn_knopp(torch.randn(5, 4, 4, generator=torch.Generator().manual_seed(0)), 200)
    torch.testing.assert_close(many.sum(-1), torch.ones(5, 4))
    torch.testing.assert_close(many.sum(-2), torch.ones(5, 4), atol=1e-5, rtol=0)


@pytest.mark.parametrize("dynamic", [True, False])
def test_hc_at_init_is_the_pre_ln_model(dynamic):
    """At init every stream holds the same vector (A_m one-hot, A_r identity, B ones, dynamic terms 0), so the
    streams' sum is n x the Pre-LN stream, which the final LayerNorm undoes (exactly up to its eps: 1e-12 here)."""
    torch.manual_seed(0)
    kw = dict(vocab_size=32, context=8, width=16, depth=3, heads=2, norm_eps=1e-12)
    pre = build_model(ModelConfig(**kw))
    hc = build_model(ModelConfig(**kw, residual="hc", streams=3, hc_dynamic=dynamic))
    assert hc.load_state_dict(pre.state_dict(), strict=False).unexpected_keys == []
    idx = torch.randint(0, 32, (2, 8))
    torch.testing.assert_close(hc(idx), pre(idx), rtol=1e-5, atol=1e-5)


def test_model_shapes_layer_indices_and_causality():
    torch.manual_seed(0)
    m = build_model(ModelConfig(vocab_size=32, context=8, width=16, depth=3, heads=2, residual="mhc", streams=4))
    assert [blk.attn_hc.layer for blk in m.blocks] == [0, 2, 4] and [blk.mlp_hc.layer for blk in m.blocks] == [1, 3, 5]
    assert m.blocks[1].mlp_hc.static_alpha[3 % 4, 0].item() == 1.0  # A_m init e_{k mod n}, k = 3
    idx = torch.randint(0, 32, (2, 8))
    full = m(idx)
    idx2 = idx.clone()
    idx2[:, 5:] = (idx2[:, 5:] + 1) % 32
    torch.testing.assert_close(m(idx2)[:, :5], full[:, :5])  # no position reads a later one
    state = m.init_state(2)  # incremental decoding gives the full forward's logits
    a, state = m.step(idx[:, :3], state)
    b, _ = m.step(idx[:, 3:], state)
    torch.testing.assert_close(torch.cat((a, b), 1), full, rtol=1e-5, atol=1e-5)


def test_streams_params_are_not_weight_decayed():
    from normlab.config import TrainConfig
    from normlab.train.optim import param_groups

    m = build_model(ModelConfig(vocab_size=32, context=8, width=16, depth=1, heads=2, residual="hc"))
    _, groups = param_groups(m, TrainConfig())
    hc = {n for n, _ in m.named_parameters() if "_hc." in n}
    assert hc and hc <= set(groups["no_decay"])


def test_listed_and_bad_config_is_one_line():
    assert residual_names() == ["add", "hc", "mhc", "ngpt"]
    for model, fragment in [({"residual": "hyper"}, "model.residual"),
                            ({"residual": "hc", "placement": "post"}, "use pre, peri or output"),
                            ({"residual": "mhc", "placement": "deepnorm"}, "use pre, peri or output"),
                            ({"residual": "hc", "norm": "crmsnorm"}, "compressed"),
                            ({"streams": 0}, "model.streams"), ({"sinkhorn_iters": -1}, "model.sinkhorn_iters")]:
        with pytest.raises(NormlabError) as e:
            config_from_dict({"model": model})
        assert fragment in str(e.value) and "\n" not in str(e.value), model


@pytest.mark.parametrize("placement", ["pre", "peri", "output"])
@pytest.mark.parametrize("residual", residual_names())
def test_every_residual_kind_and_placement_trains_and_evaluates(residual, placement):
    torch.manual_seed(0)
    ngpt = dict(norm="none", tie_embeddings=False) if residual == "ngpt" else {}  # its required pairs
    m = build_model(ModelConfig(vocab_size=50, context=16, width=32, depth=2, heads=4, residual=residual,
                                placement=placement, streams=3, dropout=0.1, **ngpt))
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    idx = torch.randint(0, 50, (4, 12))
    before = {n: p.detach().clone() for n, p in m.named_parameters() if "_hc." in n}
    for _ in range(2):
        _, loss = m(idx[:, :-1], idx[:, 1:])
        loss.backward()
        assert all(torch.isfinite(p.grad).all() for p in m.parameters() if p.grad is not None)
        opt.step()
        opt.zero_grad()
    assert all(not torch.equal(before[n], p) for n, p in m.named_parameters() if n in before)  # every map learns
    m.eval()
    with torch.no_grad():
        assert torch.isfinite(m(idx)).all()


def test_a_plain_run_keeps_its_config_hash():
    """The residual-stream keys came later: at their defaults they are not part of a run's identity, so a Pre-LN
    config hashes as before they existed; a stream config hashes differently."""
    from normlab.config import RunConfig

    plain = RunConfig()
    d = plain.identity_dict()["model"]
    assert not {"residual", "streams", "hc_dynamic", "sinkhorn_iters", "ngpt_alpha_init"} & set(d)
    hc = config_from_dict({"model": {"residual": "hc"}})
    assert hc.identity_dict()["model"]["residual"] == "hc" and hc.hash() != plain.hash()


@pytest.mark.parametrize("residual", residual_names())
def test_every_residual_kind_compiles_as_one_graph_and_matches_eager(residual):
    """``torch.compile(fullgraph=True)`` (a graph break raises) traces each residual stream kind, the Sinkhorn loop
    and nGPT's scaled logits included, with the eager backend: the compiled forward and gradients equal eager's
    (same operations, so to fp32 round-off) -- the graph a GPU run compiles has no break."""
    torch.manual_seed(0)
    ngpt = dict(norm="none", tie_embeddings=False) if residual == "ngpt" else {}
    m = build_model(ModelConfig(vocab_size=50, context=16, width=32, depth=2, heads=4, residual=residual, streams=3,
                                **ngpt))
    idx = torch.randint(0, 50, (2, 13))
    _, ref = m(idx[:, :-1], idx[:, 1:])
    ref.backward()
    want = {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}
    m.zero_grad(set_to_none=True)
    torch._dynamo.reset()
    compiled = torch.compile(m, backend="eager", fullgraph=True)
    _, loss = compiled(idx[:, :-1], idx[:, 1:])
    loss.backward()
    torch.testing.assert_close(loss, ref, rtol=1e-6, atol=1e-6)
    for n, p in m.named_parameters():
        if n in want:
            torch.testing.assert_close(p.grad, want[n], rtol=1e-5, atol=1e-6, msg=n)
