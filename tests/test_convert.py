"""Exact conversions (Jiang et al. 2023, arXiv:2305.14858): Pre-LN -> Pre-RMSNorm / Pre-CRMSNorm / folded.

Random-init Pre-LN models with randomised LN gains and biases and non-zero-mean embeddings; every conversion must
give the same fp32 logits (1e-5) after a round trip through a run directory, refuse what it cannot convert, and
the CLI must produce a run whose ``normlab eval`` equals the original's.
"""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from normlab.config import config_from_dict, dump_config
from normlab.convert import convert_model, convert_run
from normlab.model.crms import CRMSGPT
from normlab.rundir.readers import load_run
from normlab.errors import NormlabError
from normlab.io import write_text
from normlab.model import build_model
from normlab.norms import build_norm, registry
from normlab.rundir.tensors import save_model
from tests.helpers import run_inproc, scratch_norm

V, CTX = 50, 16
VARIANTS = {
    "rope-tied-gelu": dict(),
    "learned-untied-swiglu-bias-dropout": dict(positions="learned", tie_embeddings=False, activation="swiglu",
                                               bias=True, dropout=0.1),
    "lns-learnable-residual": dict(layernorm_scaling=True, residual_scale="learnable"),
    "fixed-residual-mix0": dict(residual_scale="fixed", placement="mix", mix_alpha=0.25),  # 0 Post-LN blocks
    "learnable-embed-scale": dict(embed_scale="learnable"),
}


def run_cfg(**model):
    base = dict(vocab_size=V, context=CTX, width=32, depth=3, heads=4)
    base.update(model)
    return config_from_dict({"model": base})


