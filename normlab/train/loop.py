"""The training loop: data -> model -> optimizer (AdamW / AdamP / SGDP, optional NaP) -> checkpoints, metrics and a
summary in a run directory.

Determinism: ``cfg.seed`` seeds model init (global torch RNG before ``build_model``), data order (a dedicated
``torch.Generator`` seeded with ``seed``) and dropout (the global RNG afterwards). A checkpoint stores both RNG
states, the optimizer state and the step, so ``--resume`` reproduces an uninterrupted run bit for bit.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from normlab.config import RunConfig, non_default
from normlab.diagnostics.training import TrainDiagnostics
from normlab.diagnostics.weightnorms import weight_norm_record
from normlab.errors import NormlabError
from normlab.eval.lm import evaluate
from normlab.io import clean_stale_temps, dumps, exclusive_lock, read_json_object, write_json, write_text
from normlab.run.files import CHECKPOINTS_DIR, CONFIG_FILE, METRICS_FILE, PARAM_GROUPS_FILE
from normlab.run.publish import finish_run, write_config
from normlab.run.fingerprint import write_fingerprint
from normlab.run.rundir import apply_norm_defaults, load_data, read_initial, read_jsonl
from normlab.model import build_model
from normlab.model.flops import flops_summary
from normlab.train.losses import lm_loss
from normlab.train.init_from import load_init, resolve_init, source_tokenizer
from normlab.train.init_from import write_record as write_init_record
from normlab.train.init_eval import eval_mode_gap, initial_eval, near_chance_warning, unigram_bpb
from normlab.run.tensors import list_checkpoints, load_checkpoint, save_checkpoint
from normlab.train.clipping import build_clipper
from normlab.train.distributed import SINGLE, DistContext, StopSignals
from normlab.train.optim import EffectiveLR, NormalizeAndProject, build_optimizer
from normlab.train.precision import (CompileTimer, autocast, kept_determinism, nondeterministic_op_error,
                                    prepare_model, resolve_runtime)
from normlab.train.heap import heap_policy_note
from normlab.train.progress import ProgressReporter
from normlab.train.threads import record_run, resolve_threads, step_flops, wait_policy_note
from normlab.train.tracking import Tracker, probe_trackers
from normlab.train.schedule import lr_at
from normlab.validate import check_train_memory

def get_batch(tokens: np.ndarray, batch_size: int, context: int, gen: torch.Generator,
              rows: slice | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Random windows: ``x, y [batch_size, context]`` int64 with ``y`` shifted by one token. ``rows``: keep only
    these rows of the batch (a data-parallel rank's share; the generator advances by the whole batch)."""
    ix = torch.randint(len(tokens) - context - 1, (batch_size,), generator=gen).tolist()
    ix = ix[rows] if rows is not None else ix
    chunk = np.stack([tokens[i : i + context + 1] for i in ix]).astype(np.int64)
    t = torch.from_numpy(chunk)
    return t[:, :-1], t[:, 1:]


def loss_ceiling(cfg: RunConfig) -> float:
    """Loss above which a run counts as diverged: ``train.loss_ceiling`` or ``3 ln(vocab)`` (3x uniform)."""
    return cfg.train.loss_ceiling if cfg.train.loss_ceiling is not None else 3.0 * math.log(cfg.model.vocab_size)


class NullTracker:
    """What a data-parallel rank other than 0 tracks: nothing."""

    def log(self, record: dict[str, Any]) -> None:
        pass

    def close(self, status: str) -> None:
        pass


class _StopFlag:
    """SIGINT (Ctrl-C) or SIGTERM (``kill``, a batch scheduler's pre-emption notice, as torchrun's ranks get in
    ``StopSignals``) sets a flag checked between steps, so a checkpoint is never taken mid-update; a second signal
    stops at once."""

    def __init__(self) -> None:
        self.stop = False
        self._old: dict[int, Any] = {}
        self.tracker: Tracker | None = None  # closed by train() when a second Ctrl-C ends the loop at once

    def __enter__(self) -> "_StopFlag":
        if threading.current_thread() is threading.main_thread():
            self._old = {s: signal.signal(s, self._handle) for s in (signal.SIGINT, signal.SIGTERM)}
        return self

    def _handle(self, *_: Any) -> None:
        if self.stop:  # second Ctrl-C: give up immediately
            raise KeyboardInterrupt
        self.stop = True

    def __exit__(self, *exc: Any) -> None:
        for s, h in self._old.items():
            if h is not None:  # None: a handler not installed from Python, which cannot be put back
                signal.signal(s, h)


