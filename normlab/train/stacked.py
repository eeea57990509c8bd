"""Stacked training: runs that share an architecture train together as one stacked model, each as if alone.

A sweep's runs of one variant differ only in ``seed`` and ``train.lr`` (:func:`stack_key` is what they share). Such a
group trains in one process, one step at a time for all members: the members' parameters are stacked along a new
leading axis ``K`` every step (``torch.stack`` of each member's own leaf parameters, so gradients flow back to
them), and the model runs once on the members' batches with ``torch.func.vmap`` over ``torch.func.functional_call``
(the "model ensembling" recipe of torch.func; Horace He and Richard Zou, functorch, 2021)::

    params[name]  [K, *shape]     x, y  [K, B, T]     logits = vmap(functional_call(base, .))(params, x)  [K, B, T, V]

Everything else is each member's own, built by the same functions a run alone uses (``normlab.train.loop``): its
``seed`` for the initialisation (``torch.manual_seed(seed)`` before ``build_model``) and for the data order (its own
``torch.Generator``), its optimizer object over its own parameters (so its learning rate, weight-decay groups,
AdamP / SGDP, NaP and perp-Grad are exactly those of a run alone: AdamW is element-wise), gradient clipping,
divergence check (a member that diverges stops; the others go on), loss-spike detection, evaluation, checkpoints
(with its own RNG states), TensorBoard events and run directory (config.yaml, fingerprint, metrics.jsonl,
summary.json, model.safetensors). The loss of member ``k`` is ``lm_loss(logits[k], y[k])``; the backward pass of
their sum gives each member exactly the gradient of its own loss, because the members share no parameter.

A diagnostic step (``diag.every``) runs each member alone through its own module, so the forward hooks see exactly
what they see in a run alone; the other steps run stacked. A stacked step equals the K steps alone to fp32
round-off (batched matrix products sum in another order; tests/test_stacked.py), not bit for bit, so a run trained
stacked and the same run trained alone differ in the last bits, as two thread counts do; a stacked group resumed
from checkpoints of one step continues bit for bit as the uninterrupted group.

Not stacked (:func:`stack_refusal` names the reason, and ``train.stack: auto`` trains such runs alone): dropout (a
run alone draws its dropout masks from its global RNG stream, which a vmapped call cannot reproduce), norms that
update running statistics in their forward pass (PowerNorm, Unified Normalization, BatchNorm), data-parallel runs.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from normlab.config import RunConfig
from normlab.diagnostics.training import TrainDiagnostics
from normlab.diagnostics.weightnorms import weight_norm_record
from normlab.errors import NormlabError
from normlab.model.flops import flops_summary
from normlab.eval.lm import evaluate
from normlab.io import clean_stale_temps, dumps, exclusive_lock, write_json, write_text
from normlab.model import build_model
from normlab.run.files import CHECKPOINTS_DIR, CONFIG_FILE, METRICS_FILE, PARAM_GROUPS_FILE
from normlab.run.fingerprint import write_fingerprint
from normlab.run.publish import finish_run, write_config
from normlab.run.rundir import apply_norm_defaults, load_data, read_data_info, read_initial, run_data, save_run_identity
from normlab.run.tensors import list_checkpoints, load_checkpoint, save_checkpoint
from normlab.train.clipping import build_clipper
from normlab.train.init_eval import eval_mode_gap, initial_eval, near_chance_warning, unigram_bpb
from normlab.train.losses import lm_loss
from normlab.train.loop import (_interrupted_summary, _rng_from_json, _rng_to_json, _StopFlag, _truncate_metrics,
                                get_batch, loss_ceiling)
from normlab.train.optim import EffectiveLR, NormalizeAndProject, build_optimizer
from normlab.train.precision import (autocast, kept_determinism, nondeterministic_op_error, prepare_model,
                                    resolve_runtime)
from normlab.train.schedule import lr_at
from normlab.train.threads import resolve_threads, step_flops
from normlab.train.tracking import Tracker

STACKS = ("auto", "on", "off")
MEMBER_KEYS = ("seed", "train.lr")  # what the members of one stacked group may differ in


def stack_key(cfg: RunConfig) -> str:
    """What runs of one stacked group share: the whole identity less ``seed`` and ``train.lr`` (JSON text)."""
    d = cfg.identity_dict()
    d.pop("seed", None)
    d["train"].pop("lr", None)
    d["train"].pop("stack", None)
    return json.dumps(d, sort_keys=True)


def stack_refusal(cfg: RunConfig) -> str | None:
    """Why ``cfg`` cannot train in a stacked group (one line), or None."""
    if cfg.model.dropout > 0:
        return (f"model.dropout={cfg.model.dropout}: a run alone draws its dropout masks from its own RNG stream, "
                "which a stacked step cannot reproduce")
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = build_model(cfg.model)
    names = [n for n, b in model.named_buffers(remove_duplicate=True) if not _constant_buffer(model, n)]
    if names:
        return (f"model.norm={cfg.model.norm}: its running statistics ({names[0]}) change in the forward pass, "
                "which a stacked step cannot keep per member")
    return _trial(model, cfg)


def _trial(model: torch.nn.Module, cfg: RunConfig) -> str | None:
    """A stacked forward and backward of two copies of ``model`` on ``[2, 1, min(context, 16)]`` tokens (CPU, no
    RNG consumed): None when it runs, else why (an operation ``torch.func.vmap`` cannot batch)."""
    t = min(cfg.model.context, 16)
    params = {n: torch.stack([p.detach(), p.detach()]).requires_grad_() for n, p in model.named_parameters()}
    x = torch.zeros(2, 1, t, dtype=torch.long)
    try:
        with torch.random.fork_rng():
            out = torch.func.vmap(lambda p, xi: torch.func.functional_call(model, p, (xi,)), randomness="error")(
                params, x)
            out.float().square().mean().backward()
    except Exception as e:  # noqa: BLE001 - any failure means: train these runs alone
        first = (str(e).splitlines() or [type(e).__name__])[0][:160]
        return f"its forward pass cannot run under torch.func.vmap ({type(e).__name__}: {first})"
    return None


def _constant_buffer(model: torch.nn.Module, name: str) -> bool:
    """A non-persistent buffer (RoPE / ALiBi tables, masks) is a constant of the architecture; a persistent one
    (running statistics) is state a forward pass may change."""
    mod_name, _, buf = name.rpartition(".")
    mod = model.get_submodule(mod_name) if mod_name else model
    return buf in mod._non_persistent_buffers_set


def group_configs(cfgs: list[RunConfig]) -> list[list[int]]:
    """Indices of ``cfgs`` grouped by :func:`stack_key`, in first-seen order (a group of one trains alone)."""
    groups: dict[str, list[int]] = {}
    for i, c in enumerate(cfgs):
        groups.setdefault(stack_key(c), []).append(i)
    return list(groups.values())


@dataclass
class _Member:
    """One run of a stacked group: everything a run alone keeps, here per member."""

    cfg: RunConfig
    run_dir: Path
    data: Any
    model: torch.nn.Module
    opt: torch.optim.Optimizer
    groups: dict[str, list[str]]
    clipper: Any
    nap: NormalizeAndProject | None
    eff_lr: EffectiveLR
    diag: TrainDiagnostics
    gen: torch.Generator
    rng: torch.Tensor  # the member's global torch RNG state (what a run alone would hold now)
    cuda_rng: torch.Tensor | None
    run_hash: str = ""  # the config's hash as handed over, before the data and the machine fill in auto values
    tracker: Any = None
    init: dict[str, Any] = field(default_factory=dict)
    step: int = 0
    tokens_seen: int = 0
    elapsed: float = 0.0
    best: float | None = None
    status: str = "completed"
    last_loss: float = float("nan")
    val: dict[str, Any] = field(default_factory=dict)
    mark_tokens: int = 0
    done: bool = False
    mlog: Any = None


def _setup(cfg: RunConfig, run_dir: Path, *, resume: bool, data: Any, tb_dir: Path | None, run_hash: str) -> _Member:
    """As ``normlab.train.loop._train`` up to its first step, for one member (the runtime is already resolved)."""
    tc, mc, oc, dev = cfg.train, cfg.model, cfg.optim, cfg.device
    torch.manual_seed(cfg.seed)
    model = prepare_model(build_model(mc).to(dev), tc.precision)
    opt, groups = build_optimizer(model, tc, oc)
    clipper = build_clipper(model, tc)
    nap = NormalizeAndProject(model) if oc.nap else None
    eff_lr = EffectiveLR({n: p for n, p in model.named_parameters() if n in groups["feeds_norm"]})
    diag = TrainDiagnostics(model, cfg.diag)
    m = _Member(cfg, run_dir, data, model, opt, groups, clipper, nap, eff_lr, diag,
                torch.Generator().manual_seed(cfg.seed), torch.get_rng_state(),
                torch.cuda.get_rng_state() if dev == "cuda" else None, run_hash)
    metrics_path = run_dir / METRICS_FILE
    final: dict[str, Any] = {}
    if resume:
        ckpts = list_checkpoints(run_dir)
        if ckpts:
            state = load_checkpoint(ckpts[-1], model, opt)
            if state.get("config_hash") != cfg.hash():
                raise NormlabError(f"{ckpts[-1]} was written with another config; cannot resume from it")
            m.run_hash = state.get("run_hash", run_hash)
            m.step, m.tokens_seen = state["step"], state["tokens_seen"]
            m.elapsed, m.best = state["elapsed_s"], state.get("best_val_bpb")
            if nap is not None:
                nap.check(state.get("nap_init_norms"), str(ckpts[-1]))
            diag.load_state_dict(state.get("diag"))
            clipper.load_state_dict(state.get("clip"))
            m.rng = _rng_from_json(state["rng"]["torch"])
            if "cuda" in state["rng"]:
                m.cuda_rng = _rng_from_json(state["rng"]["cuda"])
            m.gen.set_state(_rng_from_json(state["rng"]["data"]))
            final = state.get("final") or {}
        _truncate_metrics(metrics_path, m.step)
        m.init = read_initial(metrics_path)
    else:
        run_dir.mkdir(parents=True, exist_ok=True)
        write_config(run_dir, cfg)
        write_json(run_dir / PARAM_GROUPS_FILE, groups)
        save_run_identity(run_dir, cfg, data)
        write_fingerprint(run_dir, cfg, model)
        m.init = initial_eval(model, data, cfg)
        write_text(metrics_path, json.dumps({"step": 0, **m.init}) + "\n")
    if final:
        m.last_loss = final["train_loss"] if final.get("train_loss") is not None else float("nan")
        m.val = {"loss": final["val_loss"], "bpb": final["val_bpb"]} if final.get("val_bpb") is not None else {}
    m.mark_tokens = m.tokens_seen
    m.tracker = Tracker(tb_dir if tb_dir is not None else run_dir / "tb", cfg.to_dict(), start_step=m.step,
                        track=tc.track)
    m.done = m.step >= tc.steps
    return m


class _StackedForward:
    """``forward(params [K, ...] per name, x [K, B, T]) -> logits [K, B, T, V]``: one vmapped ``functional_call``
    of ``base`` (a module of the group's architecture whose own parameters are never used). With ``compile_`` the
    vmapped function is ``torch.compile``d; if its first call fails (a transform torch cannot compile), the group
    runs it eager and ``note`` says why."""

    def __init__(self, base: torch.nn.Module, compile_: bool):
        def one(params: dict[str, torch.Tensor], x: torch.Tensor) -> torch.Tensor:
            return torch.func.functional_call(base, params, (x,))

        self.fn = torch.func.vmap(one, in_dims=(0, 0), randomness="error")
        self.compiled = torch.compile(self.fn) if compile_ else None
        self.calls, self.note = 0, ""
        self.names = [n for n, _ in base.named_parameters()]  # tied weights once, as named_parameters gives them

    def __call__(self, models: list[torch.nn.Module], x: torch.Tensor) -> torch.Tensor:
        own = [dict(m.named_parameters()) for m in models]
        params = {n: torch.stack([p[n] for p in own]) for n in self.names}
        self.calls += 1
        if self.compiled is not None:
            try:
                return self.compiled(params, x)
            except Exception as e:  # noqa: BLE001 - only the first call falls back; later errors are the model's
                if self.calls > 1:
                    raise
                self.compiled = None
                self.note = f"the stacked forward runs eager: torch.compile of it failed ({type(e).__name__})"
        return self.fn(params, x)


def train_stacked(cfgs: list[RunConfig], run_dirs: list[str | Path], *, resume: bool = False, quiet: bool = False,
                  tb_dirs: list[Path | None] | None = None, threads: int | None = None) -> list[dict[str, Any]]:
    """Train ``cfgs`` (one architecture: :func:`stack_key` equal, :func:`stack_refusal` None) into ``run_dirs`` as
    one stacked group. ``resume``: a member whose directory holds a run resumes from its last checkpoint, others
    start. Returns each member's summary, as ``normlab.train.loop.train`` returns it."""
    if len(cfgs) != len(run_dirs) or not cfgs:
        raise NormlabError("train_stacked needs one run directory per config, at least one")
    keys = {stack_key(c) for c in cfgs}
    if len(keys) > 1:
        raise NormlabError("a stacked group's runs must differ only in seed and train.lr")
    why = stack_refusal(cfgs[0])
    if why:
        raise NormlabError(f"train.stack: cannot stack these runs: {why}")
    dirs = [Path(d) for d in run_dirs]
    if len(set(dirs)) != len(dirs):
        raise NormlabError("a stacked group's run directories must differ")
    tb = tb_dirs or [None] * len(cfgs)
    with _StopFlag() as flag, kept_determinism(), contextlib.ExitStack() as locks:
        starts = []
        for d in dirs:
            again = resume and (d / CONFIG_FILE).is_file()
            if again:
                locks.enter_context(exclusive_lock(d / ".train.lock", f"run {d}"))
                clean_stale_temps(d / CHECKPOINTS_DIR, (".step_*",))
                clean_stale_temps(d, (".*.tmp",))
            starts.append(again)
        hashes = [c.hash() for c in cfgs]  # as handed over (the summary's config_hash, as a run alone records it)
        try:
            return _train_group(cfgs, dirs, starts, hashes, quiet=quiet, flag=flag, tb_dirs=tb, threads=threads)
        except KeyboardInterrupt:  # a second Ctrl-C: stop now, keep each member's last checkpoint, write summaries
            if not all((d / CONFIG_FILE).is_file() for d in dirs):
                raise
            return [_interrupted_summary(c, d, h) for c, d, h in zip(cfgs, dirs, hashes)]
        except BaseException as e:
            err = nondeterministic_op_error(e)  # train.deterministic on CUDA: an op without a deterministic kernel
            if err is not None:
                raise err from e
            raise


def _train_group(cfgs: list[RunConfig], dirs: list[Path], resumes: list[bool], hashes: list[str], *, quiet: bool,
                 flag: Any, tb_dirs: list[Any], threads: int | None) -> list[dict[str, Any]]:
    say = (lambda s: None) if quiet else (lambda s: print(s, flush=True))
    fresh = None
    datas = []
    for cfg, d, again in zip(cfgs, dirs, resumes):
        if again and read_data_info(d) is not None:
            datas.append(run_data(d, cfg))
        else:
            fresh = fresh or load_data(cfg)
            datas.append(fresh)
        cfg.model.vocab_size = datas[-1].vocab_size
        apply_norm_defaults(cfg)
        cfg.validate()
    n_threads, why_threads = resolve_threads(cfgs[0].train.threads, step_flops(cfgs[0]), override=threads)
    if n_threads:
        torch.set_num_threads(n_threads)
    runtime = [resolve_runtime(c) for c in cfgs][0]  # every member resolves alike (same shape and keys)
    runtime.append(f"threads {torch.get_num_threads()} ({why_threads})")
    runtime.append(f"stacked: {len(cfgs)} runs of one architecture in one model (train.stack)")
    members = [_setup(c, d, resume=r, data=x, tb_dir=t, run_hash=h)
               for c, d, r, x, t, h in zip(cfgs, dirs, resumes, datas, tb_dirs, hashes)]
    flag.tracker = None
    c0 = cfgs[0]
    tc, mc, dev = c0.train, c0.model, c0.device
    with torch.random.fork_rng(devices=[torch.cuda.current_device()] if dev == "cuda" else []):
        base = prepare_model(build_model(mc).to(dev), tc.precision)
    stacked = _StackedForward(base, bool(tc.compile))
    say(f"stacked group of {len(members)}: " + " | ".join(runtime))
    for m in members:
        m.model.train()
        m.mlog = (m.run_dir / METRICS_FILE).open("a")
    t_start, mark_t = time.time(), time.time()
    try:
        while True:
            live = [m for m in members if not m.done]
            if not live:
                break
            if flag.stop:
                for m in live:
                    m.status = "interrupted"
                    _checkpoint(m, m.step, t_start)
                break
            step = min(m.step for m in live)
            active = [m for m in live if m.step == step]
            for m in active:
                lr = lr_at(step, lr=m.cfg.train.lr, warmup=tc.warmup_steps, total=tc.steps, min_ratio=tc.min_lr_ratio)
                for g in m.opt.param_groups:
                    g["lr"] = lr
                m.diag.start_step(step)
            if active[0].diag.is_diag_step(step) or len(active) == 1:
                results = [_alone_step(m) for m in active]
            else:
                results = _stacked_step(active, stacked)
                if stacked.note:
                    say(stacked.note)
                    stacked.note = ""
            eval_s = 0.0
            for m, (loss_sum, extra) in zip(active, results):
                eval_s += _finish_step(m, step, loss_sum, extra, t_start, mark_t, say)
            mark_t += eval_s
            if any(m.step % tc.log_every == 0 or m.step == tc.steps for m in active):
                mark_t = time.time()
                for m in active:
                    m.mark_tokens = m.tokens_seen
    except BaseException as e:  # the TensorBoard event files still end, with the session's status
        for m in members:
            m.tracker.close("interrupted" if isinstance(e, KeyboardInterrupt) else "failed")
        raise
    finally:
        for m in members:
            if m.mlog is not None:
                m.mlog.close()
    wall = time.time() - t_start
    return [_summary(m, wall, why_threads) for m in members]


def _alone_step(m: _Member) -> tuple[float, dict[str, float]]:
    """One step of one member through its own module (a diagnostic step, or a group of one), as the loop runs it,
    with the member's own global RNG stream."""
    tc, mc, dev = m.cfg.train, m.cfg.model, m.cfg.device
    torch.set_rng_state(m.rng)
    if m.cuda_rng is not None:
        torch.cuda.set_rng_state(m.cuda_rng)
    loss_sum, extra = 0.0, {}
    for _ in range(tc.grad_accum):
        x, y = (t.to(dev) for t in get_batch(m.data.train, tc.batch_size, mc.context, m.gen))
        with autocast(dev, tc.precision):
            logits = m.model(x)
        loss, parts = lm_loss(logits.float(), y, z_loss=tc.z_loss, logitnorm_tau=tc.logitnorm_tau)
        m.diag.observe_output(logits, y)
        (loss / tc.grad_accum).backward()
        loss_sum += float(parts.pop("ce"))
        for k, v in parts.items():
            extra[k] = extra.get(k, 0.0) + float(v) / tc.grad_accum
    m.rng = torch.get_rng_state()
    if m.cuda_rng is not None:
        m.cuda_rng = torch.cuda.get_rng_state()
    return loss_sum, extra


def _stacked_step(active: list[_Member], stacked: _StackedForward) -> list[tuple[float, dict[str, float]]]:
    """One step of every member in ``active`` as one vmapped forward and one backward per micro-batch."""
    tc, mc, dev = active[0].cfg.train, active[0].cfg.model, active[0].cfg.device
    out: list[tuple[float, dict[str, float]]] = [(0.0, {}) for _ in active]
    models = [m.model for m in active]
    for _ in range(tc.grad_accum):
        batches = [get_batch(m.data.train, tc.batch_size, mc.context, m.gen) for m in active]
        x = torch.stack([b[0] for b in batches]).to(dev)  # [K, B, T]
        with autocast(dev, tc.precision):
            logits = stacked(models, x)  # [K, B, T, V]
        total = 0.0
        for k, (m, (_, y)) in enumerate(zip(active, batches)):
            loss, parts = lm_loss(logits[k].float(), y.to(dev), z_loss=tc.z_loss, logitnorm_tau=tc.logitnorm_tau)
            total = total + loss / tc.grad_accum
            loss_sum, extra = out[k]
            loss_sum += float(parts.pop("ce"))
            for key, v in parts.items():
                extra[key] = extra.get(key, 0.0) + float(v) / tc.grad_accum
            out[k] = (loss_sum, extra)
        total.backward()  # member k's parameters get the gradient of its own loss alone
    return out


def _finish_step(m: _Member, step: int, loss_sum: float, extra: dict[str, float], t_start: float, mark_t: float,
                 say: Any) -> float:
    """The rest of the loop's step for one member after its backward pass: divergence, clipping, update, metrics,
    evaluation, checkpoint. Returns the seconds spent evaluating."""
    tc, mc, oc = m.cfg.train, m.cfg.model, m.cfg.optim
    m.last_loss = loss_sum / tc.grad_accum
    m.diag.after_backward(step, m.last_loss)
    grad_norm = m.clipper.clip(step)
    lr = m.opt.param_groups[0]["lr"]
    ceiling = loss_ceiling(m.cfg)
    if not math.isfinite(m.last_loss) or m.last_loss > ceiling or not math.isfinite(grad_norm):
        m.status, m.done = "diverged", True
        m.step = step + 1
        say(f"{m.run_dir.name}: diverged at step {m.step}: loss {m.last_loss:.4g} (ceiling {ceiling:.3g}), "
            f"grad norm {grad_norm:.4g}")
        m.opt.zero_grad(set_to_none=True)
        return 0.0
    track = oc.effective_lr_every > 0 and (step + 1) % oc.effective_lr_every == 0
    if track:
        m.eff_lr.before()
    m.opt.step()
    if m.nap is not None:
        m.nap.project()
    m.opt.zero_grad(set_to_none=True)
    m.step = step = step + 1
    m.tokens_seen += tc.batch_size * mc.context * tc.grad_accum
    eff = m.eff_lr.after() if track else {}
    record: dict[str, Any] = {"step": step, **eff} if eff else {}
    record |= m.diag.collect()
    if step % tc.log_every == 0 or step == tc.steps:
        now = time.time()
        tok_s = (m.tokens_seen - m.mark_tokens) / max(now - mark_t, 1e-9)
        record |= {"step": step, "loss": m.last_loss, "lr": lr, "grad_norm": grad_norm, "tokens_per_s": tok_s,
                   "elapsed_s": m.elapsed + now - t_start, **extra, **m.clipper.metrics()}
    t_eval = time.time()
    if step % tc.eval_every == 0 or step == tc.steps:
        data = m.data
        m.val = evaluate(m.model, data.val, data.token_bytes, data.tokenizer.decode_bytes, context=mc.context,
                         batch_size=tc.batch_size, max_tokens=tc.eval_batches * tc.batch_size * mc.context,
                         spread=tc.eval_sample == "spread")
        m.best = m.val["bpb"] if m.best is None else min(m.best, m.val["bpb"])
        record.update({"step": step, "val_loss": m.val["loss"], "val_bpb": m.val["bpb"]})
        if "loss" not in record:
            record.update({"loss": m.last_loss, "lr": lr, "grad_norm": grad_norm})
        say(f"{m.run_dir.name} step {step}: val loss {m.val['loss']:.4f}, val bits/byte {m.val['bpb']:.4f}")
    eval_s = time.time() - t_eval
    if record:
        m.mlog.write(dumps(record) + "\n")
        m.mlog.flush()
        m.tracker.log(record)
    if step % tc.checkpoint_every == 0 or step == tc.steps:
        _checkpoint(m, step, t_start)
    m.done = step >= tc.steps
    return eval_s


def _checkpoint(m: _Member, at: int, t_start: float) -> None:
    state: dict[str, Any] = {"tokens_seen": m.tokens_seen, "elapsed_s": m.elapsed + time.time() - t_start,
                             "best_val_bpb": m.best, "run_hash": m.run_hash,
                             "rng": {"torch": _rng_to_json(m.rng), "data": _rng_to_json(m.gen.get_state())}}
    if m.cuda_rng is not None:
        state["rng"]["cuda"] = _rng_to_json(m.cuda_rng)
    state["diag"] = m.diag.state_dict()
    state["clip"] = m.clipper.state_dict()
    state["final"] = {"train_loss": m.last_loss, "val_loss": m.val.get("loss"), "val_bpb": m.val.get("bpb")}
    if m.nap is not None:
        state["nap_init_norms"] = m.nap.to_json()
    save_checkpoint(m.run_dir, at, m.model, m.opt, state, m.cfg.hash(), m.cfg.train.keep_checkpoints)


def _summary(m: _Member, wall: float, why_threads: str) -> dict[str, Any]:
    """``summary.json`` as ``normlab.train.loop._train`` writes it (``tokens_per_s``: this member's tokens over the
    group's wall time), then the final weights (a completed member) and the summary, last."""
    m.tracker.close(m.status)
    cfg, data, tc, mc = m.cfg, m.data, m.cfg.train, m.cfg.model
    total = m.elapsed + wall
    val = m.val
    summary = {
        "status": m.status, "step": m.step, "steps": tc.steps, "train_loss": m.last_loss,
        "val_loss": val.get("loss"), "val_bpb": val.get("bpb"), "best_val_bpb": m.best,
        "entropy_floor_bpb": data.entropy_floor_bpb, "unigram_bpb": data.unigram_bpb,
        "gap_bpb": (val["bpb"] - data.entropy_floor_bpb) if (val and data.entropy_floor_bpb is not None) else None,
        "tokens_seen": m.tokens_seen, "tokens_per_s": m.tokens_seen / max(total, 1e-9),
        "elapsed_s": total, "params": m.model.num_params(), "config_hash": m.run_hash,
        "loss_spikes": m.diag.summary(), **m.clipper.summary(), "run_dir": str(m.run_dir), **m.init,
        "weight_norms": {k.split("/", 1)[1]: v for k, v in weight_norm_record(m.model).items()},
        "device": cfg.device, "precision": tc.precision, "compile": tc.compile, "compile_s": None,
        "threads": torch.get_num_threads(), "threads_reason": why_threads,
        **flops_summary(mc, m.tokens_seen, total),  # analytic FLOPs per token, measured wall s per token
    }
    recent = list(m.diag.spikes.history) or [m.last_loss]
    gap = eval_mode_gap(mc.norm, sum(recent) / len(recent), val.get("loss"), val.get("bpb"))
    if gap:
        summary["eval_mode_warning"] = gap
    unigram = unigram_bpb(data.val, data.vocab_size, data.split_bytes["val"])
    flat = near_chance_warning(mc.norm, tc.lr, val.get("bpb"), m.init.get("init_val_bpb"), unigram)
    if flat and m.status == "completed":
        summary["near_chance_warning"] = flat
    if m.status == "interrupted" and not (m.run_dir / CONFIG_FILE).is_file():
        return summary
    finish_run(m.run_dir, cfg, m.model if m.status == "completed" else None, summary)
    return summary