def randomise(model: nn.Module, seed: int = 1) -> nn.Module:
    """Non-trivial norm gains / biases, non-zero-mean embeddings and writers, random linear biases."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            r = torch.randn(p.shape, generator=g)
            if n == "embed_scale":
                p.copy_(2.0 + 0.5 * r.abs())
            elif "_in." in n or "final_norm" in n:
                p.copy_(1.0 + 0.5 * r if n.endswith("weight") else 0.3 * r)
            elif "emb" in n or n.endswith("proj.weight"):
                p.add_(p.std() * (0.3 * r + 0.5))  # a per-row mean the conversion has to remove
            elif n.endswith("bias"):
                p.copy_(0.1 * r + 0.02)
            elif n.endswith("res_scale"):  # ReZero scalars start at 0: make the branches count
                p.copy_(1.0 + 0.3 * r)
    return model.eval()


def make(**model):
    rc = run_cfg(**model)
    torch.manual_seed(0)
    return rc, randomise(build_model(rc.model))


def tokens():
    return torch.randint(0, V, (3, CTX), generator=torch.Generator().manual_seed(2))


def round_trip(tmp_path, rc, model):
    """Write config.yaml + model.safetensors as a run would, build from the saved config, load the saved weights."""
    write_text(tmp_path / "config.yaml", dump_config(rc))
    save_model(model, tmp_path / "model.safetensors", rc.hash())
    return load_run(tmp_path).model


@pytest.mark.parametrize("kind", ["rmsnorm", "crmsnorm", "folded"])
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_conversion_is_exact_after_round_trip(kind, variant, tmp_path):
    rc, model = make(**VARIANTS[variant])
    x = tokens()
    ref = model(x)
    new_rc, out, info = convert_model(model, rc, kind)
    back = round_trip(tmp_path, new_rc, out)
    torch.testing.assert_close(back(x), ref, atol=1e-5, rtol=0)
    assert torch.equal(back(x), out(x))
    m = new_rc.model
    assert m.norm == {"rmsnorm": "rmsnorm", "crmsnorm": "crmsnorm", "folded": "layernorm"}[kind]
    assert m.norm_options.get("affine") is False
    assert not any("_in." in n for n, _ in back.named_parameters())  # block norms are parameter-free
    if kind == "crmsnorm":
        assert isinstance(back, CRMSGPT) and back.tok_emb.weight.shape == (V, 31)
        assert back.blocks[0].attn.qkv.weight.shape == (96, 31) and back.lm_head.weight.shape == (V, 31)
        assert info["kept_sites"] == [] and back.final_norm.weight is None
    else:
        assert type(back) is type(model)
    if kind != "folded":
        assert not m.tie_embeddings  # the embedding is centred, the head is not


def test_chained_conversions(tmp_path):
    """Pre-LN -> Pre-RMSNorm -> Pre-CRMSNorm -> folded, each step exact; rmsnorm -> folded too."""
    rc, model = make()
    x = tokens()
    ref = model(x)
    rc1, m1, _ = convert_model(model, rc, "rmsnorm")
    rc2, m2, _ = convert_model(m1, rc1, "crmsnorm")
    rc3, m3, _ = convert_model(m2, rc2, "folded")
    rc4, m4, _ = convert_model(m1, rc1, "folded")
    for m in (m1, m2, m3, m4):
        torch.testing.assert_close(m(x), ref, atol=1e-5, rtol=0)
    assert rc3.model.norm == "crmsnorm" and rc4.model.norm == "rmsnorm"
    assert isinstance(round_trip(tmp_path, rc3, m3), CRMSGPT)


def test_writers_are_zero_mean_after_rmsnorm_conversion():
    rc, model = make(positions="learned")
    _, out, _ = convert_model(model, rc, "rmsnorm")
    sd = out.state_dict()
    for k in ("tok_emb.weight", "pos_emb.weight"):
        assert sd[k].double().mean(1).abs().max() < 1e-6
    for l in range(3):
        for k in (f"blocks.{l}.attn.proj.weight", f"blocks.{l}.mlp.proj.weight"):
            assert sd[k].double().mean(0).abs().max() < 1e-6


def test_crmsnorm_closed_form_equals_rmsnorm_of_reconstructed_vector():
    """CRMSNorm(x[:d-1]) == RMSNorm(z)[:d-1] for zero-mean z; the dropped coordinate is -sum of the others."""
    torch.manual_seed(0)
    d, eps = 16, 1e-5
    z = torch.randn(4, 7, d, dtype=torch.float64) * 3
    z = z - z.mean(-1, keepdim=True)
    x = z[..., :-1]
    rms = build_norm("rmsnorm", d, eps=eps, affine=False).double()
    crms = build_norm("crmsnorm", d - 1, eps=eps, affine=False).double()
    torch.testing.assert_close(crms(x), rms(z)[..., :-1])
    torch.testing.assert_close(-crms(x).sum(-1), rms(z)[..., -1])
    explicit = x / torch.sqrt(((x**2).sum(-1, keepdim=True) + x.sum(-1, keepdim=True) ** 2) / d + eps)
    g = build_norm("crmsnorm", d - 1, eps=eps).double()
    with torch.no_grad():
        g.weight.normal_()
    torch.testing.assert_close(g(x), explicit * g.weight)
    ln = build_norm("layernorm", d, eps=eps, affine=False).double()
    torch.testing.assert_close(crms(x), ln(z)[..., :-1])  # and LayerNorm on the zero-mean vector


def test_crms_model_trains_from_scratch_shape():
    """model.norm=crmsnorm builds the compressed-stream model for every placement (width stays the logical d)."""
    for placement in ("pre", "post"):
        torch.manual_seed(0)
        m = build_model(run_cfg(norm="crmsnorm", placement=placement).model)
        logits, loss = m(tokens(), tokens())
        loss.backward()
        assert logits.shape == (3, CTX, V) and m.tok_emb.weight.shape == (V, 31)


# --- refusals -------------------------------------------------------------------------------------------------

def test_refuses_post_ln():
    rc, model = make(placement="post")
    for kind in ("rmsnorm", "crmsnorm", "folded"):
        with pytest.raises(NormlabError, match="placement 'post'") as e:
            convert_model(model, rc, kind)
        assert "\n" not in str(e.value)


def test_refuses_dyt():
    rc, model = make(norm="dyt")
    with pytest.raises(NormlabError, match="dyt"):
        convert_model(model, rc, "folded")


def test_refuses_output_side_norm_no_final_norm_and_unknown_parts():
    rc, model = make()
    model.blocks[1].attn_out = build_norm("layernorm", 32)
    with pytest.raises(NormlabError, match="norm at attn_out"):
        convert_model(model, rc, "folded")
    rc, model = make(placement="mix", mix_alpha=0.34)  # block 0 is Post-LN
    with pytest.raises(NormlabError, match="placement 'mix': block 0 has a norm at attn_post"):
        convert_model(model, rc, "rmsnorm")
    for placement in ("peri", "output"):
        rc, model = make(placement=placement)
        with pytest.raises(NormlabError, match=f"placement '{placement}'"):
            convert_model(model, rc, "folded")
    rc, model = make(embed_norm=True)
    with pytest.raises(NormlabError, match="embedding norm"):
        convert_model(model, rc, "folded")
    rc, model = make(final_norm=False)
    with pytest.raises(NormlabError, match="without a final norm"):
        convert_model(model, rc, "rmsnorm")
    convert_model(model, rc, "folded")  # folding needs no final norm
    rc, model = make()
    model.blocks[0].scale = nn.Parameter(torch.ones(1))
    with pytest.raises(NormlabError, match="unsupported model component 'blocks.0.scale'"):
        convert_model(model, rc, "folded")


def test_refuses_wrong_source_norm():
    rc, model = make(norm="rmsnorm")  # trained RMSNorm: its writers are not zero-mean
    with pytest.raises(NormlabError, match="needs a Pre-LN LayerNorm"):
        convert_model(model, rc, "rmsnorm")
    with pytest.raises(NormlabError, match="not zero-mean"):
        convert_model(model, rc, "crmsnorm")
    x = tokens()
    new_rc, out, _ = convert_model(model, rc, "folded")  # folding an RMSNorm model is fine
    torch.testing.assert_close(out(x), model(x), atol=1e-5, rtol=0)


# --- the eval-affine protocol (batch-statistics norms) ----------------------------------------------------------

class FakePlainNorm(nn.Module):
    """Eval-mode BatchNorm over tokens: ``(x - running_mean) / sqrt(running_var + eps) * weight + bias``."""

    name = "fake_plain"
    paper = description = "test double without the eval-affine protocol"

    def __init__(self, dim, *, eps=1e-5, affine=True, bias=True):
        super().__init__()
        self.dim, self.eps = dim, eps
        self.weight = nn.Parameter(torch.ones(dim)) if affine else None
        self.bias = nn.Parameter(torch.zeros(dim)) if affine and bias else None
        self.register_buffer("running_mean", torch.zeros(dim))
        self.register_buffer("running_var", torch.ones(dim))

    def forward(self, x):
        y = (x - self.running_mean) / torch.sqrt(self.running_var + self.eps)
        y = y * self.weight if self.weight is not None else y
        return y + self.bias if self.bias is not None else y


class FakeBatchNorm(FakePlainNorm):
    """The same, implementing the eval-affine protocol the batch-statistics norms are asked to implement."""

    name = "fake_batchnorm"
    paper = description = "test double for the eval-affine protocol"

    def eval_affine(self):
        s = torch.rsqrt(self.running_var + self.eps)
        w = self.weight if self.weight is not None else torch.ones_like(s)
        b = self.bias if self.bias is not None else torch.zeros_like(s)
        return s * w, b - self.running_mean * s * w

    def reset_eval_affine_(self):
        with torch.no_grad():
            self.running_mean.zero_(), self.running_var.fill_(1.0 - self.eps)
            if self.weight is not None:
                self.weight.fill_(1.0)
            if self.bias is not None:
                self.bias.zero_()


@pytest.fixture
def fake_norm(monkeypatch):
    return scratch_norm(monkeypatch, "fake_batchnorm", FakeBatchNorm)


def test_eval_affine_protocol_folds(fake_norm, tmp_path):
    rc, model = make(norm=fake_norm)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for n, b in model.named_buffers():
            if n.endswith("running_mean"):
                b.copy_(torch.randn(b.shape, generator=g) * 0.2)
            elif n.endswith("running_var"):
                b.copy_(torch.rand(b.shape, generator=g) + 0.5)
    x = tokens()
    ref = model(x)
    new_rc, out, info = convert_model(model, rc, "folded")
    back = round_trip(tmp_path, new_rc, out)
    torch.testing.assert_close(back(x), ref, atol=1e-5, rtol=0)
    assert new_rc.model.norm == fake_norm and new_rc.model.bias
    folded = [s for s in info["folded_sites"] if s != "final_norm"]
    assert len(folded) == 6
    for s in folded:
        scale, shift = back.get_submodule(s).eval_affine()
        torch.testing.assert_close(scale, torch.ones_like(scale))
        torch.testing.assert_close(shift, torch.zeros_like(shift))
    with pytest.raises(NormlabError, match="needs a Pre-LN LayerNorm"):
        convert_model(model, rc, "rmsnorm")


@pytest.mark.parametrize("name", ["batchnorm", "powernorm", "unified"])
def test_eval_affine_protocol_real_norms(name):
    """The batch-statistics norms fold through the eval-affine protocol (docs/convert.md)."""
    cls = registry.get_norm_class(name)
    assert hasattr(cls, "eval_affine") and hasattr(cls, "reset_eval_affine_")
    rc, model = make(norm=name)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for n, b in model.named_buffers():
            if b.is_floating_point() and b.ndim == 1 and not n.endswith("ema_gz"):
                b.copy_(torch.rand(b.shape, generator=g) + 0.5 if "var" in n or "phi" in n else
                        0.2 * torch.randn(b.shape, generator=g))
    x = tokens()
    new_rc, out, _ = convert_model(model, rc, "folded")
    torch.testing.assert_close(out(x), model(x), atol=1e-5, rtol=0)


def test_norm_without_protocol_is_refused(monkeypatch):
    rc, model = make(norm=scratch_norm(monkeypatch, "fake_plain", FakePlainNorm))
    with pytest.raises(NormlabError, match="cannot convert norm 'fake_plain'"):
        convert_model(model, rc, "folded")


# --- run directories and the CLI -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, cache):
    out = tmp_path_factory.mktemp("runs") / "X"
    run_inproc("train", "tiny", "--set", "train.steps=10", "--out", str(out), cache=cache, check=True)
    return out


def _eval_bpb(run_dir, cache):
    r = run_inproc("eval", str(run_dir), "--json", cache=cache, check=True)
    return json.loads(r.stdout)["bpb"]


def test_cli_convert_then_eval_matches(tiny_run, tmp_path, cache):
    before = _eval_bpb(tiny_run, cache)
    for kind in ("rmsnorm", "crmsnorm"):
        out = tmp_path / kind
        r = run_inproc("convert", str(tiny_run), "--to", kind, "--out", str(out), "--json", cache=cache, check=True)
        row = json.loads(r.stdout)
        assert set(row) == {"max_abs_logit_diff", "bpb_before", "bpb_after", "out", "kind"}
        assert row["kind"] == kind and row["out"] == str(out) and row["max_abs_logit_diff"] <= 1e-4
        assert abs(row["bpb_after"] - row["bpb_before"]) <= 1e-6
        assert sorted(p.name for p in out.iterdir()) == ["config.yaml", "conversion.json", "data.json",
                                                         "model.safetensors", "provenance.json", "summary.json"]
        assert json.loads((out / "summary.json").read_text())["status"] == "completed"
        assert json.loads((out / "conversion.json").read_text())["kind"] == kind
        assert abs(_eval_bpb(out, cache) - before) <= 1e-6
    assert not list(tmp_path.glob(".*")), "temp directories left behind"


def test_cli_refusals_are_one_line(tiny_run, tmp_path, cache):
    r = run_inproc("convert", str(tiny_run), "--to", "rmsnorm", "--out", str(tiny_run), cache=cache)
    assert r.returncode == 2 and "already exists and is not empty" in r.stderr and r.stderr.count("\n") == 1
    post = tmp_path / "post"  # a Post-LN run directory with the tiny run's data settings
    d = load_run(tiny_run).cfg.to_dict()
    d["model"]["placement"] = "post"
    cfg = config_from_dict(d)
    torch.manual_seed(0)
    write_text(post / "config.yaml", dump_config(cfg))
    save_model(build_model(cfg.model), post / "model.safetensors", cfg.hash())
    r = run_inproc("convert", str(post), "--to", "folded", cache=cache)
    assert r.returncode == 2 and "placement 'post'" in r.stderr and r.stderr.count("\n") == 1
    assert not (tmp_path / "post-folded").exists()


def test_failed_check_writes_nothing(tiny_run, tmp_path, cache, monkeypatch):
    import normlab.convert.run as run_mod

    monkeypatch.setenv("NORMLAB_CACHE_DIR", str(cache))
    monkeypatch.setattr(run_mod, "LOGIT_TOL", -1.0)
    with pytest.raises(NormlabError, match="failed its check.*nothing written"):
        convert_run(tiny_run, "crmsnorm", tmp_path / "Y")
    assert list(tmp_path.iterdir()) == []
