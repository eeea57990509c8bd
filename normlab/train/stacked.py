"""Stacked training: runs that share an architecture train together as one stacked model, each as if alone.

A sweep's runs of one variant differ only in ``seed`` and ``train.lr`` (``normlab.train.stackable.stack_key`` is
what they share). Such a
group trains in one process, one step at a time for all members: the members' parameters are stacked along a new
leading axis ``K`` every step (``torch.stack`` of each member's own leaf parameters, so gradients flow back to
them), and the model runs once on the members' batches with ``torch.func.vmap`` over ``torch.func.functional_call``
(the "model ensembling" recipe of torch.func; Horace He and Richard Zou, functorch, 2021)::

    params[name]  [K, *shape]     x, y  [K, B, T]     logits = vmap(functional_call(base, .))(params, x)  [K, B, T, V]

Everything else is each member's own, built by the same functions a run alone uses (``normlab.train.loop``): its
``seed`` for the initialisation (``torch.manual_seed(seed)`` before ``build_model``) and for the data order (its own
``torch.Generator``), its optimizer object over its own parameters (so its learning rate, weight-decay groups,
AdamP / SGDP, NaP and perp-Grad are exactly those of a run alone: AdamW is element-wise; plain AdamW members are
updated together, one fused or multi-tensor call per learning rate they share, normlab.train.optim.step_together,
bit for bit as each one's own ``step()``), gradient clipping,
divergence check (a member that diverges stops; the others go on), loss-spike detection, evaluation, checkpoints
(with its own RNG states), TensorBoard events and run directory (config.yaml, fingerprint, metrics.jsonl,
summary.json, model.safetensors). The group keeps its shape ``K`` to the end: a member that diverged or finished (or
is ahead after a resume) holds a masked slot in the stacked forward (placeholder weights without gradient, no loss,
nothing drawn from its data or RNG), so a compiled group compiles once and never recompiles for a new size. The
loss of member ``k`` is ``lm_loss(logits[k], y[k])``; the backward pass of
their sum gives each member exactly the gradient of its own loss, because the members share no parameter.

A diagnostic step (``diag.every``) runs each member alone through its own module, so the forward hooks see exactly
what they see in a run alone; the other steps run stacked. A stacked step equals the K steps alone to fp32
round-off (batched matrix products sum in another order; tests/train/test_stacked.py), not bit for bit, so a run trained
stacked and the same run trained alone differ in the last bits, as two thread counts do; a stacked group resumed
from checkpoints of one step continues bit for bit as the uninterrupted group.

Host reads: as a run alone (``normlab.train.loop.defer_reads``), on an accelerator a group step that no member
logs, diagnoses, evaluates or checkpoints reads nothing to the host; each member queues its loss and gradient norm
(``RunState.step_unread``) and the next read point settles every member in step order (``RunState.settle``): a
member that diverged at a queued step stops there, with the step, status, summary and messages a read at once gives.

Dropout (``model.dropout > 0``), on a CPU: a run alone draws its masks from its global RNG stream, which a vmapped call
cannot do per member, so the group records the forward's dropout calls once and, before each stacked micro-batch,
draws every member's masks with that member's own RNG state, in call order -- the masks its forward alone would draw,
bit for bit (``normlab.attention.dropout``) -- and hands them into the vmapped forward. Such a group runs eager, and
only runs that would run eager alone stack (a compiled run alone draws its masks in inductor's kernels).

Which runs stack (``stack_key``, ``stack_refusal``: dropout on CUDA, norms with running statistics, a forward vmap
cannot run; data-parallel runs never do) and the vmapped forward itself are ``normlab.train.stackable``.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import torch

from normlab.config import RunConfig
from normlab.errors import NormlabError
from normlab.interrupt import StopFlag
from normlab.io import dumps
from normlab.model import build_model
from normlab.rundir.files import CONFIG_FILE
from normlab.rundir.publish import finish_interrupted
from normlab.rundir.readers import load_data, read_data_info, run_data
from normlab.safety import printable
from normlab.train.loop import defer_reads, get_batch, to_device
from normlab.train.precision import (kept_determinism, nondeterministic_op_error, prepare_model)
from normlab.train.optim import step_together
from normlab.train.runstate import RunState, claim_run_dir
from normlab.train.stackable import StackedForward, stack_key, stack_refusal
from normlab.train.step import Parts, StepLosses, forward_backward, micro_backward
from normlab.train.resolve import resolve_group
from normlab.train.tracking import Tracker

@dataclass
class _Member(RunState):
    """One run of a stacked group: a run alone's state (``RunState``), its own global torch RNG state (what a run
    alone would hold now: the process's state belongs to the group), its tracker and metrics file."""

    rng: torch.Tensor | None = None
    cuda_rng: torch.Tensor | None = None
    tracker: Any = None
    mlog: IO[str] | None = None
    mark_tokens: int = 0
    done: bool = False
    error: str | None = None  # why the member failed (its host-side step raised): it left the group


