"""One run's training state and the steps that change it, shared by a run alone (``normlab.train.loop``) and each
member of a stacked group (``normlab.train.stacked``): the model with its optimizer, clipper, NaP, effective-LR
tracker, diagnostics and data generator; the progress a checkpoint saves and restores (step, tokens, best
validation bits/byte, the last losses); the metrics records; and the run's ``summary.json``.

What differs between the two callers stays with them: how the forward and backward passes run (one module, DDP, or
one vmapped call for a group), where the global torch RNG state lives (the process's, or the member's own copy),
progress lines and trackers. The order of operations here is the loop's, so every run consumes its random
numbers in the same order as before and a resumed run continues bit for bit.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from normlab.config import RunConfig
from normlab.diagnostics.training import TrainDiagnostics
from normlab.diagnostics.weightnorms import weight_norm_record
from normlab.names import SAMPLED_VAL_BPB
from normlab.errors import NormlabError
from normlab.eval.lm import evaluate
from normlab.io import clean_stale_temps, dumps, write_json, write_text
from normlab.locks import exclusive_lock
from normlab.model.flops import flops_summary
from normlab.rundir.files import CHECKPOINTS_DIR, DATA_FILE, METRICS_FILE, PARAM_GROUPS_FILE
from normlab.rundir.fingerprint import write_fingerprint
from normlab.rundir.publish import finish_run, write_config
from normlab.rundir.readers import declared_hash, read_initial, read_jsonl, read_run_file, save_run_identity
from normlab.rundir.tensors import list_checkpoints, load_checkpoint
from normlab.train.checkpointer import CheckpointWriter
from normlab.train.clipping import build_clipper
from normlab.train.init_eval import eval_mode_gap, initial_eval, near_chance_warning
from normlab.train.optim import EffectiveLR, NormalizeAndProject, build_optimizer
from normlab.train.schedule import lr_at


def loss_ceiling(cfg: RunConfig) -> float:
    """Loss above which a run counts as diverged: ``train.loss_ceiling`` or ``3 ln(vocab)`` (3x uniform)."""
    return cfg.train.loss_ceiling if cfg.train.loss_ceiling is not None else 3.0 * math.log(cfg.model.vocab_size)


def rng_to_json(state: torch.Tensor) -> list[int]:
    """An RNG state (``torch.get_rng_state()``, ``uint8 [n]``) as the list of ints a checkpoint's JSON holds."""
    return state.tolist()


def rng_from_json(values: list[int]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.uint8)


@contextlib.contextmanager
def claim_run_dir(run_dir: Path) -> Iterator[None]:
    """Hold ``RUN_DIR/.train.lock`` (one trainer per run directory) and first remove the temporary files a kill -9
    left (``checkpoints/.step_*``, ``.*.tmp``): what a resume does before it reads anything."""
    with exclusive_lock(run_dir / ".train.lock", f"run {run_dir}"):
        clean_stale_temps(run_dir / CHECKPOINTS_DIR, (".step_*",))
        clean_stale_temps(run_dir, (".*.tmp",))
        yield


def recorded_threads(run_dir: Path) -> tuple[bool, int | None]:
    """``(has a checkpoint, the torch thread count its newest checkpoint was written under)``; the count is None
    for a checkpoint from before it was recorded. Read before the model is built: the thread count is set first."""
    ckpts = list_checkpoints(run_dir)
    if not ckpts or not (ckpts[-1] / "state.json").is_file():
        return False, None
    n = read_run_file(ckpts[-1] / "state.json", "checkpoint state", "object").get("threads")
    return True, (n if isinstance(n, int) and not isinstance(n, bool) and n >= 1 else None)


def truncate_metrics(path: Path, step: int) -> None:
    """Keep only records with ``step <= step`` (after a resume from that checkpoint)."""
    if not path.exists():
        return
    keep = [rec for rec in read_jsonl(path) if rec.get("step", 0) <= step]  # cut / junk / non-UTF-8 lines dropped
    write_text(path, "".join(dumps(rec) + "\n" for rec in keep))


