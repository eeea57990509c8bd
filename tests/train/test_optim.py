"""Norm-aware optimization: which weights feed norms, AdamP/SGDP, Normalize-and-Project, effective LR, resume."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from normlab.config import OptimConfig, RunConfig, TrainConfig, config_from_dict, load_config
from normlab.errors import NormlabError
from normlab.model import ModelConfig, build_model
from normlab.rundir.readers import open_config
from normlab.rundir.tensors import load_optimizer_tensors, optimizer_tensors
from normlab.train.optim import (EffectiveLR, NormalizeAndProject, build_optimizer, step_together,
                                  weights_feeding_norms)
from tests.helpers import TINY, assert_same_weights, kill_9_after, normlab, run_inproc, summary, weights


def cfg(**kw) -> ModelConfig:
    base = dict(vocab_size=50, context=16, width=32, depth=3, heads=4)
    base.update(kw)
    return ModelConfig(**base)


def projs(L: int) -> set[str]:
    return {f"blocks.{i}.{s}.proj.weight" for i in range(L) for s in ("attn", "mlp")}


# ---------------------------------------------------------------- which weights feed a norm


@pytest.mark.parametrize("model, expected", [
    (dict(placement="pre"), projs(3)),                                   # tied embeddings: the LM head reads them
    (dict(placement="pre", tie_embeddings=False), projs(3) | {"tok_emb.weight"}),
    (dict(placement="pre", tie_embeddings=False, positions="learned"), projs(3) | {"tok_emb.weight", "pos_emb.weight"}),
    (dict(placement="pre", final_norm=False), set()),                    # the LM head reads the raw stream
    (dict(placement="post", tie_embeddings=False), projs(3)),             # block 0 reads the embeddings raw
    (dict(placement="peri", tie_embeddings=False), projs(3) | {"tok_emb.weight"}),
    (dict(placement="peri", embed_norm=False, tie_embeddings=False), projs(3) | {"tok_emb.weight"}),
    (dict(placement="output", tie_embeddings=False), projs(3)),
    (dict(placement="output", final_norm=False), projs(3)),              # output norms feed the stream, not weights
    (dict(placement="mix", depth=4, mix_alpha=0.5, tie_embeddings=False), projs(4)),
    (dict(placement="mix", depth=4, mix_alpha=0.0, tie_embeddings=False), projs(4) | {"tok_emb.weight"}),
])
def test_weights_feeding_norms(model, expected):
    m = build_model(cfg(**model))
    got = weights_feeding_norms(m)
    assert set(got) == expected
    named = dict(m.named_parameters())
    assert all(got[n] is named[n] for n in got)


def _logits_after_scaling(m, names, c, idx):
    m2 = build_model(m.cfg).double()
    m2.load_state_dict(m.state_dict())
    with torch.no_grad():
        for n, p in m2.named_parameters():
            if n in names:
                p.mul_(c)
    return m2.eval()(idx)


@pytest.mark.parametrize("placement", ["peri", "output"])
def test_output_norm_writers_are_each_scale_invariant(placement):
    """Independent check of the definition: scaling ONE weight that feeds an output norm leaves the logits alone."""
    torch.manual_seed(0)
    m = build_model(cfg(placement=placement, tie_embeddings=False, norm_eps=1e-30)).double().eval()
    idx = torch.randint(0, 50, (2, 9))
    ref = m(idx)
    for name in weights_feeding_norms(m):
        torch.testing.assert_close(_logits_after_scaling(m, {name}, 3.7, idx), ref, rtol=1e-9, atol=1e-9)
    changed = _logits_after_scaling(m, {"blocks.0.attn.qkv.weight"}, 3.7, idx)  # a weight that does not feed a norm
    assert not torch.allclose(changed, ref)


def test_pre_ln_writers_are_jointly_scale_invariant():
    torch.manual_seed(0)
    m = build_model(cfg(placement="pre", tie_embeddings=False, positions="learned", norm_eps=1e-30)).double().eval()
    idx = torch.randint(0, 50, (2, 9))
    torch.testing.assert_close(_logits_after_scaling(m, set(weights_feeding_norms(m)), 2.5, idx), m(idx),
                               rtol=1e-9, atol=1e-9)


# ---------------------------------------------------------------- optimizers


def _loss(m, seed=0):
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, 50, (4, 13), generator=g)
    return m(idx[:, :-1], idx[:, 1:])[1]


@pytest.mark.parametrize("name, cls", [("adamw", "AdamW"), ("adamp", "AdamP"), ("sgdp", "SGDP")])
def test_build_optimizer_kinds_and_groups(name, cls):
    torch.manual_seed(0)
    m = build_model(cfg(placement="peri"))
    tc = TrainConfig(lr=1e-2, weight_decay=0.1)
    opt, names = build_optimizer(m, tc, OptimConfig(name=name, delta=0.2, wd_ratio=0.5, momentum=0.8))
    assert type(opt).__name__ == cls
    assert [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0]
    assert set(names) == {"decay", "no_decay", "feeds_norm"} and set(names["feeds_norm"]) == projs(3)
    if name != "adamw":
        assert opt.param_groups[0]["delta"] == 0.2 and opt.param_groups[0]["wd_ratio"] == 0.5
    if name == "sgdp":
        assert opt.param_groups[0]["momentum"] == 0.8
    before = _loss(m).item()
    for _ in range(5):
        _loss(m).backward()
        opt.step()
        opt.zero_grad()
    assert _loss(m).item() < before


def test_adamp_removes_the_radial_update_of_scale_invariant_weights():
    """AdamP (Heo et al. 2021): for a weight feeding an output norm, the update is orthogonal to the weight."""
    cos = {}
    for name in ("adamw", "adamp"):
        torch.manual_seed(0)
        m = build_model(cfg(placement="peri", width=64))
        opt, _ = build_optimizer(m, TrainConfig(lr=1e-2, weight_decay=0.0), OptimConfig(name=name))
        w = m.blocks[1].mlp.proj.weight
        w0 = w.detach().clone()
        _loss(m).backward()
        opt.step()
        dw = (w.detach() - w0).flatten()
        cos[name] = abs(float(torch.dot(dw, w0.flatten()) / (dw.norm() * w0.norm())))
    assert cos["adamp"] < 1e-5 and cos["adamw"] > 100 * cos["adamp"]


def test_adamp_state_survives_a_checkpoint_round_trip_bit_exactly():
    """Checkpoints store AdamP's int ``step`` as a tensor; the pre-step hook restores it (float64 bias correction)."""
    def fresh():
        torch.manual_seed(0)
        m = build_model(cfg(placement="peri"))
        return m, build_optimizer(m, TrainConfig(lr=1e-2), OptimConfig(name="adamp"))[0]

    def step(m, opt, i):
        _loss(m, seed=i).backward()
        opt.step()
        opt.zero_grad()

    ref, ref_opt = fresh()
    for i in range(3):
        step(ref, ref_opt, i)
    a, a_opt = fresh()
    for i in range(2):
        step(a, a_opt, i)
    names = {id(p): n for n, p in a.named_parameters()}
    saved_w, saved_s = {k: v.clone() for k, v in a.state_dict().items()}, optimizer_tensors(a_opt, names)
    b, b_opt = fresh()
    b.load_state_dict(saved_w)
    load_optimizer_tensors(b_opt, saved_s, dict(b.named_parameters()))
    step(b, b_opt, 2)
    assert all(isinstance(s["step"], int) for s in b_opt.state.values())
    for (n, p), q in zip(ref.named_parameters(), b.parameters()):
        assert torch.equal(p, q), n