def _setup(cfg: RunConfig, run_dir: Path, *, resume: bool, data: Any, tb_dir: Path | None, run_hash: str) -> _Member:
    """As ``normlab.train.loop.Recipe.setup`` builds its model and state, for one member (the runtime is already
    resolved)."""
    tc, dev = cfg.train, cfg.device
    torch.manual_seed(cfg.seed)
    model = prepare_model(build_model(cfg.model).to(dev), tc.precision)
    m = _Member.build(cfg, run_dir, data, model, run_hash)
    m.rng, m.cuda_rng = torch.get_rng_state(), torch.cuda.get_rng_state() if dev == "cuda" else None
    if resume:
        rng = m.resume()
        if rng is not None:
            m.rng = rng["torch"]
            if "cuda" in rng:
                m.cuda_rng = rng["cuda"]
    else:
        m.start_run_dir()
    m.mark_tokens = m.tokens_seen
    m.tracker = Tracker(tb_dir if tb_dir is not None else run_dir / "tb", cfg.to_dict(), start_step=m.step,
                        track=tc.track)
    m.done = m.step >= tc.steps
    return m


def train_stacked(cfgs: list[RunConfig], run_dirs: list[str | Path], *, resume: bool = False, quiet: bool = False,
                  tb_dirs: list[Path | None] | None = None, threads: int | None = None) -> list[dict[str, Any]]:
    """Train ``cfgs`` (one architecture: :func:`stack_key` equal, :func:`stack_refusal` None) into ``run_dirs`` as
    one stacked group. ``resume``: a member whose directory holds a run resumes from its last checkpoint, others
    start. Returns each member's summary, as ``normlab.train.loop.train`` returns it (a member whose own step
    raised: ``{"status": "failed", "error": ...}``, and the others train on: :func:`_fail`)."""
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
    with StopFlag() as flag, kept_determinism(), contextlib.ExitStack() as locks:
        starts = []
        for d in dirs:
            again = resume and (d / CONFIG_FILE).is_file()
            if again:
                locks.enter_context(claim_run_dir(d))
            starts.append(again)
        hashes = [c.hash() for c in cfgs]  # as handed over (the summary's config_hash, as a run alone records it)
        try:
            return _train_group(cfgs, dirs, starts, hashes, quiet=quiet, flag=flag, tb_dirs=tb, threads=threads)
        except KeyboardInterrupt:  # a second Ctrl-C: stop now, keep each member's last checkpoint, write summaries
            if not all((d / CONFIG_FILE).is_file() for d in dirs):
                raise
            return [finish_interrupted(d, c, h) for c, d, h in zip(cfgs, dirs, hashes)]
        except BaseException as e:
            err = nondeterministic_op_error(e)  # train.deterministic on CUDA: an op without a deterministic kernel
            if err is not None:
                raise err from e
            raise


