"""The Ray executor (``RayTasks``): a sweep's runs as tasks on a Ray cluster; ``local`` worker processes, in-process
and stacked runs are the executors of ``normlab.experiments.scheduling``, whose one loop drives this one too.

``normlab compare SWEEP --executor ray [--address auto|HOST:PORT|ray://HOST:PORT]`` (and ``normlab claims
--executor ray``) submits every
job as one Ray task (Moritz et al. 2018, "Ray: A Distributed Framework for Emerging AI Applications",
arXiv:1712.05889) asking for ``threads`` CPUs, or one GPU when the cluster has GPUs. A job is one run, or a stacked
group (``--stack``, normlab.experiments.worker.plan_stacks: ``auto`` stacks where the cluster has GPUs): its runs
train as one stacked model in one process (``worker.train_group``, as the in-process stacked executor trains them),
so a group asks for the resources of one run. ``--address`` takes what
``ray.init`` takes: ``auto`` (the cluster ``ray start --head`` started on this machine, or ``RAY_ADDRESS``),
``HOST:PORT`` (a cluster's GCS address) or ``ray://HOST:PORT`` (the Ray client server of a remote cluster). Without
``--address`` Ray connects to the cluster named by ``RAY_ADDRESS`` or starts a one-machine cluster.

- **The driver alone writes the results store**: a task returns each run's summary (and, when needed, its files);
  the driver (``normlab compare``) records each row and its curves, as a local worker does. A group's members that
  finished earlier are recorded by the driver without a task; the others train in the group's task. The trainer
  writes its live TensorBoard scalars to ``SWEEP_DIR/tb/<run id>`` (sent back with the run directory when needed).
- **Files.** A task first looks for a marker file the driver wrote into the sweep directory. Found (shared storage:
  NFS, or one machine): the runs train in ``SWEEP_DIR/runs/<run id>`` directly. Not found: the driver sends each
  run directory's files with the task (a resumed run's checkpoints), the runs train in a temporary directory on the
  worker, and the task returns each directory as a tar archive that the driver unpacks into the sweep directory
  (``NORMLAB_RAY_FILES=copy`` forces this, ``shared`` forbids it; default ``auto``).
- **Training** runs in a child process of the task (``python -m normlab.experiments.executors``, no store access),
  which dies with the task's worker process; its output goes to ``SWEEP_DIR/logs/<run id>.log`` (a group's to its
  first trained member's log, which the other members' logs name).
- **Ctrl-C** on the driver: the first sets a flag in a small Ray actor (on the driver's node) that every task polls;
  tasks forward one SIGINT to their trainer (checkpoint, every member of a group, ``status: interrupted``) and
  return normally. A second
  Ctrl-C cancels the tasks (the trainers stop at once, keeping their last checkpoint); a third force-kills them.
- **Lost tasks** (a worker node dies): the run is recorded ``failed`` with the reason; tasks are not retried by
  Ray (``max_retries=0``), so a re-run of the same command resumes it from its last checkpoint, like a failed
  local worker. Re-running resumes interrupted runs and skips finished ones, exactly as with ``--executor local``.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

from normlab.errors import EXIT_BAD_INPUT, EXIT_INTERRUPTED, NormlabError
from normlab.interrupt import die_with_parent
from normlab.experiments.worker import finished_summary, probe_if_asked, record, train_group, train_run
from normlab.resources import available_cores, plan_workers
from normlab.rundir.readers import STATUS_EXIT, read_summary
from normlab.safety import printable

EXECUTORS = ("local", "ray")
MARKER = ".normlab-ray-marker"
INSTALL_HINT = "pip install 'normlab[ray]'"
ROOT = str(Path(__file__).resolve().parents[2])  # the directory holding the normlab package


def check_executor(name: str, address: str | None) -> None:
    """Validate ``--executor`` / ``--address`` before anything is written."""
    if name not in EXECUTORS:
        raise NormlabError(f"--executor must be one of {', '.join(EXECUTORS)}, got '{name}'")
    if name == "local":
        if address:
            raise NormlabError("--address needs --executor ray (it names a Ray cluster)")
        return
    try:
        import ray  # noqa: F401
    except ImportError:
        raise NormlabError(f"--executor ray needs Ray, which is not installed: {INSTALL_HINT}") from None
    if address:
        host, port = _split_address(address)
        shown = address
        if address == "auto":
            host, port = _auto_address()
            shown = f"auto ({host}:{port})"
        try:
            socket.create_connection((host, port), timeout=5).close()
        except OSError as e:
            raise NormlabError(f"cannot reach a Ray cluster at --address {shown} ({e.strerror or e}); start one "
                               "with 'ray start --head --port PORT' or give the address it printed") from None


ADDRESS_FORMS = "auto, HOST:PORT (e.g. 10.0.0.1:6379) or ray://HOST:PORT (Ray client, e.g. ray://10.0.0.1:10001)"


def _split_address(address: str) -> tuple[str, int]:
    """``(host, port)`` of ``HOST:PORT`` or ``ray://HOST:PORT``; ``("", 0)`` for ``auto`` (resolved by Ray)."""
    if address == "auto":
        return "", 0
    rest = address[len("ray://"):] if address.startswith("ray://") else address
    host, _, port = rest.rpartition(":")
    if not host or "/" in rest or not port.isdigit() or not 0 < int(port) < 65536:
        raise NormlabError(f"--address must be {ADDRESS_FORMS}; got '{address}'")
    return host.strip("[]"), int(port)