# ---------------------------------------------------------------- NaP and effective LR


def test_nap_projects_to_init_norms_and_leaves_others_alone():
    torch.manual_seed(0)
    m = build_model(cfg(placement="pre", tie_embeddings=False))
    init = {n: p.detach().norm().item() for n, p in m.named_parameters()}
    nap = NormalizeAndProject(m)
    assert set(nap.params) == projs(3) | {"tok_emb.weight"}
    opt, _ = build_optimizer(m, TrainConfig(lr=5e-2, weight_decay=0.0))
    for i in range(3):
        _loss(m, seed=i).backward()
        opt.step()
        opt.zero_grad()
        before = {n: p.detach().clone() for n, p in m.named_parameters()}
        nap.project()
        for n, p in m.named_parameters():
            if n in nap.params:
                assert p.detach().norm().item() == pytest.approx(init[n], rel=1e-6)
                cos = torch.nn.functional.cosine_similarity(p.detach().flatten(), before[n].flatten(), dim=0)
                assert cos.item() == pytest.approx(1.0, abs=1e-6)  # a pure rescale
            else:
                assert torch.equal(p, before[n]), n
    grown = [n for n, p in m.named_parameters() if n not in nap.params and p.ndim == 2
             and abs(p.detach().norm().item() - init[n]) > 1e-3 * init[n]]
    assert grown, "without NaP, the other matrices' norms drift"
    js = nap.to_json()
    assert json.loads(json.dumps(js)) == js
    nap.check(js, "here")
    with pytest.raises(NormlabError, match="differ"):
        nap.check({**js, "tok_emb.weight": 1.0}, "here")


