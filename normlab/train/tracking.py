"""Live tracking of a training run: TensorBoard (default), Weights & Biases and MLflow, each through the library's
own logger, chosen by ``train.track`` (a list: ``[tensorboard]``, ``[tensorboard, wandb, mlflow]``, ``[]``).

Every record the trainer appends to ``metrics.jsonl`` goes to every tracker at once under the same names:
``train/loss``, ``train/lr``, ``train/grad_norm``, ``val/loss``, ``val/bpb``, ``perf/tokens_per_s``, and the
diagnostics (``diag/...``) and any other numeric key under its own name. The run's flattened config
(``model.norm``, ``train.lr``, ...: :func:`flat_hparams`) is each tracker's hyperparameters, and the final status
ends each run.

- **tensorboard** (``tensorboardX``'s ``SummaryWriter``, flushed after every record): ``tensorboard --logdir
  RUN_DIR/tb`` (a single run) or ``--logdir SWEEP_DIR/tb`` (a sweep) shows the curves during training; the config
  is written as TensorBoard HParams (session start info, metrics ``val/bpb``, ``val/loss``, ``train/loss``) and the
  status as the session end info. A resumed run purges the events after its checkpoint step (``purge_step``).
- **wandb** (``pip install 'normlab[wandb]'``; ``wandb.init``/``run.log``/``run.finish``): the project is
  ``$WANDB_PROJECT`` or ``normlab``, the run name the run directory's (a sweep's run id), the config the flattened
  hparams, the status ``summary["status"]``; files go under ``ROOT/wandb`` (``ROOT``: the run directory, or the
  sweep directory). ``WANDB_MODE=offline`` logs to those local files only (``wandb sync`` uploads them later).
  A resumed run continues the same W&B run (its id is derived from the event directory's path).
- **mlflow** (``pip install 'normlab[mlflow]'``; ``MlflowClient``): ``$MLFLOW_TRACKING_URI`` when set, else a local
  file store ``ROOT/mlruns`` (``mlflow ui --backend-store-uri ROOT/mlruns``; normlab sets
  ``MLFLOW_ALLOW_FILE_STORE=true`` for that store, which MLflow 3 keeps in maintenance mode); experiment
  ``$MLFLOW_EXPERIMENT_NAME`` or ``normlab``; params the flattened hparams, metrics the names above (characters
  MLflow refuses become ``_``), the end status ``FINISHED`` / ``FAILED`` / ``KILLED`` and a ``normlab.status`` tag.
  A resumed run continues the same MLflow run (found by its ``normlab.run_path`` tag).

Trackers fail soft: before anything is written, :func:`probe_trackers` opens a TCP connection (at most
``PROBE_TIMEOUT_S``) to each tracker server (``MLFLOW_TRACKING_URI`` over http(s); W&B's ``WANDB_BASE_URL`` or
api.wandb.ai unless ``WANDB_MODE`` is offline or disabled); one that does not answer is a one-line warning and the run
goes on without it, or, with ``train.track_required: true``, a one-line error before any step. A tracker that fails
later (while starting, logging or closing) is dropped with one warning line and the run finishes as usual.

``read_scalars`` / ``read_hparams`` read the event files with the ``tensorboard`` package's own reader (CRC-checked:
a damaged record ends the read), so reading needs ``pip install 'normlab[tensorboard]'``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from normlab.errors import NormlabError
from normlab.safety import printable

TRACKERS = ("tensorboard", "wandb", "mlflow")
TB_NAMES = {"loss": "train/loss", "lr": "train/lr", "grad_norm": "train/grad_norm", "val_bpb": "val/bpb",
            "val_loss": "val/loss", "tokens_per_s": "perf/tokens_per_s"}
TB_SKIP = ("step", "elapsed_s")
HPARAM_METRICS = ("val/bpb", "val/loss", "train/loss")  # val/bpb was val/bits_per_byte (normlab.names)


def flat_hparams(config: dict[str, Any], prefix: str = "") -> dict[str, bool | int | float | str]:
    """``{"model.norm": "layernorm", "train.lr": 0.003, ...}``; lists and mappings become JSON text, None is left
    out."""
    out: dict[str, bool | int | float | str] = {}
    for k, v in config.items():
        name = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(flat_hparams(v, f"{name}."))
        elif isinstance(v, (bool, int, float, str)):
            out[name] = v
        elif v is not None:
            out[name] = json.dumps(v, sort_keys=True)
    return out


def _scalars(record: dict[str, Any]) -> dict[str, float]:
    """``{tracker name: value}`` of a metrics record's finite numbers (``step`` and ``elapsed_s`` left out)."""
    return {TB_NAMES.get(k, k): float(v) for k, v in record.items()
            if k not in TB_SKIP and not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)}