def _rng_to_json(state: torch.Tensor) -> list[int]:
    return state.tolist()


def _rng_from_json(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.uint8)


def _truncate_metrics(path: Path, step: int) -> None:
    """Keep only records with ``step <= step`` (after a resume from that checkpoint)."""
    if not path.exists():
        return
    keep = [rec for rec in read_jsonl(path) if rec.get("step", 0) <= step]  # cut / junk / non-UTF-8 lines dropped
    write_text(path, "".join(dumps(rec) + "\n" for rec in keep))


def train(cfg: RunConfig, run_dir: str | Path, *, resume: bool = False, quiet: bool = False,
          tb_dir: str | Path | None = None, init_from: str | Path | None = None,
          dist: DistContext | None = None, threads: int | None = None) -> dict[str, Any]:
    """Train ``cfg`` into ``run_dir`` (new, or resumed from its last checkpoint). Returns the summary dict.

    TensorBoard scalars and hparams are written live to ``tb_dir`` (default ``RUN_DIR/tb``; normlab.train.tracking).

    ``init_from``: a run directory whose weights replace the seeded initialisation (normlab.train.init_from).

    The summary's ``status`` is ``completed``, ``diverged`` (non-finite loss or loss above the ceiling; ``step``
    is the step that diverged) or ``interrupted`` (Ctrl-C; resumable). Ctrl-C is handled from the first line (a
    first one checkpoints at the next step boundary, also before the first step; a second one stops at once and
    still writes ``summary.json``); ``--resume`` holds ``RUN_DIR/.train.lock`` and first removes the temporary
    files a kill -9 left (``checkpoints/.step_*``, ``.*.tmp``).

    ``threads``: a torch thread count planned by the caller (a sweep worker), over ``train.threads``
    (normlab.train.threads).

    ``dist``: this process's rank in a data-parallel run (``normlab.train.distributed``; only rank 0 writes
    ``run_dir``; SIGINT/SIGTERM on any rank stop all ranks at the same step).
    """
    run_dir = Path(run_dir)
    ctx = dist or SINGLE
    owner = resume and ctx.is_main
    with _own_load_record():  # this run's CPU use, taken off the load average by the next run's thread decision
        return _train_locked(cfg, run_dir, resume=resume, quiet=quiet, tb_dir=tb_dir, init_from=init_from, ctx=ctx,
                             threads=threads, owner=owner)


@contextlib.contextmanager
def _own_load_record():
    t0, c0 = time.monotonic(), time.process_time()
    try:
        yield
    finally:
        record_run(time.monotonic() - t0, time.process_time() - c0)


def _train_locked(cfg: RunConfig, run_dir: Path, *, resume: bool, quiet: bool, tb_dir: Any, init_from: Any,
                  ctx: DistContext, threads: int | None, owner: bool) -> dict[str, Any]:
    with (StopSignals() if ctx.active else _StopFlag()) as flag, kept_determinism(), (
            exclusive_lock(run_dir / ".train.lock", f"run {run_dir}") if owner else contextlib.nullcontext()):
        if owner:
            clean_stale_temps(run_dir / CHECKPOINTS_DIR, (".step_*",))
            clean_stale_temps(run_dir, (".*.tmp",))
        # the run's config hash is that of the config as handed over (``normlab config``, the run folder's name, a
        # sweep), before the data and this machine fill in vocab_size, device, precision and compile
        run_hash = cfg.hash()
        try:
            return _train(cfg, run_dir, resume=resume, quiet=quiet or not ctx.is_main, flag=flag, tb_dir=tb_dir,
                          init_from=init_from, ctx=ctx, threads=threads, run_hash=run_hash)
        except KeyboardInterrupt:  # a second Ctrl-C: stop now, keep the last checkpoint, still write the summary
            if getattr(flag, "tracker", None) is not None:
                flag.tracker.close("interrupted")  # the TensorBoard events end with the session's status
            if not ctx.is_main or not (run_dir / CONFIG_FILE).is_file():
                raise
            return _interrupted_summary(cfg, run_dir, run_hash)
        except BaseException as e:  # an error: the event file still ends, and a persistent sweep worker keeps no writer
            if getattr(flag, "tracker", None) is not None:
                flag.tracker.close("failed")
            err = nondeterministic_op_error(e)  # train.deterministic on CUDA: an op without a deterministic kernel
            if err is not None:
                raise err from e
            raise


