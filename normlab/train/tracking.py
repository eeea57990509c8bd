"""Live TensorBoard tracking of a training run, written with ``tensorboardX``'s ``SummaryWriter`` while it trains.

Every record the trainer appends to ``metrics.jsonl`` is also written as scalars and flushed at once, so
``tensorboard --logdir RUN_DIR/tb`` (a single run) or ``--logdir SWEEP_DIR/tb`` (a sweep) shows the curves during
training: ``train/loss``, ``train/lr``, ``train/grad_norm``, ``val/loss``, ``val/bpb``,
``perf/tokens_per_s``, and the diagnostics (``diag/...``) and any other numeric key under its own name. The run's
flattened config (``model.norm``, ``train.lr``, ...) is written as TensorBoard HParams at the start (session start
info, metrics ``val/bpb``, ``val/loss``, ``train/loss``) and the final status at the end (session end
info). A resumed run purges the events after its checkpoint step (``purge_step``), so curves never double.

``read_scalars`` decodes event files with the protobuf classes shipped in tensorboardX (used by the tests and the
API; reading needs no ``tensorboard`` install).
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

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


class Tracker:
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
        for k, v in record.items():
            if k in TB_SKIP or isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                continue
            self.writer.add_scalar(TB_NAMES.get(k, k), float(v), step)
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


def _records(path: Path):
    """TFRecord framing: ``uint64 length | uint32 crc | data | uint32 crc`` (a record cut by a crash is skipped)."""
    data = path.read_bytes()
    i = 0
    while i + 12 <= len(data):
        (length,) = struct.unpack("<Q", data[i : i + 8])
        if i + 16 + length > len(data):
            return
        yield data[i + 12 : i + 12 + length]
        i += 16 + length


def read_events(log_dir: str | Path) -> list:
    """Every ``Event`` proto of the event files in ``log_dir`` (file order, then record order)."""
    from tensorboardX.proto.event_pb2 import Event

    events = []
    for f in sorted(Path(log_dir).glob("events.out.tfevents.*")):
        events += [Event.FromString(r) for r in _records(f)]
    return events


def read_scalars(log_dir: str | Path) -> list[tuple[str, int, float]]:
    """``(tag, step, value)`` of every scalar in ``log_dir``'s event files."""
    return [(v.tag, e.step, v.simple_value) for e in read_events(log_dir) for v in e.summary.value
            if v.WhichOneof("value") == "simple_value"]


def read_hparams(log_dir: str | Path) -> dict[str, Any]:
    """The HParams session start values (``{"model.norm": "layernorm", ...}``) and ``status`` when the run ended."""
    from tensorboardX.proto.api_pb2 import Status
    from tensorboardX.proto.plugin_hparams_pb2 import HParamsPluginData

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
