"""The training loop: data -> model -> optimizer (AdamW / AdamP / SGDP, optional NaP) -> checkpoints, metrics and a
summary in a run directory.

It reads as a recipe (the shape of torchtune's single-device recipe): :meth:`Recipe.setup` builds everything a run
needs, in a fixed order (trackers, data, runtime, model and optimizer, run directory, progress display);
:meth:`Recipe.train` is the loop, one named step after another (learning rate, forward and backward, clipping and
the divergence check, update, log, evaluate, write, checkpoint), then the summary. What a run alone and a member of
a stacked group share -- its state, checkpoint, evaluation and summary -- is ``normlab.train.runstate.RunState``.

Determinism: ``cfg.seed`` seeds model init (global torch RNG before ``build_model``), data order (a dedicated
``torch.Generator`` seeded with ``seed``) and dropout (the global RNG afterwards). A checkpoint stores both RNG
states, the optimizer state and the step, so ``--resume`` reproduces an uninterrupted run bit for bit.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch

from normlab.config import RunConfig, non_default
from normlab.interrupt import StopFlag
from normlab.io import dumps
from normlab.model import build_model
from normlab.rundir.files import CONFIG_FILE
from normlab.rundir.publish import finish_interrupted
from normlab.rundir.readers import load_data, run_data
from normlab.train.distributed import SINGLE, DistContext
from normlab.train.heap import heap_policy_note
from normlab.train.init_from import load_init, resolve_init, source_tokenizer
from normlab.train.init_from import write_record as write_init_record
from normlab.train.precision import (CompileTimer, kept_determinism, nondeterministic_op_error,
                                    prepare_model)
from normlab.train.progress import ProgressReporter
from normlab.train.runstate import RunState, claim_run_dir, recorded_threads
from normlab.train.step import Parts, compile_failure, forward_backward, forward_loss, micro_backward
from normlab.train.resolve import resolve_run
from normlab.train.threads import record_run, usable_cores, wait_policy_note
from normlab.train.tracking import Tracker, probe_trackers

RESUME_OVERSUBSCRIBE = 4  # a resume keeps its checkpoint's thread count up to this many per usable core


def get_batch(tokens: np.ndarray, batch_size: int, context: int, gen: torch.Generator,
              rows: slice | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Random windows: ``x, y [batch_size, context]`` int64 with ``y`` shifted by one token. ``rows``: keep only
    these rows of the batch (a data-parallel rank's share; the generator advances by the whole batch)."""
    ix = torch.randint(len(tokens) - context - 1, (batch_size,), generator=gen).tolist()
    ix = ix[rows] if rows is not None else ix
    chunk = np.stack([tokens[i : i + context + 1] for i in ix]).astype(np.int64)
    t = torch.from_numpy(chunk)
    return t[:, :-1], t[:, 1:]


def to_device(t: torch.Tensor, device: str) -> torch.Tensor:
    """A CPU batch on ``device``; to CUDA from pinned memory without blocking the host (a copy from pageable
    memory waits for the device). The batch is first copied, dense, into a pinned buffer: ``get_batch``'s ``x`` and
    ``y`` are strided views of one chunk, and ``pin_memory()`` keeps a view's strides, so the device copy would
    need a pageable temporary and block."""
    if device.startswith("cuda"):
        pinned = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        return pinned.copy_(t).to(device, non_blocking=True)
    return t.to(device)


def defer_reads(cfg: RunConfig) -> bool:
    """Whether a step leaves its loss and gradient norm on the device until the next read point (a logged,
    diagnostic, evaluation, checkpoint or effective-LR step, the last step, or a stop), so that the host never
    waits for the device in between: on an accelerator, for a run alone, a stacked group (normlab.train.stacked)
    and each rank of a data-parallel run (whose loss sums are all-reduced on the device and whose ranks agree on a
    stop at read points only: every rank has the same read points, and settles the same all-reduced values). On
    the CPU every step is read at once (a read costs nothing there; a data-parallel rank agrees on a stop at every
    step). Outputs are the same either way; a run that diverges between two read points stops at the next one,
    with the diverged step's status, step, loss and message, after a few more updates of weights that are not
    saved (its summary's weight norms are of the weights when it stopped)."""
    return cfg.device != "cpu"