class TensorBoardTracker:
    """``log(record)`` after each metrics record, ``close(status)`` at the end. ``log_dir``: the event directory."""

    def __init__(self, log_dir: str | Path, config: dict[str, Any], *, start_step: int = 0):
        from tensorboardX import SummaryWriter
        from tensorboardX.summary import hparams

        self.log_dir = Path(log_dir)
        self.writer = SummaryWriter(logdir=str(self.log_dir), purge_step=start_step or None, flush_secs=10)
        exp, ssi, _ = hparams(flat_hparams(config), {m: 0.0 for m in HPARAM_METRICS})
        self.writer.file_writer.add_summary(exp)
        self.writer.file_writer.add_summary(ssi)
        self.writer.flush()

    def log(self, record: dict[str, Any]) -> None:
        step = record.get("step")
        if not isinstance(step, int):
            return
        for name, v in _scalars(record).items():
            self.writer.add_scalar(name, v, step)
        self.writer.flush()  # live: visible to TensorBoard now, not at the next 10 s flush

    def close(self, status: str) -> None:
        """Write the HParams session end (``status``) and close the writer; a second call does nothing."""
        if self.writer is None:
            return
        from tensorboardX.proto.api_pb2 import Status
        from tensorboardX.proto.plugin_hparams_pb2 import HParamsPluginData, SessionEndInfo
        from tensorboardX.proto.summary_pb2 import Summary, SummaryMetadata

        code = {"completed": "STATUS_SUCCESS", "diverged": "STATUS_FAILURE"}.get(status, "STATUS_UNKNOWN")
        content = HParamsPluginData(session_end_info=SessionEndInfo(status=Status.Value(code)), version=0)
        meta = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(plugin_name="hparams",
                                                                      content=content.SerializeToString()))
        self.writer.file_writer.add_summary(Summary(value=[Summary.Value(tag="_hparams_/session_end_info",
                                                                         metadata=meta)]))
        self.writer.close()
        self.writer = None


def _need_tensorboard() -> None:
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        raise NormlabError("reading TensorBoard event files needs the tensorboard package: "
                           "pip install 'normlab[tensorboard]'") from None


def read_events(log_dir: str | Path) -> list:
    """Every ``Event`` proto of the event files in ``log_dir`` (file order, then record order), read with
    tensorboard's own record reader (``RawEventFileLoader``: CRC-checked; a damaged or cut record ends the file)."""
    _need_tensorboard()
    from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
    from tensorboard.compat.proto.event_pb2 import Event

    events = []
    for f in sorted(Path(log_dir).glob("events.out.tfevents.*")):
        events += [Event.FromString(raw) for raw in RawEventFileLoader(str(f)).Load()]
    return events


def read_scalars(log_dir: str | Path) -> list[tuple[str, int, float]]:
    """``(tag, step, value)`` of every scalar in ``log_dir``'s event files."""
    return [(v.tag, e.step, v.simple_value) for e in read_events(log_dir) for v in e.summary.value
            if v.WhichOneof("value") == "simple_value"]