def _interrupted_summary(cfg: RunConfig, run_dir: Path, run_hash: str) -> dict[str, Any]:
    """``summary.json`` of a run stopped at once: the last checkpoint's step and metrics (resumable from there);
    ``run_hash`` the run's config hash (a resumed run's comes from its checkpoint)."""
    ckpts = list_checkpoints(run_dir)
    state = read_json_object(ckpts[-1] / "state.json", "checkpoint state") if ckpts else {}
    last = state.get("final") or {}
    summary = {
        "status": "interrupted", "step": state.get("step", 0), "steps": cfg.train.steps,
        "train_loss": last.get("train_loss"), "val_loss": last.get("val_loss"), "val_bpb": last.get("val_bpb"),
        "best_val_bpb": state.get("best_val_bpb"), "entropy_floor_bpb": None, "gap_bpb": None,
        "tokens_seen": state.get("tokens_seen", 0), "tokens_per_s": 0.0, "elapsed_s": state.get("elapsed_s", 0.0),
        "params": None, "config_hash": state.get("run_hash", run_hash), "loss_spikes": None, "run_dir": str(run_dir),
    }
    finish_run(run_dir, cfg, None, summary)  # no model.safetensors: resumable from the last checkpoint
    return summary


def _train(cfg: RunConfig, run_dir: Path, *, resume: bool, quiet: bool, flag: Any,
           tb_dir: str | Path | None = None, init_from: str | Path | None = None,
           ctx: DistContext = SINGLE, threads: int | None = None, run_hash: str | None = None) -> dict[str, Any]:
    from normlab.run.rundir import read_data_info, run_data, save_run_identity

    # a tracker server that does not answer: one warning line (train.track_required: an error) before anything else
    track = probe_trackers(cfg.train.track, required=cfg.train.track_required) if ctx.is_main else []
    # a resumed run keeps its own tokenizer and refuses a changed corpus (normlab.run.rundir)
    data = (run_data(run_dir, cfg) if resume and read_data_info(run_dir) is not None
            else load_data(cfg, tokenizer=None if resume else source_tokenizer(init_from)))  # --init-from: its ids
    cfg.model.vocab_size = data.vocab_size
    apply_norm_defaults(cfg)
    cfg.validate()
    check_train_memory(cfg)  # before anything is allocated or written
    n_threads, why_threads = resolve_threads(cfg.train.threads, step_flops(cfg), override=threads)
    if n_threads:  # before the precision probe, which measures at this thread count
        torch.set_num_threads(n_threads)
    why_threads = f"{why_threads}; {wait_policy_note()}"  # train.threads stays as set: a resume decides anew
    runtime = resolve_runtime(cfg)  # device / precision / compile: auto -> what this machine uses (config.yaml)
    runtime.append(f"threads {torch.get_num_threads()} ({why_threads})")
    runtime.append(heap_policy_note())
    tc, mc, oc, dev = cfg.train, cfg.model, cfg.optim, cfg.device

    torch.manual_seed(cfg.seed)
    model = build_model(mc)
    init_src = resolve_init(run_dir, init_from, resume)  # --init-from: another run's weights, names and shapes checked
    init_weights = load_init(model, init_src) if init_src is not None else None
    model = prepare_model(model.to(dev), tc.precision)  # bf16: norm inputs cast to fp32
    ddp = ctx.wrap(model)  # DDP (summed gradients) on more than one process, else the model
    fwd = torch.compile(ddp) if tc.compile else ddp  # diagnostic steps run `ddp` (eager, with hooks)
    timer = CompileTimer(tc.compile)
    opt, groups = build_optimizer(model, tc, oc)
    clipper = build_clipper(model, tc)  # train.clip: global clip_grad_norm_ or AdaGC (per-tensor EMA thresholds)
    rows, share = ctx.rows(tc.batch_size), ctx.weight(tc.batch_size)
    nap = NormalizeAndProject(model) if oc.nap else None  # init norms of the seeded init, before any resume load
    eff_lr = EffectiveLR({n: p for n, p in model.named_parameters() if n in groups["feeds_norm"]})
    diag = TrainDiagnostics(model, cfg.diag)  # diag: per-block stats every diag.every steps + loss spikes
    gen = torch.Generator().manual_seed(cfg.seed)
    start, tokens_seen, elapsed, best, final = 0, 0, 0.0, None, {}
    metrics_path = run_dir / METRICS_FILE

    if resume:
        ckpts = list_checkpoints(run_dir)
        if ckpts:
            state = load_checkpoint(ckpts[-1], model, opt)
            if state.get("config_hash") != cfg.hash():
                raise NormlabError(f"{ckpts[-1]} was written with another config; cannot resume from it")
            run_hash = state.get("run_hash", run_hash)  # config.yaml holds resolved values: the hash as declared
            start, tokens_seen = state["step"], state["tokens_seen"]
            elapsed, best = state["elapsed_s"], state.get("best_val_bpb")
            if nap is not None:
                nap.check(state.get("nap_init_norms"), str(ckpts[-1]))
            diag.load_state_dict(state.get("diag"))  # diag: the loss-spike window
            clipper.load_state_dict(state.get("clip"))  # AdaGC's thresholds
            torch.set_rng_state(_rng_from_json(state["rng"]["torch"]))
            if "cuda" in state["rng"]:
                torch.cuda.set_rng_state(_rng_from_json(state["rng"]["cuda"]))
            gen.set_state(_rng_from_json(state["rng"]["data"]))
            final = state.get("final") or {}  # the metrics as of that checkpoint (closes the kill -9 window)
        if ctx.is_main:
            _truncate_metrics(metrics_path, start)
        init = read_initial(metrics_path)
    elif ctx.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        write_config(run_dir, cfg)  # config.yaml (normlab.run.publish)
        write_json(run_dir / PARAM_GROUPS_FILE, groups)
        save_run_identity(run_dir, cfg, data)  # tokenizer.json, data.json, provenance.json
        write_fingerprint(run_dir, cfg, model)  # fingerprint.json: config + parameter layout + versions
        init = initial_eval(model, data, cfg)  # loss at initialisation (LR sensitivity); consumes no RNG
        write_text(metrics_path, json.dumps({"step": 0, **init}) + "\n")
        if init_src is not None:
            write_init_record(run_dir, init_src, init_weights)
    else:
        init = {}  # (other ranks: rank 0 alone evaluates and records the loss at initialisation)

    report = ProgressReporter(tc.steps, start, quiet=quiet)
    tracker = flag.tracker = (Tracker(tb_dir if tb_dir is not None else run_dir / "tb", cfg.to_dict(),
                                      start_step=start, track=track, probed=True)
                              if ctx.is_main else NullTracker())  # rank 0 alone tracks (train.track)
    nap_note = f" + NaP on {len(nap.params)} weights" if nap else ""
    report.message(
        f"params {model.num_params():,} | weight decay on {len(groups['decay'])} tensors, "
        f"none on {len(groups['no_decay'])} (norm gains, biases, embeddings) | {oc.name}{nap_note} | run {run_dir}"
    )
    report.message(" | ".join(runtime))
    choices = non_default(cfg)  # every key set away from its default (config vs RunConfig()), runtime keys aside
    report.message("not default: " + (", ".join(f"{k}={v}" for k, v in choices) if choices else "none"))
    ceiling = loss_ceiling(cfg)
    status, last_loss, val = "completed", float("nan"), {}
    if final:
        last_loss = final["train_loss"] if final.get("train_loss") is not None else float("nan")
        val = {"loss": final["val_loss"], "bpb": final["val_bpb"]} if final.get("val_bpb") is not None else {}
    step = start
    mark_t, mark_tokens = time.time(), tokens_seen
    t_start = time.time()

    def checkpoint(at: int) -> None:
        if not ctx.is_main:
            return
        state = {"tokens_seen": tokens_seen, "elapsed_s": elapsed + time.time() - t_start, "best_val_bpb": best,
                 "run_hash": run_hash,
                 "rng": {"torch": _rng_to_json(torch.get_rng_state()), "data": _rng_to_json(gen.get_state())}}
        if dev == "cuda":
            state["rng"]["cuda"] = _rng_to_json(torch.cuda.get_rng_state())
        state["diag"] = diag.state_dict()  # diag
        state["clip"] = clipper.state_dict()
        state["final"] = {"train_loss": last_loss, "val_loss": val.get("loss"), "val_bpb": val.get("bpb")}
        if nap is not None:
            state["nap_init_norms"] = nap.to_json()
        save_checkpoint(run_dir, at, model, opt, state, cfg.hash(), tc.keep_checkpoints)

    model.train()
    with (metrics_path.open("a") if ctx.is_main else open(os.devnull, "w")) as mlog:
        while step < tc.steps:
            if ctx.any(flag.stop):  # one all-reduce per step on more than one process: all ranks stop together
                status = "interrupted"
                checkpoint(step)
                break
            lr = lr_at(step, lr=tc.lr, warmup=tc.warmup_steps, total=tc.steps, min_ratio=tc.min_lr_ratio)
            for g in opt.param_groups:
                g["lr"] = lr
            diag.start_step(step)  # diag: forward hooks on diagnostic steps only
            loss_sum, extra, t_step = 0.0, {}, time.perf_counter()
            step_fwd = ddp if diag.is_diag_step(step) else fwd
            for micro in range(tc.grad_accum):
                x, y = (t.to(dev) for t in get_batch(data.train, tc.batch_size, mc.context, gen, rows))
                with ctx.no_sync(ddp, micro == tc.grad_accum - 1):
                    with autocast(dev, tc.precision):
                        logits = step_fwd(x)
                    loss, parts = lm_loss(logits.float(), y, z_loss=tc.z_loss, logitnorm_tau=tc.logitnorm_tau)
                    diag.observe_output(logits, y)  # diag: Softmax Collapse counts (diagnostic steps only)
                    (loss * share / tc.grad_accum).backward()  # share: this rank's part of the global batch
                loss_sum += float(parts.pop("ce")) * share  # raw cross-entropy: what is logged and checked
                for k, v in parts.items():
                    extra[k] = extra.get(k, 0.0) + float(v) * share / tc.grad_accum
            if ctx.active:  # global-batch means, identical on every rank
                sums = ctx.all_sum([loss_sum, *extra.values()])
                loss_sum, extra = sums[0], dict(zip(extra, sums[1:]))
            last_loss = loss_sum / tc.grad_accum
            diag.after_backward(step, last_loss)  # diag: grad norms (before clipping), spike check; hooks removed
            grad_norm = clipper.clip(step)  # the global norm before clipping
            if not math.isfinite(last_loss) or last_loss > ceiling or not math.isfinite(grad_norm):
                status = "diverged"
                step += 1
                report.message(
                    f"diverged at step {step}: loss {last_loss:.4g} (ceiling {ceiling:.3g}), grad norm {grad_norm:.4g}"
                )
                break
            track = oc.effective_lr_every > 0 and (step + 1) % oc.effective_lr_every == 0
            if track:
                eff_lr.before()
            opt.step()
            if nap is not None:
                nap.project()
            opt.zero_grad(set_to_none=True)
            timer.add(time.perf_counter() - t_step)
            step += 1
            tokens_seen += tc.batch_size * mc.context * tc.grad_accum

            eff = eff_lr.after() if track else {}  # {} too when no weight feeds a norm
            record: dict[str, Any] = {"step": step, **eff} if eff else {}
            record |= diag.collect()  # diag: {} or {"step": step, "diag/...": ...}
            if step % tc.log_every == 0 or step == tc.steps:
                now = time.time()
                tok_s = (tokens_seen - mark_tokens) / max(now - mark_t, 1e-9)
                record |= {"step": step, "loss": last_loss, "lr": lr, "grad_norm": grad_norm,
                           "tokens_per_s": tok_s, "elapsed_s": elapsed + now - t_start, **extra, **clipper.metrics()}
                report.update(step, last_loss, tok_s)
            if ctx.is_main and (step % tc.eval_every == 0 or step == tc.steps):
                t_eval = time.time()
                val = evaluate(model, data.val, data.token_bytes, data.tokenizer.decode_bytes, context=mc.context,
                               batch_size=tc.batch_size, max_tokens=tc.eval_batches * tc.batch_size * mc.context,
                               spread=tc.eval_sample == "spread")
                best = val["bpb"] if best is None else min(best, val["bpb"])
                record.update({"step": step, "val_loss": val["loss"], "val_bpb": val["bpb"]})
                if "loss" not in record:
                    record.update({"loss": last_loss, "lr": lr, "grad_norm": grad_norm})
                report.message(f"step {step}: val loss {val['loss']:.4f}, val bits/byte {val['bpb']:.4f}")
                mark_t += time.time() - t_eval  # keep evaluation time out of tokens/s
            if record:
                mlog.write(dumps(record) + "\n")
                mlog.flush()
                tracker.log(record)
                if "tokens_per_s" in record:
                    mark_t, mark_tokens = time.time(), tokens_seen
            if step % tc.checkpoint_every == 0 or step == tc.steps:
                checkpoint(step)
    report.close()
    tracker.close(status)

    total_elapsed = elapsed + time.time() - t_start
    summary = {
        "status": status, "step": step, "steps": tc.steps, "train_loss": last_loss,
        "val_loss": val.get("loss"), "val_bpb": val.get("bpb"), "best_val_bpb": best,
        "entropy_floor_bpb": data.entropy_floor_bpb, "unigram_bpb": data.unigram_bpb,
        "gap_bpb": (val["bpb"] - data.entropy_floor_bpb)
        if (val and data.entropy_floor_bpb is not None) else None,
        "tokens_seen": tokens_seen, "tokens_per_s": tokens_seen / max(total_elapsed, 1e-9),
        "elapsed_s": total_elapsed, "params": model.num_params(), "config_hash": run_hash or cfg.hash(),
        "loss_spikes": diag.summary(), **clipper.summary(), "run_dir": str(run_dir), **init,
        "weight_norms": {k.split("/", 1)[1]: v for k, v in weight_norm_record(model).items()},  # TEV, head norms
        "device": dev, "precision": tc.precision, "compile": tc.compile, "compile_s": timer.compile_s,
        "threads": torch.get_num_threads(), "threads_reason": why_threads,
        **flops_summary(mc, tokens_seen, total_elapsed),  # analytic FLOPs per token, measured wall s per token
    }
    if init_src is not None:
        summary["init_from"] = str(init_src)
    recent = list(diag.spikes.history) or [last_loss]
    gap = eval_mode_gap(mc.norm, sum(recent) / len(recent), val.get("loss"), val.get("bpb"))
    if gap:
        summary["eval_mode_warning"] = gap
        report.message(f"warning: {gap['message']}")
    unigram = unigram_bpb(data.val, data.vocab_size, data.split_bytes["val"])
    flat = near_chance_warning(mc.norm, tc.lr, val.get("bpb"), init.get("init_val_bpb"), unigram)
    if flat and status == "completed":
        summary["near_chance_warning"] = flat
        report.message(f"warning: {flat['message']}")
    if ctx.is_main:  # model.safetensors (a completed run's), then summary.json last (normlab.run.publish)
        finish_run(run_dir, cfg, model if status == "completed" else None, summary)
    ctx.barrier()  # the other ranks exit only after rank 0 recorded the status
    return summary