class NullTracker:
    """What a data-parallel rank other than 0 tracks: nothing."""

    def log(self, record: dict[str, Any]) -> None:
        pass

    def close(self, status: str) -> None:
        pass


def train(cfg: RunConfig, run_dir: str | Path, *, resume: bool = False, quiet: bool = False,
          tb_dir: str | Path | None = None, init_from: str | Path | None = None,
          dist: DistContext | None = None, threads: int | None = None, verbose: bool = False) -> dict[str, Any]:
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
    with _own_load_record():  # this run's CPU use, taken off the load average by the next run's thread decision
        return _train_locked(cfg, run_dir, resume=resume, quiet=quiet, verbose=verbose, tb_dir=tb_dir,
                             init_from=init_from, ctx=ctx,
                             threads=threads)


@contextlib.contextmanager
def _own_load_record() -> Iterator[None]:
    t0, c0 = time.monotonic(), time.process_time()
    try:
        yield
    finally:
        record_run(time.monotonic() - t0, time.process_time() - c0)


def _train_locked(cfg: RunConfig, run_dir: Path, *, resume: bool, quiet: bool, tb_dir: Any, init_from: Any,
                  ctx: DistContext, threads: int | None, verbose: bool = False) -> dict[str, Any]:
    """The recipe inside the signal handling (a rank counts repeated signals: torchrun ends a hung rank), the
    determinism settings and, on a resume, the run directory's lock; a second Ctrl-C still writes the summary."""
    owner = resume and ctx.is_main
    with StopFlag(repeat="count" if ctx.active else "raise") as flag, kept_determinism(), (
            claim_run_dir(run_dir) if owner else contextlib.nullcontext()):
        # the run's config hash is that of the config as handed over (``normlab config``, the run folder's name, a
        # sweep), before the data and this machine fill in vocab_size, device, precision and compile
        run_hash = cfg.hash()
        recipe = Recipe(cfg, run_dir, ctx=ctx, flag=flag, quiet=quiet or not ctx.is_main, run_hash=run_hash,
                        verbose=verbose)
        try:
            recipe.setup(resume=resume, tb_dir=tb_dir, init_from=init_from, threads=threads)
            return recipe.train()
        except KeyboardInterrupt:  # a second Ctrl-C: stop now, keep the last checkpoint, still write the summary
            recipe.close_tracker("interrupted")  # the TensorBoard events end with the session's status
            recipe.settle_checkpoint()  # the summary is that of the last checkpoint written whole
            if not ctx.is_main or not (run_dir / CONFIG_FILE).is_file():
                raise
            return finish_interrupted(run_dir, cfg, run_hash)
        except BaseException as e:  # an error: the event file still ends, and a persistent sweep worker keeps no writer
            recipe.close_tracker("failed")
            recipe.settle_checkpoint()  # no write goes on after the run has failed (its own error is reported)
            err = nondeterministic_op_error(e)  # train.deterministic on CUDA: an op without a deterministic kernel
            if err is not None:
                raise err from e
            raise