def read_hparams(log_dir: str | Path) -> dict[str, Any]:
    """The HParams session start values (``{"model.norm": "layernorm", ...}``) and ``status`` when the run ended."""
    _need_tensorboard()
    from tensorboard.plugins.hparams.api_pb2 import Status
    from tensorboard.plugins.hparams.plugin_data_pb2 import HParamsPluginData

    out: dict[str, Any] = {}
    for e in read_events(log_dir):
        for v in e.summary.value:
            if v.metadata.plugin_data.plugin_name != "hparams":
                continue
            d = HParamsPluginData.FromString(v.metadata.plugin_data.content)
            if d.HasField("session_start_info"):
                for k, val in d.session_start_info.hparams.items():
                    out[k] = getattr(val, val.WhichOneof("kind"))
            if d.HasField("session_end_info"):
                out["status"] = Status.Name(d.session_end_info.status)
    return out


def _root_and_name(log_dir: Path) -> tuple[Path, str]:
    """``(ROOT, run name)``: the directory holding ``tb/`` (a run directory, or a sweep directory) and the run's
    name (the run directory's; a sweep run's id, ``SWEEP_DIR/tb/RUN_ID``)."""
    for p in (log_dir, *log_dir.parents):
        if p.name == "tb":
            return p.parent, (log_dir.name if p != log_dir else p.parent.name)
    return log_dir.parent, log_dir.name


def _run_key(log_dir: Path) -> str:
    return hashlib.sha256(str(log_dir.resolve()).encode()).hexdigest()[:16]


def _missing(kind: str, what: str) -> NormlabError:
    return NormlabError(f"train.track {kind} needs {what}, which is not installed: pip install 'normlab[{kind}]' "
                        f"(or remove {kind} from train.track)")


class WandbTracker:
    """Weights & Biases through ``wandb.init`` / ``run.log`` / ``run.finish`` (see the module docstring)."""

    def __init__(self, log_dir: Path, config: dict[str, Any], *, start_step: int = 0):
        try:
            import wandb
        except ImportError:
            raise _missing("wandb", "Weights & Biases (wandb)") from None
        root, name = _root_and_name(log_dir)
        try:
            self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", "normlab"), name=name,
                                  id=f"normlab-{_run_key(log_dir)}", resume="allow", dir=str(root),
                                  config=flat_hparams(config), reinit="create_new")
        except Exception as e:  # noqa: BLE001 - wandb raises its own errors (no login, no network, ...)
            why = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
            raise NormlabError(f"train.track wandb: cannot start a W&B run ({why}); log in with 'wandb login', "
                               "or set WANDB_MODE=offline to log to local files") from None
        self.dir = Path(self.run.dir).parent  # ROOT/wandb/<offline-|>run-<time>-<id>

    def log(self, record: dict[str, Any]) -> None:
        step = record.get("step")
        if isinstance(step, int) and self.run is not None:
            self.run.log(_scalars(record), step=step)

    def close(self, status: str) -> None:
        if self.run is None:
            return
        self.run.summary["status"] = status
        self.run.finish(exit_code=0 if status in ("completed", "interrupted") else 1)
        self.run = None


_MLFLOW_BAD = re.compile(r"[^A-Za-z0-9_\-. /]")
MLFLOW_STATUS = {"completed": "FINISHED", "diverged": "FAILED", "failed": "FAILED", "interrupted": "KILLED"}