def _auto_address() -> tuple[str, int]:
    """What Ray's ``address="auto"`` finds (``RAY_ADDRESS``, else the cluster ``ray start`` recorded on this
    machine), as ``(host, port)``; none is a one-line error."""
    env = os.environ.get("RAY_ADDRESS")
    if env and env != "auto":
        return _split_address(env)
    try:
        from ray._private.services import canonicalize_bootstrap_address_or_die

        found = canonicalize_bootstrap_address_or_die("auto")
    except Exception:  # noqa: BLE001 - Ray raises ConnectionError, or anything from its private lookup
        raise NormlabError("--address auto: no running Ray cluster found on this machine; start one with "
                           "'ray start --head' or give its address (HOST:PORT or ray://HOST:PORT)") from None
    return _split_address(found)


def connect(address: str | None) -> Any:
    """``ray`` connected to the cluster at ``address`` (or RAY_ADDRESS, or a new one-machine cluster)."""
    import ray

    if not ray.is_initialized():
        kw: dict[str, Any] = {"logging_level": logging.WARNING, "log_to_driver": False,
                              "runtime_env": {"env_vars": {"PYTHONPATH": _pythonpath()}}}
        if address:
            kw["address"] = address
        elif not os.environ.get("RAY_ADDRESS"):
            kw.update(num_cpus=available_cores(), include_dashboard=False)
        try:
            ray.init(**kw)
        except (ConnectionError, RuntimeError) as e:
            raise NormlabError(
                f"cannot connect to Ray at {address or os.environ.get('RAY_ADDRESS') or 'a new local cluster'}: "
                f"{str(e).splitlines()[0] if str(e) else e.__class__.__name__}"
            ) from None
    return ray


def _pythonpath() -> str:
    old = os.environ.get("PYTHONPATH")
    return ROOT + (os.pathsep + old if old else "")


def cluster_cpus(ray: Any) -> int:
    return max(1, int(ray.cluster_resources().get("CPU", 1)))


def node_cpus(ray: Any) -> int:
    """CPUs of the largest live node: a task asking for more would wait forever, as no node can run it."""
    cpus = [n.get("Resources", {}).get("CPU", 0) for n in ray.nodes() if n.get("Alive")]
    return max(1, int(max(cpus, default=1)))