class Recipe:
    """One run's training: :meth:`setup` once, then :meth:`train` (which returns the summary). ``ctx``: this
    process's place in a data-parallel run; ``flag``: set by SIGINT / SIGTERM, checked before every step (by a
    data-parallel run with deferred reads, before every read point: :meth:`_stop`)."""

    def __init__(self, cfg: RunConfig, run_dir: Path, *, ctx: DistContext, flag: StopFlag, quiet: bool,
                 run_hash: str, verbose: bool = False) -> None:
        self.cfg, self.run_dir, self.ctx, self.flag = cfg, run_dir, ctx, flag
        self.quiet, self.run_hash, self.verbose = quiet, run_hash, verbose
        self.tracker: Tracker | NullTracker | None = None
        self.state: RunState | None = None

    # -- setup: the order is fixed (the seeded RNG streams and what a refused run has written depend on it) --------
    def setup(self, *, resume: bool, tb_dir: str | Path | None, init_from: str | Path | None,
              threads: int | None) -> None:
        track = self._probe_trackers()
        data = self._setup_data(resume, init_from)
        runtime = self._setup_runtime(data, threads, resume)
        init_weights = self._setup_model(data, resume, init_from)
        self._setup_run_dir(resume, init_weights)
        if self.inexact and resume:
            self.state.inexact = self.state.inexact or self.inexact
        self._setup_progress(track, tb_dir, runtime)

    def _probe_trackers(self) -> list[str]:
        """A tracker server that does not answer: one warning line (train.track_required: an error) before anything
        else; rank 0 alone tracks."""
        tc = self.cfg.train
        return probe_trackers(tc.track, required=tc.track_required) if self.ctx.is_main else []

    def _setup_data(self, resume: bool, init_from: str | Path | None) -> Any:
        """The token splits. A resumed run keeps its own tokenizer and refuses a changed corpus
        (normlab.rundir.readers); ``--init-from`` trains on its source's token ids."""
        cfg, run_dir = self.cfg, self.run_dir
        return run_data(run_dir, cfg) if resume else load_data(cfg, tokenizer=source_tokenizer(init_from))

    def _setup_runtime(self, data: Any, threads: int | None, resume: bool = False) -> list[str]:
        """The run's config resolved once (normlab.train.resolve): completed by the data (vocab_size, the norms'
        defaults) and checked, also against the memory of the device it trains on, before anything is allocated or
        written; then threads (before the precision probe, which measures at this thread count) and device /
        precision / compile: auto -> what this machine uses (config.yaml). From here on ``self.cfg`` is the frozen
        resolved config. A resumed run then takes the thread count its checkpoint recorded (another count splits
        the reductions of a step differently, so the numbers would drift from the uninterrupted run's; its
        precision, device and compile are config.yaml's, fixed at its start, so no probe runs at the other count);
        where it cannot, it says so (``self.inexact``, summary.json's ``resume_exact``). Returns the banner's
        runtime parts."""
        resolved = resolve_run(self.cfg, data, threads=threads)
        self.cfg = resolved.cfg
        why = resolved.why_threads
        self.inexact: str | None = None
        if resume and self.ctx.is_main:
            n_threads, why = self._resume_threads(torch.get_num_threads(), why)
            if n_threads:
                torch.set_num_threads(n_threads)
        self.why_threads = f"{why}; {wait_policy_note()}"
        runtime = list(resolved.runtime)
        runtime.append(f"threads {torch.get_num_threads()} ({self.why_threads})")
        runtime.append(heap_policy_note())
        self.runtime_notes = runtime  # why each runtime choice: summary.json's runtime_notes, train --verbose
        return runtime

    def _resume_threads(self, n_threads: int | None, why: str) -> tuple[int | None, str]:
        """The thread count of a resume: the checkpoint's, up to ``RESUME_OVERSUBSCRIBE`` x the usable cores (more
        threads than cores is slower, not different); else this start's, with a warning and ``self.inexact``."""
        has_ckpt, rec = recorded_threads(self.run_dir)
        now = n_threads or torch.get_num_threads()
        if not has_ckpt or rec == now:
            return n_threads, why if not has_ckpt else f"{why}; as its checkpoint recorded"
        if rec is not None and rec <= RESUME_OVERSUBSCRIBE * usable_cores():
            return rec, f"as its checkpoint recorded (this start would use {now}: {why})"
        self.inexact = (f"resumed at {now} torch threads, not the {rec} its checkpoint was written under"
                        if rec is not None else f"resumed at {now} torch threads; its checkpoint does not record "
                        "the thread count it was written under")
        print(f"warning: {self.inexact}: its numbers will differ from an uninterrupted run's (not an exact "
              "resume)", file=sys.stderr)
        return n_threads, why

    def _setup_model(self, data: Any, resume: bool, init_from: str | Path | None) -> Any:
        """The seeded model (or ``--init-from``'s weights, names and shapes checked), its DDP wrapper and compiled
        forward, and the run's state (optimizer, clipper, NaP, diagnostics, data generator). Returns the loaded
        init weights' record (None without ``--init-from``)."""
        cfg, tc, ctx = self.cfg, self.cfg.train, self.ctx
        torch.manual_seed(cfg.seed)
        model = build_model(cfg.model)
        self.init_src = resolve_init(self.run_dir, init_from, resume)
        init_weights = load_init(model, self.init_src) if self.init_src is not None else None
        model = prepare_model(model.to(cfg.device), tc.precision)  # bf16: norm inputs cast to fp32
        self.ddp = ctx.wrap(model)  # DDP (summed gradients) on more than one process, else the model
        # compiled: the forward and the loss as one graph (normlab.train.step.forward_loss); diagnostic steps run
        # `ddp` eager (hooks), and so does the run from a compile that failed (_fall_back)
        self.compiled = torch.compile(self._forward_loss) if tc.compile else None
        self.compiled_ran, self.fell_back = False, None
        self.timer = CompileTimer(tc.compile)
        self.state = RunState.build(cfg, self.run_dir, data, model, self.run_hash)
        self.rows, self.share = ctx.rows(tc.batch_size), ctx.weight(tc.batch_size)
        return init_weights

    def _setup_run_dir(self, resume: bool, init_weights: Any) -> None:
        """Resume from the last checkpoint (weights, optimizer, progress, RNG states), or start the run directory
        (rank 0 alone writes it and records the loss at initialisation)."""
        s = self.state
        if resume:
            rng = s.resume(truncate=self.ctx.is_main)
            if rng is not None:
                torch.set_rng_state(rng["torch"])
                if "cuda" in rng:
                    torch.cuda.set_rng_state(rng["cuda"])
        elif self.ctx.is_main:
            s.start_run_dir()
            if self.init_src is not None:
                write_init_record(self.run_dir, self.init_src, init_weights)

    def _setup_progress(self, track: list[str], tb_dir: str | Path | None, runtime: list[str]) -> None:
        """Progress lines, the trackers (train.track; rank 0 only) and the banner: parameters, optimizer, runtime
        and every key set away from its default."""
        cfg, s = self.cfg, self.state
        self.report = ProgressReporter(cfg.train.steps, s.step, quiet=self.quiet)
        self.tracker = (Tracker(tb_dir if tb_dir is not None else self.run_dir / "tb", cfg.to_dict(),
                                start_step=s.step, track=track, probed=True)
                        if self.ctx.is_main else NullTracker())
        nap_note = f" + NaP on {len(s.nap.params)} weights" if s.nap else ""
        n = torch.get_num_threads()
        self.report.message(  # one line; the reasons behind each choice: --verbose, summary.json's runtime_notes
            f"train {self.run_dir}: {s.model.num_params():,} params, {cfg.optim.name}{nap_note}, {cfg.device} "
            f"{cfg.train.precision}, {n} thread{'s' if n != 1 else ''}, compile {'on' if cfg.train.compile else 'off'}")
        if self.verbose:
            self.report.message(f"weight decay on {len(s.groups['decay'])} tensors, none on "
                                f"{len(s.groups['no_decay'])} (norm gains, biases, embeddings)")
            for line in runtime:
                self.report.message(line)
            choices = non_default(cfg)  # every key away from its default (config vs RunConfig()), runtime keys aside
            self.report.message("not default: " + (", ".join(f"{k}={v}" for k, v in choices) if choices else "none"))

    # -- the loop ---------------------------------------------------------------------------------------------------
    def train(self) -> dict[str, Any]:
        s, tc, ctx = self.state, self.cfg.train, self.ctx
        self.mark_t, self.mark_tokens = time.time(), s.tokens_seen  # tokens/s since the last logged step
        self.t_start = time.time()
        s.model.train()
        defer = defer_reads(self.cfg)
        with self._metrics_log() as mlog:
            while s.step < tc.steps:
                read = not defer or self._read_point(s.step)
                if self._stop(read):  # every rank of a data-parallel run at the same step
                    if self._settle(mlog):
                        break
                    s.status = "interrupted"
                    self._checkpoint()
                    break
                if read and self._settle(mlog):  # the steps still on the device (s.pending)
                    break
                lr = s.set_lr()
                s.diag.start_step(s.step)  # diag: forward hooks on diagnostic steps only
                t_step = time.perf_counter()
                loss_sum, extra = self._forward_backward()
                if not read:  # no host read: the step's checks wait for the next read point
                    s.step_unread(loss_sum)
                    self.timer.add(time.perf_counter() - t_step)
                    continue
                grad_norm = s.after_backward(loss_sum)
                diverged = s.diverged(grad_norm)
                if diverged:
                    self.report.message(diverged)
                    break
                tracked = s.optimizer_step()
                self.timer.add(time.perf_counter() - t_step)
                record = s.advance(tracked)
                if s.due(tc.log_every):
                    self._log(record, lr, grad_norm, extra)
                if ctx.is_main and s.due(tc.eval_every):
                    self._evaluate(record, lr, grad_norm)
                self._write(mlog, record)
                if s.due(tc.checkpoint_every):
                    self._checkpoint()
        self.report.close()
        self.tracker.close(s.status)
        return self._finish()

    def _read_point(self, i: int) -> bool:
        """Whether step ``i`` (0-based) reads its loss and gradient norm on the host when reads are deferred
        (``RunState.read_point``)."""
        return self.state.read_point(i)

    def _stop(self, read: bool) -> bool:
        """Whether the run stops before the coming step (SIGINT / SIGTERM). One process: the flag, at every step. A
        data-parallel run: the flag agreed over ranks (one all-reduce and host read) where the coming step is
        ``read``: at every step on the CPU, at read points only when reads are deferred (every rank has the same
        read points, so a signal on any rank stops them all at the next one, together)."""
        if not self.ctx.active:
            return self.flag.stop
        return read and self.ctx.any(self.flag.stop)

    def _settle(self, mlog: IO[str]) -> bool:
        """The host part of the deferred steps (one read of their losses and gradient norms): their spike records
        written in step order; True when one of them diverged (the run ends there, as if read at once)."""
        if not self.state.pending:
            return False
        records, diverged = self.state.settle()
        for rec in records:
            self._write(mlog, rec)
        if diverged:
            self.report.message(diverged)
        return diverged is not None

    def _metrics_log(self) -> IO[str]:
        return (self.state.metrics_path.open("a") if self.ctx.is_main else open(os.devnull, "w"))

    def _forward_backward(self) -> tuple[Any, dict[str, Any]]:
        """``grad_accum`` micro-batches of this rank's rows, forward (eager with the diagnostics' hooks on a
        diagnostic step) and backward. Returns the summed cross-entropy and the mean extra loss terms, global-batch
        values identical on every rank: 0-dim float64 tensors on the device (the same float64 sums as Python
        floats), read by the caller at a read point; on more than one process, summed over ranks on the device (one
        all-reduce of a float64 vector, no host read)."""
        s, tc, mc, dev, ctx = self.state, self.cfg.train, self.cfg.model, self.cfg.device, self.ctx
        diag = s.diag.is_diag_step(s.step)  # eager with the diagnostics' hooks

        def micro(i: int) -> list[Parts]:
            x, y = (to_device(t, dev) for t in get_batch(s.data.train, tc.batch_size, mc.context, s.gen, self.rows))
            compiled = None if diag else self.compiled
            with ctx.no_sync(self.ddp, i == tc.grad_accum - 1):  # share: this rank's part of the global batch
                try:
                    return micro_backward(lambda: self.ddp(x), [y], tc, dev, weight=self.share,
                                          observe=s.diag.observe_output,
                                          fused=(lambda: compiled(x, y)) if compiled is not None else None)
                except Exception as e:
                    if not (i == 0 and compiled is not None and self._fall_back(e)):
                        raise
                    return micro_backward(lambda: self.ddp(x), [y], tc, dev, weight=self.share,
                                          observe=s.diag.observe_output)

        [(loss_sum, extra)] = forward_backward(micro, 1, tc.grad_accum, self.share)
        if not diag and self.compiled is not None:
            self.compiled_ran = True  # a later failure is the model's own
        if ctx.active:  # global-batch means, identical on every rank
            sums = ctx.all_sum_device(torch.stack([loss_sum, *extra.values()]))
            loss_sum, extra = sums[0], dict(zip(extra, sums[1:]))
        return loss_sum, extra

    def _forward_loss(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, Parts]:
        """The region a compiled run compiles: the forward (DDP-wrapped where data-parallel) and the loss."""
        return forward_loss(self.ddp, x, y, self.cfg.train, self.cfg.device)

    def _fall_back(self, e: Exception) -> bool:
        """Whether the failure ``e`` of the compiled forward-and-backward is handled: until a compiled step has run
        once (its first micro-batch compiles the forward, and its backward compiles the backward), a failure to
        compile (``normlab.train.step.compile_failure``) switches the run to the eager module from here on; the
        caller repeats the micro-batch (the first of its step: no gradient was there before it), with the same
        tokens. The summary's ``compile_fallback_step`` is the step from which the run ran eager."""
        if self.compiled is None or self.compiled_ran or not compile_failure(e):
            return False
        self.ddp.zero_grad(set_to_none=True)
        self.compiled = None
        self.fell_back = self.state.step + 1
        self.report.message(f"the model runs eager: torch.compile of it failed ({type(e).__name__}: "
                            f"{(str(e).splitlines() or [''])[0][:160]}) (from step {self.fell_back})")
        return True

    def _log(self, record: dict[str, Any], lr: float, grad_norm: float, extra: dict[str, float]) -> None:
        s, now = self.state, time.time()
        tok_s = (s.tokens_seen - self.mark_tokens) / max(now - self.mark_t, 1e-9)
        s.log_fields(record, lr, grad_norm, extra, tok_s, s.elapsed + now - self.t_start)
        self.report.update(s.step, s.last_loss, tok_s)

    def _evaluate(self, record: dict[str, Any], lr: float, grad_norm: float) -> None:
        t_eval = time.time()
        self.report.message(self.state.evaluate(record, lr, grad_norm))
        self.mark_t += time.time() - t_eval  # keep evaluation time out of tokens/s

    def _write(self, mlog: IO[str], record: dict[str, Any]) -> None:
        """The step's record, if any, to metrics.jsonl and the trackers."""
        if record:
            mlog.write(dumps(record) + "\n")
            mlog.flush()
            self.tracker.log(record)
            if "tokens_per_s" in record:
                self.mark_t, self.mark_tokens = time.time(), self.state.tokens_seen

    def _checkpoint(self) -> None:
        if not self.ctx.is_main:
            return
        s = self.state
        s.checkpoint(s.step, s.elapsed + time.time() - self.t_start, torch.get_rng_state(),
                     torch.cuda.get_rng_state() if self.cfg.device == "cuda" else None)

    def _finish(self) -> dict[str, Any]:
        """summary.json (rank 0), after which the other ranks may exit."""
        s = self.state
        summary = s.summary(s.elapsed + time.time() - self.t_start, self.why_threads, self.timer.compile_s,
                            init_from=self.init_src)
        summary["runtime_notes"] = self.runtime_notes
        if self.fell_back is not None:
            summary["compile_fallback_step"] = self.fell_back
        for key in ("eval_mode_warning", "near_chance_warning"):
            if key in summary:
                self.report.message(f"warning: {summary[key]['message']}")
        if self.ctx.is_main:
            s.finish(summary)
        self.ctx.barrier()  # the other ranks exit only after rank 0 recorded the status
        return summary

    def settle_checkpoint(self) -> None:
        """Wait for a checkpoint write still in flight (normlab.train.checkpointer), its error dropped: the run has
        already stopped with its own."""
        if self.state is not None:
            self.state.writer.settle()

    def close_tracker(self, status: str) -> None:
        """End the trackers' sessions with ``status`` (an interrupted or failed run), if they were started."""
        if self.tracker is not None:
            self.tracker.close(status)