def _train_group(cfgs: list[RunConfig], dirs: list[Path], resumes: list[bool], hashes: list[str], *, quiet: bool,
                 flag: StopFlag, tb_dirs: list[Any], threads: int | None) -> list[dict[str, Any]]:
    say = (lambda s: None) if quiet else (lambda s: print(s, flush=True))
    failed: dict[int, dict[str, Any]] = {}  # members that cannot resume (their own files): reported, not trained
    datas = _group_data(cfgs, dirs, resumes, failed, say)
    keep = [i for i in range(len(cfgs)) if i not in failed]
    if not keep:
        return [failed[i] for i in range(len(cfgs))]
    # the group's memory at once, before any run directory
    resolved = resolve_group([cfgs[i] for i in keep], [datas[i] for i in keep], threads=threads)
    why_threads = resolved[0].why_threads
    runtime = [*resolved[0].runtime, f"threads {torch.get_num_threads()} ({why_threads})",
               f"stacked: {len(keep)} runs of one architecture in one model (train.stack)"]
    members = []
    for i, r in zip(keep, resolved):
        try:
            members.append(_setup(r.cfg, dirs[i], resume=resumes[i], data=datas[i], tb_dir=tb_dirs[i],
                                  run_hash=hashes[i]))
        except Exception as e:  # noqa: BLE001 - a resumed member's checkpoint: it alone fails
            if not resumes[i]:
                raise
            failed[i] = _cannot_resume(dirs[i], r.cfg, e, say)
    if not members:
        return [failed[i] for i in range(len(cfgs))]
    cfgs = [m.cfg for m in members]
    c0 = cfgs[0]
    tc, mc, dev = c0.train, c0.model, c0.device
    with torch.random.fork_rng(devices=[torch.cuda.current_device()] if dev == "cuda" else []):
        base = prepare_model(build_model(mc).to(dev), tc.precision)
    stacked = StackedForward(base, bool(tc.compile))
    defer = defer_reads(c0)  # on an accelerator: a step that is no member's read point reads nothing
    say(f"stacked group of {len(members)}: " + " | ".join(runtime))
    for m in members:
        m.model.train()
        m.mlog = m.metrics_path.open("a")
    t_start, mark_t = time.time(), time.time()
    fell_back: int | None = None  # the step from which a compiled group ran eager
    try:
        while True:
            live = [m for m in members if not m.done]
            if not live:
                break
            step = min(m.step for m in live)
            read = not defer or live[0].read_point(step)  # the members share their schedule (stack_key)
            stop = flag.stop
            if (read or stop) and _settle(live, say):
                continue  # a member diverged at a step taken unread: it stops there, the others go on
            if stop:
                for m in live:
                    m.status = "interrupted"
                    _checkpoint(m, t_start)
                break
            active = [m for m in live if m.step == step]
            lrs = [m.set_lr() for m in active]
            for m in active:
                m.diag.start_step(step)
            if active[0].diag.is_diag_step(step) or len(active) == 1:
                results = [_alone_step(m) for m in active]
            else:
                results = _stacked_step(members, active, stacked)
                if stacked.note:
                    say(f"{stacked.note} (from step {step + 1})")
                    stacked.note, fell_back = "", step + 1
            if not read:  # no host read: each member's checks wait for the next read point
                for m, (loss_sum, _) in zip(active, results):
                    m.hold(loss_sum)  # RunState.step_unread, its update taken with the group's
                for m, track in zip(active, _update(active, say)):
                    if track is not None:
                        m.advance(False)
                continue
            checked = []  # the members that update: (member, lr, extra terms, gradient norm)
            for m, lr, (loss_sum, extra) in zip(active, lrs, results):
                try:
                    grad_norm = _check_step(m, loss_sum, say)
                except Exception as e:  # noqa: BLE001 - this member fails alone; the others go on
                    _fail(m, e, say)
                    continue
                if grad_norm is not None:
                    checked.append((m, lr, extra, grad_norm))
            tracked = _update([c[0] for c in checked], say)
            eval_s = 0.0
            for (m, lr, extra, grad_norm), track in zip(checked, tracked):
                if track is None:  # its update failed
                    continue
                try:
                    eval_s += _finish_step(m, lr, grad_norm, extra, track, t_start, mark_t, say)
                except Exception as e:  # noqa: BLE001 - this member fails alone; the others go on
                    _fail(m, e, say)
            mark_t += eval_s
            if any(m.step % tc.log_every == 0 or m.step == tc.steps for m in active):
                mark_t = time.time()
                for m in active:
                    m.mark_tokens = m.tokens_seen
    except BaseException as e:  # the TensorBoard event files still end, with the session's status
        for m in members:
            m.tracker.close("interrupted" if isinstance(e, KeyboardInterrupt) else "failed")
            m.writer.settle()  # each member's last checkpoint whole before the group's error or summaries
        raise
    finally:
        for m in members:
            if m.mlog is not None:
                m.mlog.close()
    wall = time.time() - t_start
    for m in members:  # the checkpoints still being written (normlab.train.checkpointer); one that failed fails its
        try:           # member alone, as a write in the step did
            m.writer.wait()
        except Exception as e:  # noqa: BLE001 - this member fails alone; the others go on
            if m.status != "failed":
                _fail(m, e, say)
    done = iter([_summary(m, wall, why_threads, fell_back, runtime) for m in members])
    return [failed[i] if i in failed else next(done) for i in range(len(dirs))]


def _cannot_resume(run_dir: Path, cfg: RunConfig, e: Exception, say: Any) -> dict[str, Any]:
    """A resumed member whose own files cannot be read back (a damaged checkpoint, its data's identity): one line
    naming its run directory, and a failed result like :func:`_fail`'s (no summary written; its files stay as they
    are for a look, or a resume once repaired). The group trains without it."""
    why = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:300]}" if not isinstance(e, NormlabError) else \
        (str(e).splitlines() or [""])[0][:300]
    say(printable(f"{run_dir}: cannot resume ({why}); the group goes on without it"))
    return {"status": "failed", "error": f"cannot resume: {why}", "step": None, "steps": cfg.train.steps,
            "run_dir": str(run_dir)}