class MlflowTracker:
    """MLflow through ``MlflowClient`` (see the module docstring)."""

    def __init__(self, log_dir: Path, config: dict[str, Any], *, start_step: int = 0):
        try:
            from mlflow.entities import Param
            from mlflow.tracking import MlflowClient
        except ImportError:
            raise _missing("mlflow", "MLflow (mlflow-skinny)") from None
        root, name = _root_and_name(log_dir)
        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:
            uri = (root / "mlruns").resolve().as_uri()
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3: the local store, by opt-in
        if tracker_server("mlflow") is not None:  # a server: each request bounded (the user's own settings win)
            os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
            os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
        self.client = MlflowClient(tracking_uri=uri)
        self.uri = uri
        exp_name = os.environ.get("MLFLOW_EXPERIMENT_NAME", "normlab")
        exp = self.client.get_experiment_by_name(exp_name)
        exp_id = exp.experiment_id if exp is not None else self.client.create_experiment(exp_name)
        path = str(log_dir.resolve())
        found = self.client.search_runs([exp_id], filter_string=f"tags.`normlab.run_path` = '{path}'",
                                        max_results=1) if start_step else []
        if found:
            self.run_id = found[0].info.run_id
        else:
            run = self.client.create_run(exp_id, run_name=name, tags={"normlab.run_path": path})
            self.run_id = run.info.run_id
            params = [Param(k, str(v)[:6000]) for k, v in flat_hparams(config).items()]
            for i in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
                self.client.log_batch(self.run_id, params=params[i:i + 100])

    def log(self, record: dict[str, Any]) -> None:
        from mlflow.entities import Metric

        step = record.get("step")
        if not isinstance(step, int) or self.run_id is None:
            return
        now = int(time.time() * 1000)
        metrics = [Metric(_MLFLOW_BAD.sub("_", k), v, now, step) for k, v in _scalars(record).items()]
        for i in range(0, len(metrics), 1000):
            self.client.log_batch(self.run_id, metrics=metrics[i:i + 1000])

    def close(self, status: str) -> None:
        if self.run_id is None:
            return
        self.client.set_tag(self.run_id, "normlab.status", status)
        self.client.set_terminated(self.run_id, MLFLOW_STATUS.get(status, "FAILED"))
        self.run_id = None


PROBE_TIMEOUT_S = 3.0  # the longest a tracker server's TCP connect may take at start


def tracker_server(kind: str, env: dict[str, str] | None = None) -> str | None:
    """The URL of the server ``kind`` talks to over the network, or None for a local store / offline mode."""
    env = os.environ if env is None else env
    if kind == "mlflow":
        uri = env.get("MLFLOW_TRACKING_URI", "")
        return uri if urlsplit(uri).scheme in ("http", "https") else None
    if kind == "wandb" and env.get("WANDB_MODE", "").lower() not in ("offline", "disabled", "dryrun"):
        return env.get("WANDB_BASE_URL") or "https://api.wandb.ai"
    return None