@dataclass
class PendingStep:
    """A step taken on the device whose host part (spike and divergence checks) waits for the next read point:
    its index (0-based), the tokens seen before it, its summed cross-entropy (0-dim float64 tensor), its gradient
    norm before clipping (0-dim tensor) and the clipper's counts before it (``mark()``: AdaGC's, else None)."""

    step: int
    tokens_seen: int
    loss_sum: torch.Tensor
    grad_norm: torch.Tensor | float
    clip_mark: Any = None


@dataclass
class RunState:
    """Everything one run keeps between steps. ``model`` is the run's own module (not its DDP wrapper); ``gen`` draws
    its batches; ``elapsed`` is the training time of earlier sessions (a resumed run's); ``val`` the last
    validation (``{"loss", "bpb"}`` or empty); ``init`` the loss at initialisation (``metrics.jsonl``'s step 0)."""

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
    run_hash: str = ""  # the config's hash as handed over, before the data and the machine fill in auto values
    init: dict[str, Any] = field(default_factory=dict)
    step: int = 0
    tokens_seen: int = 0
    elapsed: float = 0.0
    best: float | None = None
    status: str = "completed"
    last_loss: float = float("nan")
    val: dict[str, Any] = field(default_factory=dict)
    pending: list[PendingStep] = field(default_factory=list)  # steps taken whose host part waits (settle)
    # a resumed run: None when it resumed under the thread count its checkpoint recorded (or was never resumed from
    # a checkpoint), else why its numbers are not those of an uninterrupted run (kept by every later checkpoint)
    inexact: str | None = None
    resumed: bool = False
    writer: CheckpointWriter = field(default_factory=CheckpointWriter)  # at most one checkpoint write in flight

    @classmethod
    def build(cls, cfg: RunConfig, run_dir: Path, data: Any, model: torch.nn.Module, run_hash: str,
              **extra: Any) -> Any:
        """The optimizer (weight-decay groups), clipper, NaP (the init norms of ``model`` as it is now, before any
        resume load), effective-LR tracker, diagnostics and the data generator seeded with ``cfg.seed``."""
        tc, oc = cfg.train, cfg.optim
        opt, groups = build_optimizer(model, tc, oc)
        clipper = build_clipper(model, tc)  # train.clip: global clip_grad_norm_ or AdaGC (per-tensor EMA thresholds)
        nap = NormalizeAndProject(model) if oc.nap else None
        eff_lr = EffectiveLR({n: p for n, p in model.named_parameters() if n in groups["feeds_norm"]})
        diag = TrainDiagnostics(model, cfg.diag)  # diag: per-block stats every diag.every steps + loss spikes
        gen = torch.Generator().manual_seed(cfg.seed)
        return cls(cfg, run_dir, data, model, opt, groups, clipper, nap, eff_lr, diag, gen, run_hash, **extra)

    @property
    def metrics_path(self) -> Path:
        return self.run_dir / METRICS_FILE

    # -- the run directory: start, resume ---------------------------------------------------------------------------
    def start_run_dir(self) -> None:
        """A new run: config.yaml, fingerprint.json (with the declared config hash), param_groups.json, the data's
        identity, and the loss at initialisation as ``metrics.jsonl``'s first line (consumes no RNG). The loss at
        initialisation is measured before anything is written, so the window in which a kill -9 leaves a run
        without its step-0 line is a few small writes, and a resume closes it (``resume``)."""
        cfg, run_dir = self.cfg, self.run_dir
        self.init = initial_eval(self.model, self.data, cfg)  # loss at initialisation (LR sensitivity)
        run_dir.mkdir(parents=True, exist_ok=True)
        write_config(run_dir, cfg)  # config.yaml (normlab.rundir.publish)
        write_fingerprint(run_dir, cfg, self.model, config_hash=self.run_hash)  # config + layout + versions
        write_json(run_dir / PARAM_GROUPS_FILE, self.groups)
        save_run_identity(run_dir, cfg, self.data)  # tokenizer.json, data.json, provenance.json
        write_text(self.metrics_path, json.dumps({"step": 0, **self.init}) + "\n")

    def resume(self, *, truncate: bool = True) -> dict[str, torch.Tensor] | None:
        """Restore the last checkpoint (if any) and drop the metrics records after it (``truncate``: the process
        that writes the run). Returns the global RNG states it saved (``torch``, and ``cuda`` on CUDA) for the caller
        to install, or None without a checkpoint. A run killed before its first checkpoint starts again from its
        seeded initialisation under the config hash it was started with (fingerprint.json), and gets back the
        step-0 line (the loss at initialisation) when the kill came before it was written."""
        ckpts = list_checkpoints(self.run_dir)
        rng = self._restore(ckpts[-1]) if ckpts else None
        if rng is None:
            self.run_hash = declared_hash(self.run_dir) or self.run_hash
        if truncate:
            truncate_metrics(self.metrics_path, self.step)
        self.init = read_initial(self.metrics_path)
        if not self.init and rng is None and truncate:  # killed between config.yaml and the step-0 line
            if not (self.run_dir / DATA_FILE).is_file():  # and before the data's identity was written
                save_run_identity(self.run_dir, self.cfg, self.data)
            self.init = initial_eval(self.model, self.data, self.cfg)
            write_text(self.metrics_path, json.dumps({"step": 0, **self.init}) + "\n")
        return rng

    def _restore(self, ckpt: Path) -> dict[str, torch.Tensor]:
        state = load_checkpoint(ckpt, self.model, self.opt)
        if state.get("config_hash") != self.cfg.hash():
            raise NormlabError(f"{ckpt} was written with another config; cannot resume from it")
        self.run_hash = state.get("run_hash", self.run_hash)  # config.yaml holds resolved values: the hash declared
        self.step, self.tokens_seen = state["step"], state["tokens_seen"]
        self.elapsed, self.best = state["elapsed_s"], state.get("best_val_bpb")
        if self.nap is not None:
            self.nap.check(state.get("nap_init_norms"), str(ckpt))
        self.diag.load_state_dict(state.get("diag"))  # diag: the loss-spike window
        self.clipper.load_state_dict(state.get("clip"))  # AdaGC's thresholds
        self.gen.set_state(rng_from_json(state["rng"]["data"]))
        self.resumed = True
        self.inexact = state.get("inexact") if isinstance(state.get("inexact"), str) else None
        final = state.get("final") or {}  # the metrics as of that checkpoint (closes the kill -9 window)
        if final:
            self.last_loss = final["train_loss"] if final.get("train_loss") is not None else float("nan")
            self.val = {"loss": final["val_loss"], "bpb": final["val_bpb"]} if final.get("val_bpb") is not None else {}
        return {k: rng_from_json(v) for k, v in state["rng"].items() if k in ("torch", "cuda")}

    # -- one step ---------------------------------------------------------------------------------------------------
    def read_point(self, i: int) -> bool:
        """Whether step ``i`` (0-based) reads its loss and gradient norm on the host when reads are deferred
        (normlab.train.loop.defer_reads): a logged, evaluation, checkpoint, diagnostic or effective-LR step, or the
        last one."""
        tc, every = self.cfg.train, self.cfg.optim.effective_lr_every
        n = i + 1
        return (n == tc.steps or any(n % k == 0 for k in (tc.log_every, tc.eval_every, tc.checkpoint_every))
                or self.diag.is_diag_step(i) or (every > 0 and n % every == 0))

    def due(self, every: int) -> bool:
        """Whether the step just taken is a multiple of ``every`` or the last one."""
        return self.step % every == 0 or self.step == self.cfg.train.steps

    def set_lr(self) -> float:
        """The schedule's learning rate for the coming step, set on every parameter group."""
        tc = self.cfg.train
        lr = lr_at(self.step, lr=tc.lr, warmup=tc.warmup_steps, total=tc.steps, min_ratio=tc.min_lr_ratio)
        for g in self.opt.param_groups:
            g["lr"] = lr
        return lr

    def after_backward(self, loss_sum: float | torch.Tensor) -> float:
        """The step's mean loss over its ``grad_accum`` micro-batches is ``loss_sum / grad_accum`` (``loss_sum`` a
        float or a 0-dim float64 tensor, read here); the diagnostics see it (spike check, gradient norms before
        clipping); returns the global gradient norm before clipping, read on the host."""
        self.last_loss = float(loss_sum) / self.cfg.train.grad_accum
        self.diag.after_backward(self.step, self.last_loss)  # diag: grad norms, spike check; hooks removed
        return float(self.clipper.clip_on_device(self.step))

    def step_unread(self, loss_sum: torch.Tensor) -> None:
        """The rest of a step whose loss and gradient norm stay on the device until the next read point (not a
        :meth:`read_point`): clipping, the update and the count, no host read. The step waits in ``pending`` for
        :meth:`settle` to take its host part."""
        self.hold(loss_sum)
        self.optimizer_step()  # never an effective-LR step: those are read points
        self.advance(False)

    def hold(self, loss_sum: torch.Tensor) -> None:
        """:meth:`step_unread` before its update: clipping, and the step queued in ``pending`` (a stacked group
        updates its members together between the two, then :meth:`advance` each)."""
        mark = self.clipper.mark()
        self.pending.append(PendingStep(self.step, self.tokens_seen, loss_sum, self.clipper.clip_on_device(self.step),
                                        mark))

    def settle(self) -> tuple[list[dict[str, Any]], str | None]:
        """The host part of the ``pending`` steps, in order, as :meth:`after_backward` and :meth:`diverged` take it
        for a step read at once: the spike check (its records returned, to be written in step order) and the
        divergence check. A diverged step ends there as it would have when read at once (``step``, ``tokens_seen``,
        ``last_loss`` and the clipper's counts are its own; the steps after it are dropped); returns the records and
        the line that says so, else None."""
        records: list[dict[str, Any]] = []
        step, tokens, pending = self.step, self.tokens_seen, self.pending
        for j, p in enumerate(pending):
            self.step, self.tokens_seen = p.step, p.tokens_seen
            self.last_loss = float(p.loss_sum) / self.cfg.train.grad_accum
            self.diag.after_backward(p.step, self.last_loss)  # no hooks on a pending step: the spike check alone
            rec = self.diag.collect()
            diverged = self.diverged(float(p.grad_norm))
            if diverged:
                self.clipper.restore(pending[j + 1].clip_mark if j + 1 < len(pending) else None)
                self.pending = []
                return records, diverged
            if rec:
                records.append(rec)
        self.step, self.tokens_seen = step, tokens
        self.pending = []
        return records, None

    def diverged(self, grad_norm: float) -> str | None:
        """A non-finite loss or gradient norm, or a loss above the ceiling: the run ends ``diverged`` at this step
        (counted as taken); returns the line that says so, else None."""
        ceiling = loss_ceiling(self.cfg)
        if math.isfinite(self.last_loss) and self.last_loss <= ceiling and math.isfinite(grad_norm):
            return None
        self.status = "diverged"
        self.step += 1
        return (f"diverged at step {self.step}: loss {self.last_loss:.4g} (ceiling {ceiling:.3g}), "
                f"grad norm {grad_norm:.4g}")

    def optimizer_step(self) -> bool:
        """The update (then NaP's projection and the model's own step, ``GPT.after_optimizer_step``) and the
        gradients cleared; returns whether this step's effective learning rate is recorded
        (``optim.effective_lr_every``)."""
        track = self.before_update()
        self.opt.step()
        self.after_update()
        return track

    def before_update(self) -> bool:
        """What comes before the update (:meth:`optimizer_step`; a stacked group updates its members together,
        normlab.train.optim.step_together): the weights before it, when this step's effective learning rate is
        recorded; returns whether it is."""
        every = self.cfg.optim.effective_lr_every
        track = every > 0 and (self.step + 1) % every == 0
        if track:
            self.eff_lr.before()
        return track

    def after_update(self) -> None:
        """What follows the update: NaP's projection, the model's own step, the gradients cleared."""
        if self.nap is not None:
            self.nap.project()
        self.model.after_optimizer_step()  # nGPT: weights back onto the hypersphere (a no-op for other models)
        self.opt.zero_grad(set_to_none=True)

    def advance(self, tracked: bool) -> dict[str, Any]:
        """Count the step and its tokens; returns the step's metrics record so far: the effective learning rates
        (``tracked``) and the diagnostics, or ``{}``."""
        tc, mc = self.cfg.train, self.cfg.model
        self.step += 1
        self.tokens_seen += tc.batch_size * mc.context * tc.grad_accum
        eff = self.eff_lr.after() if tracked else {}  # {} too when no weight feeds a norm
        record: dict[str, Any] = {"step": self.step, **eff} if eff else {}
        record |= self.diag.collect()  # diag: {} or {"step": step, "diag/...": ...}
        return record

    def log_fields(self, record: dict[str, Any], lr: float, grad_norm: float, extra: dict[str, Any],
                   tokens_per_s: float, elapsed_s: float) -> None:
        """The logged step's loss, learning rate, gradient norm, speed and loss terms, into ``record``."""
        extra = {k: float(v) for k, v in extra.items()}  # 0-dim tensors from the loop, read here
        record |= {"step": self.step, "loss": self.last_loss, "lr": lr, "grad_norm": grad_norm,
                   "tokens_per_s": tokens_per_s, "elapsed_s": elapsed_s, **extra, **self.clipper.metrics()}

    def evaluate(self, record: dict[str, Any], lr: float, grad_norm: float) -> str:
        """Validation loss and bits/byte now, into ``record`` (with the step's loss if it is not logged anyway);
        returns the line that reports them."""
        tc, mc, data = self.cfg.train, self.cfg.model, self.data
        self.val = evaluate(self.model, data.val, data.token_bytes, data.tokenizer.decode_bytes, context=mc.context,
                            batch_size=tc.batch_size, max_tokens=tc.eval_batches * tc.batch_size * mc.context,
                            spread=tc.eval_sample == "spread", precision=tc.precision)  # bf16 on CUDA as trained
        self.best = self.val["bpb"] if self.best is None else min(self.best, self.val["bpb"])
        record.update({"step": self.step, "val_loss": self.val["loss"], "val_bpb": self.val["bpb"]})
        if "loss" not in record:
            record.update({"loss": self.last_loss, "lr": lr, "grad_norm": grad_norm})
        return f"step {self.step}: val loss {self.val['loss']:.4f}, {SAMPLED_VAL_BPB} {self.val['bpb']:.4f}"

    # -- checkpoint and summary -------------------------------------------------------------------------------------
    def checkpoint(self, at: int, elapsed_s: float, rng: torch.Tensor, cuda_rng: torch.Tensor | None) -> None:
        """``checkpoints/step_<at>``: weights, optimizer state, and in ``state.json`` the progress, the global RNG
        states ``rng`` / ``cuda_rng`` and the data generator's, the diagnostics' and clipper's state, the last
        metrics and NaP's init norms."""
        state: dict[str, Any] = {"tokens_seen": self.tokens_seen, "elapsed_s": elapsed_s, "best_val_bpb": self.best,
                                 "run_hash": self.run_hash, "threads": torch.get_num_threads(),
                                 "rng": {"torch": rng_to_json(rng), "data": rng_to_json(self.gen.get_state())}}
        if cuda_rng is not None:
            state["rng"]["cuda"] = rng_to_json(cuda_rng)
        state["diag"] = self.diag.state_dict()  # diag
        state["clip"] = self.clipper.state_dict()
        val = self.val
        state["final"] = {"train_loss": self.last_loss, "val_loss": val.get("loss"), "val_bpb": val.get("bpb")}
        if self.nap is not None:
            state["nap_init_norms"] = self.nap.to_json()
        if self.inexact:
            state["inexact"] = self.inexact
        # written in the background (normlab.train.checkpointer): the next checkpoint and finish() wait for it
        self.writer.save(self.run_dir, at, self.model, self.opt, state, self.cfg.hash(),
                         self.cfg.train.keep_checkpoints)

    def summary(self, elapsed_s: float, threads_reason: str, compile_s: float | None,
                init_from: Path | None = None) -> dict[str, Any]:
        """``summary.json``'s content after ``elapsed_s`` seconds of training in all (``tokens_per_s`` over them),
        with the eval-mode and near-chance warnings when they apply."""
        cfg, data, tc, mc, val = self.cfg, self.data, self.cfg.train, self.cfg.model, self.val
        summary = {
            "status": self.status, "step": self.step, "steps": tc.steps, "train_loss": self.last_loss,
            "val_loss": val.get("loss"), "val_bpb": val.get("bpb"), "best_val_bpb": self.best,
            "val_sample_tokens": val.get("tokens"),  # val_bpb's sample of the validation split (normlab.names)
            "entropy_floor_bpb": data.entropy_floor_bpb, "unigram_bpb": data.unigram_bpb,
            "gap_bpb": (val["bpb"] - data.entropy_floor_bpb) if (val and data.entropy_floor_bpb is not None) else None,
            "tokens_seen": self.tokens_seen, "tokens_per_s": self.tokens_seen / max(elapsed_s, 1e-9),
            "elapsed_s": elapsed_s, "params": self.model.num_params(), "config_hash": self.run_hash or cfg.hash(),
            "loss_spikes": self.diag.summary(), **self.clipper.summary(), "run_dir": str(self.run_dir), **self.init,
            "weight_norms": {k.split("/", 1)[1]: v for k, v in weight_norm_record(self.model).items()},  # TEV, head
            "device": cfg.device, "precision": tc.precision, "compile": tc.compile, "compile_s": compile_s,
            "deterministic": tc.deterministic is True or cfg.device != "cuda",  # CPU kernels: always; CUDA: resolved
            "threads": torch.get_num_threads(), "threads_reason": threads_reason,
            **flops_summary(mc, self.tokens_seen, elapsed_s),  # analytic FLOPs per token, measured wall s per token
        }
        if init_from is not None:
            summary["init_from"] = str(init_from)
        if self.resumed:  # resumed from a checkpoint: exact only under the thread count it recorded
            summary["resume_exact"] = self.inexact is None
            if self.inexact:
                summary["resume_note"] = self.inexact
        recent = list(self.diag.spikes.history) or [self.last_loss]
        gap = eval_mode_gap(mc.norm, sum(recent) / len(recent), val.get("loss"), val.get("bpb"))
        if gap:
            summary["eval_mode_warning"] = gap
        flat = near_chance_warning(mc.norm, tc.lr, val.get("bpb"), self.init.get("init_val_bpb"), data.unigram_bpb)
        if flat and self.status == "completed":
            summary["near_chance_warning"] = flat
        return summary

    def finish(self, summary: dict[str, Any]) -> None:
        """model.safetensors (a completed run's), then summary.json last (normlab.rundir.publish), after the last
        checkpoint's write (its error, if it failed, raised here: the run then ends as a failed one)."""
        self.writer.wait()
        finish_run(self.run_dir, self.cfg, self.model if self.status == "completed" else None, summary)