def _group_data(cfgs: list[RunConfig], dirs: list[Path], resumes: list[bool], failed: dict[int, dict[str, Any]],
                say: Any) -> list[Any]:
    """Each member's token splits: a resumed member's own, else one load shared by the new members. A resumed
    member whose data cannot be opened again (``run_data``'s one-line refusals) goes to ``failed``."""
    fresh = None
    datas: list[Any] = []
    for i, (cfg, d, again) in enumerate(zip(cfgs, dirs, resumes)):
        if again and read_data_info(d) is not None:
            try:
                datas.append(run_data(d, cfg))
            except NormlabError as e:
                failed[i] = _cannot_resume(d, cfg, e, say)
                datas.append(None)
        else:
            fresh = fresh or load_data(cfg)
            datas.append(fresh)
    return datas


def _alone_step(m: _Member) -> StepLosses:
    """One step of one member through its own module (a diagnostic step, or a group of one): the loop's step
    (``normlab.train.step``, as a run alone takes it) with the member's own global RNG stream. Returns the summed
    cross-entropy and the mean extra loss terms as 0-dim float64 tensors on the device, read at a read point."""
    tc, mc, dev = m.cfg.train, m.cfg.model, m.cfg.device
    torch.set_rng_state(m.rng)
    if m.cuda_rng is not None:
        torch.cuda.set_rng_state(m.cuda_rng)

    def micro(i: int) -> list[Parts]:
        x, y = (to_device(t, dev) for t in get_batch(m.data.train, tc.batch_size, mc.context, m.gen))
        return micro_backward(lambda: m.model(x), [y], tc, dev, observe=m.diag.observe_output)

    [out] = forward_backward(micro, 1, tc.grad_accum)
    m.rng = torch.get_rng_state()
    if m.cuda_rng is not None:
        m.cuda_rng = torch.cuda.get_rng_state()
    return out


def _stacked_step(members: list[_Member], active: list[_Member], stacked: StackedForward) -> list[StepLosses]:
    """One step of every member in ``active`` as one vmapped forward and one backward per micro-batch (the loop's
    step, ``normlab.train.step``, with the group's forward); each member's losses as :func:`_alone_step` returns
    them (on the device, unread). The forward keeps the group's shape: one slot per member of ``members``, and a
    member that is not stepping (it diverged or finished, or is ahead after a resume) holds a masked slot -- the
    group's constant placeholder weights (:attr:`StackedForward.rest`, which get no gradient) on token 0, no loss,
    nothing drawn from its data or RNG -- so a compiled group never recompiles for a new size."""
    tc, mc, dev = active[0].cfg.train, active[0].cfg.model, active[0].cfg.device
    slots = [m if m in active else None for m in members]
    models = [m.model if m is not None else None for m in slots]

    def micro(i: int) -> list[Parts]:
        batches = [get_batch(m.data.train, tc.batch_size, mc.context, m.gen) if m is not None else None for m in slots]
        blank = torch.zeros_like(next(b for b in batches if b is not None)[0])
        x = to_device(torch.stack([b[0] if b is not None else blank for b in batches]), dev)  # [K, B, T]
        ys = [to_device(b[1], dev) if b is not None else None for b in batches]
        rngs = [m.rng if m is not None else None for m in slots]
        noise = stacked.draw(x, rngs, tc.precision)  # each member's dropout masks, from its own RNG stream
        for m, rng in zip(slots, rngs):
            if m is not None:
                m.rng = rng
        try:
            parts = micro_backward(lambda: stacked(models, x, noise), ys, tc, dev)
        except Exception as e:
            if not stacked.fall_back(e):
                raise
            for model in models:  # the first micro-batch of a step: no gradient was there before it
                if model is not None:
                    model.zero_grad(set_to_none=True)
            parts = micro_backward(lambda: stacked(models, x, noise), ys, tc, dev)
        return [p for p in parts if p is not None]

    return forward_backward(micro, len(active), tc.grad_accum)


def _settle(live: list[_Member], say: Any) -> bool:
    """The host part of each member's steps taken unread (``RunState.settle``): spike records written in step
    order; a member that diverged at one of them stops there. True when one did."""
    stopped = False
    for m in live:
        if not m.pending:
            continue
        records, diverged = m.settle()
        for rec in records:
            _write(m, rec)
        if diverged:
            m.done = stopped = True
            say(f"{m.run_dir.name}: {diverged}")
    return stopped