def plan_ray(ray: Any, n_runs: int, workers: int | None) -> tuple[int, int]:
    """``(tasks in flight, threads per task)`` on the cluster: the cluster's CPUs shared as on one machine
    (``resources.plan_workers``), each task's threads capped at the largest live node's CPUs. The cap matters with
    fewer runs than nodes, and right after a node died (the cluster's total still counts it for a while)."""
    w, threads = plan_workers(n_runs, workers, cluster_cpus(ray))
    return w, min(threads, node_cpus(ray))


def cluster_gpus(ray: Any) -> bool:
    """Whether the cluster has a GPU: its tasks then ask for one (``_resources``), and ``device: auto`` is CUDA."""
    return ray.cluster_resources().get("GPU", 0) >= 1


def _resources(ray: Any, threads: int) -> dict[str, Any]:
    """One CPU bundle of ``threads``, or one GPU (and one CPU) when the cluster has GPUs; a stacked group is one
    process, so it asks for the same."""
    if cluster_gpus(ray):
        return {"num_cpus": 1, "num_gpus": 1}
    return {"num_cpus": threads, "num_gpus": 0}


# ---------------------------------------------------------------------------------------------- files
def pack(root: Path, rel: str) -> bytes | None:
    """``root/rel`` as a gzip'd tar (paths relative to ``root``), or None when it does not exist."""
    if not (root / rel).exists():
        return None
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        tar.add(root / rel, arcname=rel)
    return buf.getvalue()


def _extract(tar: tarfile.TarFile, dest: Path) -> None:
    """Extract with the ``data`` filter (no absolute paths, links out of ``dest`` or devices) where Python has it."""
    if hasattr(tarfile, "data_filter"):
        tar.extractall(dest, filter="data")
    else:  # Python < 3.10.12: the archives are our own (written by ``pack``)
        tar.extractall(dest)


def unpack(data: bytes, root: Path, rel: str) -> None:
    """Replace ``root/rel`` by the tree in ``data`` (extracted beside it, then renamed into place)."""
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".unpack-", dir=root))
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            _extract(tar, tmp)
        dest, old = root / rel, root / f".{Path(rel).name}.old-{secrets.token_hex(4)}"
        dest.parent.mkdir(parents=True, exist_ok=True)
        if dest.exists():
            dest.rename(old)
        (tmp / rel).rename(dest)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _shared(sweep_root: str, token: str, mode: str) -> bool:
    if mode in ("shared", "copy"):
        return mode == "shared"
    try:
        return (Path(sweep_root) / MARKER).read_text().strip() == token
    except OSError:
        return False