def test_effective_lr_matches_definition():
    torch.manual_seed(0)
    m = build_model(cfg(placement="peri"))
    opt, names = build_optimizer(m, TrainConfig(lr=1e-2), OptimConfig(name="adamp"))
    tracked = {n: p for n, p in m.named_parameters() if n in names["feeds_norm"]}
    eff = EffectiveLR(tracked)
    w0 = {n: p.detach().clone() for n, p in tracked.items()}
    _loss(m).backward()
    eff.before()
    opt.step()
    out = eff.after()
    assert set(out) == {f"eff_lr/{n}" for n in tracked} | {"eff_lr_mean"}
    for n, p in tracked.items():
        expected = ((p.detach() - w0[n]).norm() / w0[n].norm()).item()
        assert out[f"eff_lr/{n}"] == pytest.approx(expected, rel=1e-6)
    assert out["eff_lr_mean"] == pytest.approx(sum(out[f"eff_lr/{n}"] for n in tracked) / len(tracked))


# ---------------------------------------------------------------- config


def test_optim_config_section():
    c = load_config("tiny", ["optim.name=sgdp", "optim.nap=true", "optim.momentum=0.5", "optim.effective_lr_every=5"])
    assert (c.optim.name, c.optim.nap, c.optim.momentum, c.optim.effective_lr_every) == ("sgdp", True, 0.5, 5)
    assert RunConfig().optim == OptimConfig() and OptimConfig().name == "adamw" and not OptimConfig().nap
    assert "optim" in RunConfig().to_dict() and RunConfig().train.wd_norm is False


@pytest.mark.parametrize("optim, fragment", [
    ({"name": "adampp"}, "did you mean 'adamp'"),
    ({"name": "lion"}, "allowed: adamp, adamw, sgdp"),
    ({"nap": "yes"}, "optim.nap must be bool"),
    ({"delta": 0}, "optim.delta must be > 0"),
    ({"wd_ratio": 2.0}, "optim.wd_ratio must be in [0, 1]"),
    ({"momentum": 1.0}, "optim.momentum must be in [0, 1)"),
    ({"effective_lr_every": -1}, "optim.effective_lr_every must be >= 0"),
    ({"nap_every": 1}, "unknown config key 'optim.nap_every'"),
])
def test_bad_optim_config_is_one_line(optim, fragment):
    with pytest.raises(NormlabError) as e:
        config_from_dict({"optim": optim})
    assert fragment in str(e.value) and "\n" not in str(e.value)