def _resolve(host: str, port: int, timeout: float) -> list[Any] | str:
    """``socket.getaddrinfo`` of ``host`` bounded by ``timeout`` seconds (the resolver itself has no timeout: a
    dead DNS server keeps it for the resolver's own retries, tens of seconds), run in a daemon thread that is left
    behind when late; the addresses, or why there are none."""
    got: dict[str, Any] = {}

    def work() -> None:
        try:
            got["addrs"] = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except Exception as e:  # noqa: BLE001 - socket.gaierror; an odd host (a NUL byte: ValueError) is a reason
            got["error"] = e

    t = threading.Thread(target=work, name="normlab-tracker-dns", daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        return f"looking up {host} took longer than {timeout:g} s"
    if "error" in got:
        e = got["error"]
        return (e.strerror if isinstance(e, OSError) else None) or str(e) or type(e).__name__
    return got["addrs"] or f"no address for {host}"


def unreachable(url: str, timeout: float = PROBE_TIMEOUT_S) -> str | None:
    """Why a TCP connection to ``url``'s host and port fails within ``timeout`` seconds, or None when it opens. The
    name lookup and the connects share the ``timeout``: the lookup runs under a deadline (``_resolve``), each
    address is tried with the time left."""
    parts = urlsplit(url)
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return "a port that is not a number"
    if not parts.hostname:
        return "no host in the URL"
    deadline = time.monotonic() + timeout
    addrs = _resolve(parts.hostname, port, timeout)
    if isinstance(addrs, str):
        return addrs
    why = "no address answered"
    for family, kind, proto, _, address in addrs:
        left = deadline - time.monotonic()
        if left <= 0:
            return why if why != "no address answered" else f"no answer within {timeout:g} s"
        try:
            with socket.socket(family, kind, proto) as s:
                s.settimeout(left)
                s.connect(address)
                return None
        except OSError as e:
            why = e.strerror or type(e).__name__
    return why


def _soft_fail(kind: str, what: str, why: Any, *, required: bool) -> None:
    """A tracker that cannot go on: one warning line (the run goes on without it), or with ``required`` an error."""
    why = printable((str(why).strip().splitlines() or [type(why).__name__])[0][:200])
    if required:
        raise NormlabError(f"train.track {kind}: {what} ({why}); train.track_required is true, so the run does not "
                           f"start: start the server, or set train.track_required=false to train without it")
    print(f"warning: train.track {kind}: {what} ({why}); training goes on without {kind}", file=sys.stderr)


def probe_trackers(track: list[str] | tuple[str, ...], *, required: bool = False,
                   timeout: float = PROBE_TIMEOUT_S) -> list[str]:
    """The trackers of ``track`` whose server answers a TCP connect within ``timeout`` s (the others: a warning line
    each, or a :class:`NormlabError` when ``required``). Called before the run directory is written."""
    kept = []
    for kind in track:
        url = tracker_server(kind)
        why = unreachable(url, timeout) if url else None
        if why is None:
            kept.append(kind)
        else:
            _soft_fail(kind, f"the server {url} does not answer", why, required=required)
    return kept


class Tracker:
    """Every tracker of ``track`` (``train.track``) behind one ``log(record)`` / ``close(status)``. ``log_dir``: the
    TensorBoard event directory (``RUN_DIR/tb`` or ``SWEEP_DIR/tb/RUN_ID``), which also names W&B's and MLflow's
    root and run (module docstring). ``probed``: ``track`` already went through :func:`probe_trackers`.
    ``config["train"]["track_required"]`` makes a tracker that cannot start an error instead of a warning."""

    def __init__(self, log_dir: str | Path, config: dict[str, Any], *, start_step: int = 0,
                 track: list[str] | tuple[str, ...] = ("tensorboard",), probed: bool = False):
        self.log_dir = Path(log_dir)
        self.required = bool((config.get("train") or {}).get("track_required", False))
        kinds = {"tensorboard": TensorBoardTracker, "wandb": WandbTracker, "mlflow": MlflowTracker}
        self.trackers: list[tuple[str, Any]] = []
        try:
            for kind in track:
                if kind not in kinds:
                    raise NormlabError(f"unknown tracker '{kind}' in train.track; allowed: {', '.join(TRACKERS)}")
            for kind in (track if probed else probe_trackers(track, required=self.required)):
                try:
                    self.trackers.append((kind, kinds[kind](self.log_dir, config, start_step=start_step)))
                except Exception as e:  # noqa: BLE001 - each library raises its own errors (network, server, ...)
                    if isinstance(e, NormlabError):
                        raise
                    _soft_fail(kind, "cannot start", e, required=self.required)
        except BaseException:
            self.close("failed")
            raise

    def _each(self, method: str, *args: Any) -> None:
        for kind, t in list(self.trackers):
            try:
                getattr(t, method)(*args)
            except Exception as e:  # noqa: BLE001 - a tracker failing mid-run never ends the run
                self.trackers.remove((kind, t))
                _soft_fail(kind, f"failed while {'logging' if method == 'log' else 'closing'}", e, required=False)

    def log(self, record: dict[str, Any]) -> None:
        self._each("log", record)

    def close(self, status: str) -> None:
        """End every tracker's run with ``status``; a second call does nothing."""
        self._each("close", status)