# ---------------------------------------------------------------------------------------------- the task
def sweep_task(run_ids: list[str], configs: list[dict[str, Any]], threads: int, sweep_root: str, token: str,
               mode: str, files: list[tuple[str, bytes | None]] | None, stopper: Any,
               stacked: bool = False) -> dict[str, Any]:
    """One job on a Ray worker: train (or resume) one run, or ``run_ids`` as one stacked group (``stacked``), in a
    child process; return what the driver records (``members``: each run's summary and, not shared, its files)."""
    import ray

    shared = _shared(sweep_root, token, mode)
    if shared:
        root, tmp = Path(sweep_root), None
    else:
        tmp = Path(tempfile.mkdtemp(prefix="normlab-ray-"))
        root = tmp
        for sub, data in files or []:  # each run directory and its TensorBoard directory, when resumed
            if data:
                with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
                    _extract(tar, root / sub)
    try:
        (root / "logs").mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "normlab.experiments.executors"]
        cfg_files = []
        for run_id, config in zip(run_ids, configs):
            cfg_files.append(root / "logs" / f"{run_id}.config.json")
            cfg_files[-1].write_text(json.dumps(config))
            cmd += [str(root / "runs" / run_id), str(cfg_files[-1])]
        log_path = root / "logs" / f"{run_ids[0]}.log"
        env = dict(os.environ, PYTHONPATH=_pythonpath(), OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads),
                   PYTHONUNBUFFERED="1")
        cmd += ["--threads", str(threads), "--parent", str(os.getpid())]
        for run_id in run_ids:
            cmd += ["--tb-dir", str(root / "tb" / run_id)]
        if stacked:
            cmd.append("--stacked")
        with open(log_path, "ab") as logf:
            proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
        signalled, rusage, status = 0, None, None
        last_poll = 0.0
        while status is None:
            try:
                pid, st, ru = os.wait4(proc.pid, os.WNOHANG)
                if pid:
                    status, rusage = os.waitstatus_to_exitcode(st), ru
                    break
                if not signalled and stopper is not None and time.time() - last_poll > 1.0:
                    last_poll = time.time()
                    try:
                        stop = ray.get(stopper.stopped.remote(), timeout=30)
                    except ray.exceptions.GetTimeoutError:  # a slow answer: ask again later
                        stop = False
                    except Exception:  # noqa: BLE001 - the flag's node is gone: keep training, stop polling it
                        stopper, stop = None, False
                    if stop:
                        signalled = 1
                        proc.send_signal(signal.SIGINT)
                time.sleep(0.2)
            except KeyboardInterrupt:  # ray.cancel: stop the trainer now (a second SIGINT if it had one)
                signalled += 1
                proc.send_signal(signal.SIGINT if signalled <= 2 else signal.SIGKILL)
        proc.returncode = status
        for f in cfg_files:
            f.unlink(missing_ok=True)
        members: dict[str, dict[str, Any]] = {}
        for run_id in run_ids:
            run_dir = root / "runs" / run_id
            try:
                summary = read_summary(run_dir) if run_dir.is_dir() else None
            except NormlabError:
                summary = None
            members[run_id] = {"summary": summary, "files": None if shared else pack(root / "runs", run_id),
                               "tb_files": None if shared else pack(root / "tb", run_id)}
        out: dict[str, Any] = {"rc": status, "members": members, "host": socket.gethostname(), "shared": shared,
                               "peak_mem_mb": rusage.ru_maxrss / 1024.0 if rusage else None, "log": None}
        if shared:
            out["log_tail"] = log_path.read_bytes()[-2000:]
        else:
            out["log"] = log_path.read_bytes()
        return out
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


class Stopper:
    """A flag the driver sets on Ctrl-C and every task polls (a Ray actor with no CPU)."""

    def __init__(self) -> None:
        self.flag = False

    def stop(self) -> None:
        self.flag = True

    def stopped(self) -> bool:
        return self.flag


# ---------------------------------------------------------------------------------------------- the driver
def _last_line(data: bytes | None) -> str:
    lines = [l for l in (data or b"").decode(errors="replace").splitlines() if l.strip()]
    return lines[-1][:300] if lines else ""