def test_norm_warmup_defaults_to_lr_warmup(monkeypatch):
    from normlab.config import apply_norm_defaults
    from tests.helpers import scratch_norm

    class WarmNorm(nn.Module):
        needs_warmup = True

        def __init__(self, dim, *, eps=1e-5, affine=True, bias=True, warmup: int = 4000):
            super().__init__()

    scratch_norm(monkeypatch, "test_warm", WarmNorm)
    c = load_config("tiny", ["model.norm=test_warm", "train.warmup_steps=7"])
    apply_norm_defaults(c)
    assert c.model.norm_options == {"warmup": 7}
    c = load_config("tiny", ["model.norm=test_warm", "model.norm_options.warmup=3"])
    apply_norm_defaults(c)
    assert c.model.norm_options == {"warmup": 3}  # the user's value wins
    c = load_config("tiny", ["model.norm=layernorm"])
    apply_norm_defaults(c)
    assert c.model.norm_options == {}  # LayerNorm takes no warmup


# ---------------------------------------------------------------- end to end


NAP = [*TINY, "--set", "optim.name=adamp", "--set", "optim.nap=true", "--set", "optim.effective_lr_every=3",
       "--set", "model.placement=peri"]


@pytest.fixture(scope="module")
def nap_run(tmp_path_factory, cache):
    out = tmp_path_factory.mktemp("nap") / "run"
    normlab("train", "tiny", *NAP, "--out", str(out), cache=cache, check=True)
    return out


def test_nap_run_artifacts(nap_run):
    assert summary(nap_run)["status"] == "completed"
    records = [json.loads(line) for line in (nap_run / "metrics.jsonl").read_text().splitlines()]
    eff = [r for r in records if "eff_lr_mean" in r]
    assert [r["step"] for r in eff] == [3, 6, 9, 12, 15, 18, 21, 24]
    assert all(v > 0 for r in eff for k, v in r.items() if k.startswith("eff_lr"))
    groups = json.loads((nap_run / "param_groups.json").read_text())
    assert set(groups["feeds_norm"]) == projs(2)
    assert {f"eff_lr/{n}" for n in groups["feeds_norm"]} | {"eff_lr_mean", "step"} <= set(eff[0])
    state = json.loads(sorted((nap_run / "checkpoints").iterdir())[-1].joinpath("state.json").read_text())
    assert set(state["nap_init_norms"]) == projs(2)
    # the final weights sit exactly on their init norms (init rebuilt from the seed)
    cfg_run = open_config(nap_run)
    torch.manual_seed(cfg_run.seed)
    init = build_model(cfg_run.model)
    w = weights(nap_run)
    for n, p in init.named_parameters():
        if n in groups["feeds_norm"]:
            assert w[n].norm().item() == pytest.approx(p.detach().norm().item(), rel=1e-5)
            assert state["nap_init_norms"][n] == p.detach().norm().item()


def test_adamp_nap_resume_after_kill_9_is_bit_exact(nap_run, tmp_path, cache):
    out = tmp_path / "killed"
    kill_9_after(["train", "tiny", *NAP], out, cache, 12)
    assert not (out / "model.safetensors").exists(), "run finished before it could be killed"
    r = normlab("train", "--resume", str(out), cache=cache)
    assert r.returncode == 0, r.stderr
    assert_same_weights(nap_run, out)
    ra = [json.loads(line) for line in (nap_run / "metrics.jsonl").read_text().splitlines()]
    rb = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    ka = [{k: v for k, v in r.items() if k.startswith("eff_lr")} for r in ra]
    kb = [{k: v for k, v in r.items() if k.startswith("eff_lr")} for r in rb]
    assert ka == kb  # effective LR records identical too


def test_sgdp_run_completes(tmp_path, cache):
    out = tmp_path / "sgdp"
    r = run_inproc("train", "tiny", "--set", "train.steps=6", "--set", "optim.name=sgdp", "--set", "train.lr=0.05",
                   "--out", str(out), "--json", cache=cache, check=True)
    assert json.loads(r.stdout)["status"] == "completed"