def _write(m: _Member, record: dict[str, Any]) -> None:
    """A member's metrics record to its metrics.jsonl and trackers."""
    m.mlog.write(dumps(record) + "\n")
    m.mlog.flush()
    m.tracker.log(record)


def _check_step(m: _Member, loss_sum: Any, say: Any) -> float | None:
    """The loop's step for one member after its backward pass, up to its update: clipping and the divergence
    check. Returns the gradient norm before clipping, or None for a member that diverged (it stops there)."""
    grad_norm = m.after_backward(loss_sum)
    diverged = m.diverged(grad_norm)
    if diverged:
        m.done = True
        say(f"{m.run_dir.name}: {diverged}")
        m.opt.zero_grad(set_to_none=True)
        return None
    return grad_norm


def _update(members: list[_Member], say: Any) -> list[bool | None]:
    """The members' updates at once (``RunState.optimizer_step`` of each): one AdamW call per learning rate
    shared by members (normlab.train.optim.step_together), else each member's own ``step()``, a member whose
    update raises failing alone. Returns, per member, whether its effective learning rate is recorded this step,
    None where its update failed."""
    tracks: list[bool | None] = [m.before_update() for m in members]
    if not step_together([m.opt for m in members]):
        for i, m in enumerate(members):
            try:
                m.opt.step()
            except Exception as e:  # noqa: BLE001 - this member fails alone; the others go on
                _fail(m, e, say)
                tracks[i] = None
    for i, m in enumerate(members):
        if tracks[i] is not None:
            try:
                m.after_update()
            except Exception as e:  # noqa: BLE001 - this member fails alone; the others go on
                _fail(m, e, say)
                tracks[i] = None
    return tracks


def _finish_step(m: _Member, lr: float, grad_norm: float, extra: dict[str, Any], tracked: bool, t_start: float,
                 mark_t: float, say: Any) -> float:
    """The rest of the loop's step for one member after its update: metrics, evaluation, checkpoint. Returns the
    seconds spent evaluating."""
    tc = m.cfg.train
    record = m.advance(tracked)
    if m.due(tc.log_every):
        now = time.time()
        tok_s = (m.tokens_seen - m.mark_tokens) / max(now - mark_t, 1e-9)
        m.log_fields(record, lr, grad_norm, extra, tok_s, m.elapsed + now - t_start)
    t_eval = time.time()
    if m.due(tc.eval_every):
        say(f"{m.run_dir.name} {m.evaluate(record, lr, grad_norm)}")
    eval_s = time.time() - t_eval
    if record:
        _write(m, record)
    if m.due(tc.checkpoint_every):
        _checkpoint(m, t_start)
    m.done = m.step >= tc.steps
    return eval_s


def _checkpoint(m: _Member, t_start: float) -> None:
    m.checkpoint(m.step, m.elapsed + time.time() - t_start, m.rng, m.cuda_rng)


def _fail(m: _Member, e: Exception, say: Any) -> None:
    """Member ``m``'s own step failed (its update, evaluation, metrics or checkpoint raised ``e``; an operation of
    the stacked forward fails the group): it leaves the group -- masked from the next step on, the group's shape
    kept -- with its gradients dropped; the others train on. Like a run alone that raised, it writes no summary
    (its last checkpoint stays), and the group reports it as failed with the error."""
    m.status, m.done = "failed", True
    m.error = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:300]}"
    m.opt.zero_grad(set_to_none=True)
    say(f"{m.run_dir.name}: failed ({m.error}); the group goes on without it")


def _summary(m: _Member, wall: float, why_threads: str, fell_back: int | None = None,
             runtime: list[str] | None = None) -> dict[str, Any]:
    """``summary.json`` as a run alone writes it (``tokens_per_s``: this member's tokens over the group's wall
    time; ``compile_fallback_step``: the step from which a compiled group ran eager, where it did), then the final
    weights (a completed member) and the summary, last. A failed member (:func:`_fail`) writes none: its result is
    ``{"status": "failed", "error": ...}``."""
    m.tracker.close(m.status)
    if m.status == "failed":
        return {"status": "failed", "error": m.error, "step": m.step, "steps": m.cfg.train.steps,
                "run_dir": str(m.run_dir)}
    summary = m.summary(m.elapsed + wall, why_threads, None)
    summary["runtime_notes"] = list(runtime or [])  # as a run alone records them (the group's choices)
    if fell_back is not None:
        summary["compile_fallback_step"] = fell_back
    if m.status == "interrupted" and not (m.run_dir / CONFIG_FILE).is_file():
        return summary
    m.finish(summary)
    return summary
