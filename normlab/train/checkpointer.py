"""Checkpoints written off the step path: the training loop hands a checkpoint over and goes on training while a
background thread writes it (safetensors files, fsync'd, in a temporary directory renamed into place:
``normlab.rundir.tensors.save_checkpoint``).

What the loop pays is the copy of the run's state as it is now: on CUDA an asynchronous device-to-host copy into
pinned buffers (reused from one checkpoint to the next) that the writer waits for, ordered on the stream before any
later step changes the parameters; on the CPU a copy in memory. The progress record (``state.json``'s content) is
copied too. Bounded: at most one write is pending per run; the next checkpoint, the end of the run (its final
weights and summary) and an interrupted or failed run wait for it. A write that fails raises its error (the same
one-line ``NormlabError`` a write in the loop raised) in the training thread, at the next checkpoint or the end;
the previous checkpoint stays whole (the new one is renamed into place only when complete, and old ones are pruned
only after it). The checkpoint holds the same bytes as one written in the loop, so resuming from it is as exact.
"""

from __future__ import annotations

import copy
import threading
from pathlib import Path
from typing import Any

import torch

from normlab.rundir import tensors as tensor_files


class CheckpointWriter:
    """One run's checkpoint writes, one at a time, each in a background thread (:meth:`save`, :meth:`wait`)."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._pinned: dict[tuple[str, str], torch.Tensor] = {}  # CUDA: host buffers, reused while shapes match

    def save(self, run_dir: Path, step: int, model: torch.nn.Module, opt: torch.optim.Optimizer,
             state: dict[str, Any], config_hash: str, keep: int) -> None:
        """Checkpoint ``model``, ``opt`` and ``state`` as of now to ``run_dir``'s ``checkpoints/step_<step>``
        (keeping the newest ``keep``), written in the background; first waits for the previous write (raising its
        error, if it failed)."""
        self.wait()
        model_t, optim_t = tensor_files.checkpoint_tensors(model, opt)
        host = {"model": self._host(model_t, "model"), "optim": self._host(optim_t, "optim")}
        copied = None
        if any(t.device.type == "cuda" for t in (*model_t.values(), *optim_t.values())):
            copied = torch.cuda.Event()
            copied.record()  # after the copies, on the current stream: the writer waits for it
        args = (run_dir, step, host["model"], host["optim"], copy.deepcopy(state), config_hash, keep)
        self._thread = threading.Thread(target=self._write, args=(copied, args), name=f"checkpoint-{step}",
                                        daemon=True)
        self._thread.start()

    def _host(self, tensors: dict[str, torch.Tensor], part: str) -> dict[str, torch.Tensor]:
        """Host copies of ``tensors``: a clone of a CPU tensor; a CUDA tensor's non-blocking copy into a pinned
        buffer (complete when the event recorded after them has passed)."""
        out = {}
        for name, t in tensors.items():
            t = t.detach()
            if t.device.type == "cpu":
                out[name] = t.clone()
                continue
            buf = self._pinned.get((part, name))
            if buf is None or buf.shape != t.shape or buf.dtype != t.dtype:
                buf = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
                self._pinned[(part, name)] = buf
            out[name] = buf.copy_(t, non_blocking=True)
        return out

    def _write(self, copied: Any, args: tuple) -> None:
        try:
            if copied is not None:
                copied.synchronize()
            tensor_files.save_checkpoint(*args)  # looked up now: a test may wrap it (tests/helpers.py, kill -9)
        except BaseException as e:  # noqa: BLE001 - raised in the training thread by wait()
            self._error = e

    @property
    def pending(self) -> bool:
        """Whether a write is in flight."""
        return self._thread is not None and self._thread.is_alive()

    def wait(self) -> None:
        """Wait for the pending write, if any; its error, if it failed, is raised here (once)."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def settle(self) -> BaseException | None:
        """Wait for the pending write and return its error instead of raising it (a run that already failed or
        was interrupted: its own error is the one to report; the previous checkpoint is whole either way)."""
        try:
            self.wait()
        except BaseException as e:  # noqa: BLE001 - handed back to the caller
            return e
        return None