def test_adamw_is_fused_on_cuda_and_foreach_elsewhere():
    """CPU runs keep the ``foreach`` AdamW they always used; parameters on CUDA get the fused kernel. The fused
    kernel (torch runs it on CPU too) gives the foreach update to fp32 round-off over a few steps, and a checkpoint
    round trip puts its step counter on the parameters' device."""
    from normlab.train.optim import adamw_kernel

    assert adamw_kernel(False) == {"foreach": True} and adamw_kernel(True) == {"fused": True}
    cfg = load_config("tiny", ["train.precision=fp32"])
    model = build_model(cfg.model)
    opt, _ = build_optimizer(model, cfg.train)
    assert opt.defaults["foreach"] is True and not opt.defaults.get("fused")
    torch.manual_seed(0)
    a, b = (nn.Parameter(torch.randn(5, 4)) for _ in range(2))
    b.data.copy_(a.data)
    oa = torch.optim.AdamW([a], lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, **adamw_kernel(False))
    ob = torch.optim.AdamW([b], lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, **adamw_kernel(True))
    for i in range(5):
        g = torch.randn(5, 4, generator=torch.Generator().manual_seed(i))
        a.grad, b.grad = g.clone(), g.clone()
        oa.step()
        ob.step()
    torch.testing.assert_close(b.data, a.data, rtol=1e-6, atol=1e-7)
    assert not torch.equal(a.data, torch.zeros_like(a)) and ob.defaults["fused"]
    ob2 = torch.optim.AdamW([b], lr=1e-2, **adamw_kernel(True))
    load_optimizer_tensors(ob2, optimizer_tensors(ob, {id(b): "b"}), {"b": b})
    assert ob2.state[b]["step"].device == b.device and float(ob2.state[b]["step"]) == 5.0


# ------------------------------------------------------------------------------------------- step_together
def _members(lrs, *, seed=0, **kw):
    """One small model and AdamW per learning rate (decay and no-decay groups), their gradients random."""
    tc = TrainConfig(weight_decay=0.1)
    out = []
    for i, lr in enumerate(lrs):
        torch.manual_seed(seed + i)
        model = build_model(ModelConfig(vocab_size=32, context=8, width=16, depth=1, heads=2))
        opt, _ = build_optimizer(model, tc)
        for g in opt.param_groups:
            g["lr"] = lr
            g.update(kw)
        out.append((model, opt))
    return out


def _grads(members, step):
    for i, (model, _) in enumerate(members):
        g = torch.Generator().manual_seed(1000 * step + i)
        for p in model.parameters():
            p.grad = torch.randn(p.shape, generator=g)


def test_step_together_updates_each_member_bit_for_bit_as_its_own_step():
    """Four members, two of them at one learning rate (one bucket), over three steps from an empty state: the
    parameters and the optimizer state equal those of each optimizer's own step() exactly."""
    lrs = [1e-3, 3e-3, 3e-3, 1e-2]
    together, alone = _members(lrs), _members(lrs)
    for step in range(3):
        _grads(together, step)
        _grads(alone, step)
        assert step_together([opt for _, opt in together])
        for _, opt in alone:
            opt.step()
    for (ma, oa), (mb, ob) in zip(together, alone):
        for (n, p), q in zip(ma.named_parameters(), mb.parameters()):
            assert torch.equal(p, q), n
            for k in ("exp_avg", "exp_avg_sq", "step"):
                assert torch.equal(oa.state[p][k], ob.state[q][k]), (n, k)


def test_step_together_refuses_what_it_cannot_batch_and_changes_nothing():
    hooked = _members([1e-3, 2e-3])
    hooked[1][1].register_step_pre_hook(lambda *a: None)  # perp-Grad's kind of hook
    for members in (hooked, _members([1e-3, 2e-3], amsgrad=True)):
        _grads(members, 0)
        before = [[p.clone() for p in m.parameters()] for m, _ in members]
        assert not step_together([opt for _, opt in members])
        assert all(torch.equal(p, q) for (m, _), b in zip(members, before) for p, q in zip(m.parameters(), b))
    tc = TrainConfig()
    sgdp, _ = build_optimizer(build_model(ModelConfig(vocab_size=32, context=8, width=16, depth=1, heads=2)), tc,
                              OptimConfig(name="sgdp"))
    assert not step_together([sgdp])