class RayTasks:
    """The Ray executor (``normlab.experiments.scheduling.Executor``): one task per job (a run, or a stacked group's
    runs), at most ``slots`` in flight; the driver alone records every row (module docstring). The first signal
    sets the ``Stopper`` flag every task polls (each forwards one SIGINT to its trainer), a second cancels the tasks,
    a third force-kills them."""

    in_process, announces, tag, exited = False, True, "", "trainer exited"

    def __init__(self, ray: Any, store: Any, sweep_dir: Path, slots: int, threads: int):
        self.ray, self.store, self.slots, self.threads = ray, store, slots, threads
        self.sweep_dir = sweep_dir.resolve()
        self.token = secrets.token_hex(8)
        (self.sweep_dir / MARKER).write_text(self.token)
        (self.sweep_dir / "logs").mkdir(exist_ok=True)
        self.mode = os.environ.get("NORMLAB_RAY_FILES", "auto")
        if self.mode not in ("auto", "shared", "copy"):
            raise NormlabError(f"NORMLAB_RAY_FILES must be auto, shared or copy, got '{self.mode}'")
        self.remote = ray.remote(max_retries=0)(sweep_task)
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=True)
        self.stopper = ray.remote(num_cpus=0)(Stopper).options(scheduling_strategy=here).remote()  # driver's node
        self.res = _resources(ray, threads)
        self.running: dict[Any, list[str]] = {}
        self.ready: list[tuple[str, int | None]] = []
        self.signals = 0
        self.group_of: dict[str, str] = {}  # a stacked member -> the member whose log holds the group's output

    def in_flight(self) -> int:
        return len(self.running) + len(self.ready)

    def start(self, job: list[str], on_signal: Any) -> bool:
        """Record the job's runs that finished earlier; submit the others as one task (a stacked group's members
        train together even when one is left, as the in-process stacked executor trains them)."""
        rows = {r: self.store.get(r) for r in job}
        done = {r: s for r in job if (s := finished_summary(self.sweep_dir / "runs" / r)) is not None}
        todo = [r for r in job if r not in done]
        for r in job:
            self.store.start(r, calls_trainer=r not in done)
        for r, summary in done.items():  # trained earlier, not recorded: record only
            record(self.store, self.sweep_dir, r, summary, peak_mem_mb=rows[r].get("peak_mem_mb"))
            self.ready.append((r, None))
        if not todo:
            return True
        stacked = len(job) > 1
        if stacked:
            self.group_of.update({r: todo[0] for r in todo})
            for r in todo[1:]:  # the member's own log (``log_of`` names the group's)
                (self.sweep_dir / "logs" / f"{r}.log").write_text(
                    f"trained in a stacked group; output in logs/{todo[0]}.log\n")
        files = ([(sub, pack(self.sweep_dir / sub, r)) for r in todo for sub in ("runs", "tb")]
                 if self.mode != "shared" else None)
        ref = self.remote.options(**self.res).remote(todo, [rows[r]["config"] for r in todo], self.threads,
                                                     str(self.sweep_dir), self.token, self.mode, files, self.stopper,
                                                     stacked)
        self.running[ref] = todo
        return True

    def finished(self) -> list[tuple[str, int | None]]:
        out, self.ready = self.ready, []
        if not self.running:
            return out
        ready, _ = self.ray.wait(list(self.running), num_returns=1, timeout=0.5)
        for ref in ready:
            run_ids = self.running.pop(ref)
            try:
                result, error = self.ray.get(ref), None
            except Exception as e:  # noqa: BLE001 - a lost node, a cancelled or crashed task: recorded
                first = (str(e).strip().splitlines() or [e.__class__.__name__])[0]
                result, error = None, f"Ray task lost ({e.__class__.__name__}): {first[:300]}"
            out.extend((run_id, self._record(run_ids, run_id, result, error)) for run_id in run_ids)
        return out

    def _record(self, run_ids: list[str], run_id: str, result: dict[str, Any] | None,
                error: str | None) -> int | None:
        """Unpack what the task sent back for ``run_id`` (one of the job ``run_ids``; the job's log with its first)
        and write the run's row; returns the trainer's exit status."""
        status = "interrupted" if self.signals else "failed"
        if result is None:
            self.store.update(run_id, status=status, error=error)
            return None
        member = result["members"][run_id]
        if member.get("files"):
            unpack(member["files"], self.sweep_dir / "runs", run_id)
        if member.get("tb_files"):
            unpack(member["tb_files"], self.sweep_dir / "tb", run_id)
        if result.get("log") and run_id == run_ids[0]:
            with open(self.log_of(run_id), "ab") as f:
                f.write(result["log"])
        summary = member.get("summary")
        if summary and summary.get("status") in ("completed", "diverged", "interrupted"):
            summary = {**summary, "run_dir": str(self.sweep_dir / "runs" / run_id)}
            record(self.store, self.sweep_dir, run_id, summary, peak_mem_mb=result.get("peak_mem_mb"))
        else:
            why = _last_line(result.get("log") or result.get("log_tail"))
            self.store.update(run_id, status=status, error=f"trainer exited with status {result.get('rc')} on "
                                                           f"{result.get('host')}: {why}")
        return result.get("rc")

    def interrupt(self, signals: int) -> None:
        self.signals = signals
        if signals == 1:
            self.stopper.stop.remote()
            return
        for ref in self.running:
            self.ray.cancel(ref, force=signals >= 3)

    def wait(self) -> None:
        """``finished`` waits (``ray.wait``, half a second) for the next task."""

    def close(self) -> None:
        (self.sweep_dir / MARKER).unlink(missing_ok=True)

    def log_of(self, run_id: str) -> Path:
        return self.sweep_dir / "logs" / f"{self.group_of.get(run_id, run_id)}.log"

    def progress_line(self, done: int) -> str:
        return ""


