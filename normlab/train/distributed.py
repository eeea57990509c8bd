"""Data-parallel training: one run on N processes with PyTorch's ``torchrun`` and DistributedDataParallel.

``torchrun --nproc-per-node N -m normlab train CONFIG ...`` starts N copies of ``normlab train``; each finds
``RANK`` / ``WORLD_SIZE`` / ``LOCAL_RANK`` in its environment and :func:`from_env` joins the process group (gloo on
CPU; with CUDA, backend ``cpu:gloo,cuda:nccl``: NCCL for CUDA tensors). ``normlab train --nproc N`` launches the
same on this machine (:func:`launch`: torchrun's own launcher, run in-process, c10d rendezvous on 127.0.0.1).

What a rank does differently from a one-process run (the hooks in ``normlab.train.loop``):

- **Global batch.** ``train.batch_size`` is the global batch of one micro-batch. Every rank draws the same window
  start positions from the seeded data generator (so the data order is the one-process order, whatever N is) and
  keeps its contiguous share of rows, ``B // N`` or ``B // N + 1`` (:meth:`DistContext.rows`). Each rank's loss is
  weighted by ``rows_r / B`` and DDP *sums* the gradients (a comm hook replaces its default average), so every
  rank backpropagates exactly its slice of the one-process gradient and the summed gradient is the global mean --
  also when ``B`` does not divide by N (no padding, no dropped rows). ``train.grad_accum`` micro-batches accumulate
  as before (DDP synchronises on the last one only).
- **Batch-statistics norms** (BatchNorm over tokens, PowerNorm, Unified Norm) take their statistics over the global
  batch: :func:`normlab.norms.batchstat.set_sync_group` makes them all-reduce token sums and counts (and, in
  their backward passes, the token means), as ``torch.nn.SyncBatchNorm`` does, on a process group of their own.
- **Only rank 0 writes**: run directory, metrics, checkpoints, summary (and evaluates). Other ranks read the
  checkpoint on ``--resume`` (the run directory must be visible to every node: shared storage).
- **Host reads.** A step's summed loss and loss terms are all-reduced as one float64 device tensor
  (:meth:`DistContext.all_sum_device`), read on the host where the step is read. On an accelerator reads are
  deferred to read points (``normlab.train.loop.defer_reads``: logged, diagnostic, evaluation, checkpoint and
  effective-LR steps, the last step): a step in between reads nothing, as in one process.
- **Stopping.** The stop flag (SIGINT / SIGTERM on any rank, e.g. torchrun forwarding Ctrl-C;
  ``normlab.interrupt.StopFlag(repeat="count")``: a repeated signal does not abort a rank, torchrun SIGKILLs a hung
  one after its shutdown timeout) is agreed by one all-reduce before every step on the CPU, before every read point
  when reads are deferred (every rank has the same read points: they follow from the config and the step), so all
  ranks stop at the same step, checkpointed. The divergence test runs on the all-reduced loss and the (already
  summed) gradient norm, identical on every rank, so all ranks also diverge at the same step (when deferred, they
  find it at the same read point). Rank 0 records the status once; a final barrier keeps the other ranks alive
  until it has.

Reference: Li et al. 2020, "PyTorch Distributed: Experiences on Accelerating Data Parallel Training"
(arXiv:2006.15704); torch.distributed.run (torchrun) and DistributedDataParallel documentation.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import signal
import socket
import sys
from dataclasses import dataclass
from typing import Any, Iterator

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from normlab.errors import NormlabError
from normlab.interrupt import die_with_parent
from normlab.norms.batchstat import set_sync_group
from normlab.resources import available_cores


def _sum_hook(group, bucket):  # no annotations: DDP checks them against its own (GradBucket, Future) types
    """DDP comm hook: all-reduce SUM (DDP's default divides by the world size; our losses are pre-weighted)."""
    fut = dist.all_reduce(bucket.buffer(), group=group, async_op=True).get_future()
    return fut.then(lambda f: f.value()[0])


@dataclass
class DistContext:
    """This process's place in a data-parallel run. ``world == 1``: a plain one-process run (every method is a
    no-op)."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    backend: str | None = None
    norm_group: Any = None  # process group of the batch-statistics norms
    device: torch.device = torch.device("cpu")  # where the model lives (set by ``wrap``)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world > 1

    def rows(self, batch_size: int) -> slice:
        """This rank's contiguous share of a global batch of ``batch_size`` rows (sizes differ by at most one)."""
        if not self.active:
            return slice(0, batch_size)
        if batch_size < self.world:
            raise NormlabError(f"train.batch_size ({batch_size}) must be >= the number of processes ({self.world}): "
                               "every process needs at least one row of the global batch")
        base, extra = divmod(batch_size, self.world)
        lo = self.rank * base + min(self.rank, extra)
        return slice(lo, lo + base + (1 if self.rank < extra else 0))

    def weight(self, batch_size: int) -> float:
        """The factor on this rank's mean loss: its share ``rows / batch_size`` of the global batch."""
        r = self.rows(batch_size)
        return (r.stop - r.start) / batch_size

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        """``model`` in DistributedDataParallel with summed gradients (or ``model`` itself in one process)."""
        if not self.active:
            return model
        dev = self.device = next(model.parameters()).device
        # buffers are not broadcast before each forward: batch-statistics norms keep them equal by all-reducing
        no_sync_buffers = ({"forward_sync_buffers": False} if "forward_sync_buffers" in
                           inspect.signature(DDP.__init__).parameters else {"broadcast_buffers": False})
        ddp = DDP(model, device_ids=[dev.index] if dev.type == "cuda" else None, **no_sync_buffers)
        ddp.register_comm_hook(None, _sum_hook)
        return ddp

    @contextlib.contextmanager
    def no_sync(self, wrapped: torch.nn.Module, sync: bool) -> Iterator[None]:
        """Skip DDP's gradient all-reduce for micro-batches that are not the last of a step."""
        if self.active and not sync:
            with wrapped.no_sync():
                yield
        else:
            yield

    def all_sum(self, values: list[float]) -> list[float]:
        """Sum ``values`` over ranks (float64; identical on every rank)."""
        if not self.active:
            return values
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        return t.tolist()

    def all_sum_device(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` (a float64 vector ``[n]`` on this rank's device) summed over ranks, in place and returned, without a
        host read (NCCL queues it on the device; gloo sums CPU tensors at once): the same float64 sums as
        :meth:`all_sum` of its values, identical on every rank."""
        if self.active:
            dist.all_reduce(t)
        return t

    def any(self, flag: bool) -> bool:
        """True on every rank when ``flag`` is true on any rank."""
        return self.all_sum([1.0 if flag else 0.0])[0] > 0 if self.active else flag

    def barrier(self) -> None:
        if self.active:
            dist.barrier()

    def close(self) -> None:
        if self.active:
            set_sync_group(None)
            if dist.is_initialized():
                dist.destroy_process_group()


SINGLE = DistContext()


def env_world() -> int:
    """``WORLD_SIZE`` from the environment (1 outside torchrun)."""
    try:
        return int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        raise NormlabError(f"WORLD_SIZE must be an integer, got {os.environ.get('WORLD_SIZE')!r}") from None


def from_env() -> DistContext:
    """Join the process group torchrun describes in the environment; :data:`SINGLE` outside torchrun."""
    world = env_world()
    if world <= 1:
        return SINGLE
    die_with_parent(signal.SIGKILL, os.getppid())  # kill -9 of the torchrun agent leaves no orphan rank
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    # collectives go to gloo for CPU tensors and NCCL for CUDA tensors (torch routes by the tensor's device)
    cuda = torch.cuda.is_available() and os.environ.get("NORMLAB_DIST_BACKEND", "") != "gloo"
    backend = "cpu:gloo,cuda:nccl" if cuda else "gloo"
    if cuda:
        torch.cuda.set_device(local_rank % torch.cuda.device_count())
    if not dist.is_initialized():
        dist.init_process_group(backend=backend)
    ctx = DistContext(rank=rank, world=world, local_rank=local_rank, backend=backend,
                      norm_group=dist.new_group(backend=backend))
    set_sync_group(ctx.norm_group)
    return ctx


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(nproc: int, argv: list[str]) -> int:
    """``normlab train --nproc N``: run ``python -m normlab ARGV`` on ``nproc`` local ranks through torchrun's
    launcher (in this process, so it is the agent: Ctrl-C here is forwarded to every rank once; kill -9 here kills
    the ranks too). Returns torchrun's exit status (0 when every rank exited 0)."""
    if nproc < 1:
        raise NormlabError(f"--nproc must be >= 1, got {nproc}")
    # torch's elastic agent and launcher: imported here, as only --nproc needs them (not every run's import)
    from torch.distributed.run import get_args_parser, run

    env_threads = os.environ.get("OMP_NUM_THREADS")
    if not env_threads:  # torchrun would set 1 and warn; share the cores instead
        os.environ["OMP_NUM_THREADS"] = str(max(1, available_cores() // nproc))
    if sys.platform.startswith("linux") and os.path.exists("/sys/class/net/lo"):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # every rank is local
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    os.environ["PYTHONPATH"] = root + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else "")
    targs = get_args_parser().parse_args([
        "--nnodes", "1", "--nproc-per-node", str(nproc), "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"127.0.0.1:{_free_port()}", "--max-restarts", "0", "-m", "normlab", *argv])
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    try:
        run(targs)
    except ChildFailedError as e:
        codes = [f.exitcode for f in e.failures.values()]
        return max(codes) if codes and all(c > 0 for c in codes) else 1
    except Exception as e:  # noqa: BLE001 - torchrun's SignalException etc.: the ranks got the signal
        if e.__class__.__name__ == "SignalException":
            return 130
        raise
    return 0