# ---------------------------------------------------------------------------------------------- trainer child
def main(argv: list[str] | None = None) -> int:
    """``python -m normlab.experiments.executors RUN_DIR CONFIG_JSON [RUN_DIR CONFIG_JSON ...] [--stacked]
    [--threads N] [--parent PID] [--tb-dir DIR ...]``: train or resume one run, or with ``--stacked`` the runs as one
    stacked group (``worker.train_group``); no store access (the Ray task that started it reports to the driver)."""
    p = argparse.ArgumentParser(prog="python -m normlab.experiments.executors")
    p.add_argument("runs", nargs="+", metavar="RUN_DIR CONFIG_JSON", help="a run directory and its config (JSON), "
                   "one pair per run")
    p.add_argument("--stacked", action="store_true", help="train the runs as one stacked group")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--parent", type=int, default=None, help="pid of the Ray worker: die with it")
    p.add_argument("--tb-dir", action="append", default=None,
                   help="live TensorBoard scalars, one per run in order (default RUN_DIR/tb)")
    args = p.parse_args(argv)
    if len(args.runs) % 2:
        p.error("give a RUN_DIR and a CONFIG_JSON for every run")
    run_dirs, cfg_files = [Path(d) for d in args.runs[::2]], [Path(c) for c in args.runs[1::2]]
    if len(run_dirs) > 1 and not args.stacked:
        p.error("several runs train only as one stacked group (--stacked)")
    if args.tb_dir is not None and len(args.tb_dir) != len(run_dirs):
        p.error(f"give one --tb-dir per run ({len(run_dirs)}), got {len(args.tb_dir)}")
    tb_dirs = [Path(t) for t in args.tb_dir] if args.tb_dir else [None] * len(run_dirs)
    die_with_parent(signal.SIGKILL, args.parent)  # the Ray worker that started it died: a lost node, no orphan
    # a Ray worker runs with SIGINT blocked, and a blocked mask is inherited across fork and exec: unblocked, the
    # SIGINT the task forwards on the driver's first Ctrl-C reaches the trainer (checkpoint, interrupted)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        configs = [json.loads(c.read_text()) for c in cfg_files]
        if args.stacked:
            summaries = train_group(run_dirs, configs, args.threads, tb_dirs)
        else:
            summaries = [train_run(run_dirs[0], configs[0], args.threads, tb_dir=tb_dirs[0])]
        for run_dir, config, summary in zip(run_dirs, configs, summaries):
            probe_if_asked(run_dir, config, summary)  # diag.probes: measured here, packed with the run
    except NormlabError as e:
        print(f"error: {printable(e)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    codes = [STATUS_EXIT.get(s.get("status", ""), 1) for s in summaries]
    return EXIT_INTERRUPTED if EXIT_INTERRUPTED in codes else max(codes)


if __name__ == "__main__":
    sys.exit(main())
