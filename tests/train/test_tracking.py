"""Live tracking (normlab.train.tracking): a single ``normlab train`` writes TensorBoard scalars and hparams while it
trains, read back with tensorboard's own ``EventAccumulator`` during training and its CRC-checked record reader
after, and checked against metrics.jsonl; W&B (offline mode, its local ``.wandb`` file read with W&B's own protobuf
schema) and MLflow (a local store read with ``MlflowClient``) get the same names, values and hyperparameters."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest
import yaml

from normlab.train.tracking import flat_hparams, read_hparams, read_scalars
from tests.helpers import cli_env


def test_single_run_writes_tensorboard_while_it_trains(tmp_path, cache):
    out = tmp_path / "run"
    args = ["train", "tiny", "--set", "train.steps=5000", "--set", "train.log_every=1", "--set", "train.eval_every=5",
            "--set", "train.checkpoint_every=5000", "--set", "model.context=16", "--out", str(out)]
    proc = subprocess.Popen([sys.executable, "-m", "normlab", *args], env=cli_env(cache),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    seen: list = []
    alive = False
    live_tags: list = []
    try:
        deadline = time.time() + 180
        while time.time() < deadline and proc.poll() is None:
            if (out / "tb").is_dir():
                seen = read_scalars(out / "tb")
                if sum(t == "val/bpb" for t, _, _ in seen) >= 2:
                    acc = EventAccumulator(str(out / "tb"))  # what the TensorBoard viewer does with live files
                    acc.Reload()
                    live_tags = acc.Tags()["scalars"]
                    live_val = [(e.step, e.value) for e in acc.Scalars("val/bpb")]
                    alive = proc.poll() is None  # read while the run is still training
                    break
            time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGINT)  # checkpoint and stop (status interrupted)
        proc.wait(timeout=120)
    assert alive, "no validation scalars appeared while the run trained"
    assert {"train/loss", "val/bpb", "val/loss"} <= set(live_tags) and len(live_val) >= 2
    assert all(v == pytest.approx(w, rel=1e-6) for (_, v), (_, w) in
               zip(live_val, sorted((s, v) for t, s, v in seen if t == "val/bpb"), strict=False))
    assert {"train/loss", "train/lr", "train/grad_norm", "perf/tokens_per_s", "val/loss"} <= {t for t, _, _ in seen}
    assert any(t.startswith("diag/") for t, _, _ in seen)  # training-time diagnostics (diag.every: 10)

    # after the run: every logged value equals metrics.jsonl (float32 in the event file)
    scalars = read_scalars(out / "tb")
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    for key, tag in (("loss", "train/loss"), ("lr", "train/lr"), ("grad_norm", "train/grad_norm"),
                     ("val_bpb", "val/bpb")):
        want = {m["step"]: m[key] for m in metrics if key in m}
        got = {s: v for t, s, v in scalars if t == tag}
        assert got.keys() == want.keys() and len(want) >= 2, tag
        assert all(got[s] == pytest.approx(want[s], rel=1e-6, abs=1e-12) for s in want), tag
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "interrupted" and max(s for t, s, _ in scalars if t == "train/loss") == summary["step"]

    hp = read_hparams(out / "tb")
    cfg = flat_hparams(__import__("yaml").safe_load((out / "config.yaml").read_text()))
    assert hp["model.norm"] == "layernorm" and hp["train.steps"] == 5000 and hp["model.context"] == 16
    assert set(cfg) <= set(hp) and hp["status"] == "STATUS_UNKNOWN"  # interrupted (resumable)


def test_flat_hparams():
    assert flat_hparams({"model": {"norm": "rmsnorm", "norm_options": {}, "x": None, "l": [1, 2]}, "seed": 3}) == {
        "model.norm": "rmsnorm", "model.norm_options": "{}", "model.l": "[1, 2]", "seed": 3}


def _wandb_records(path):
    """The ``Record`` protos of a W&B ``.wandb`` file: a 7-byte ``:W&B`` header, then the LevelDB log framing W&B
    documents for it (32 KiB blocks; each chunk ``crc32c(4) length(2) type(1)``: 1 full, 2 first, 3 middle, 4
    last), each record parsed with W&B's own schema (``wandb.proto.wandb_internal_pb2.Record``)."""
    import struct

    from wandb.proto.wandb_internal_pb2 import Record

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, pending, out = 7, 32768, b"", []
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        length, kind = struct.unpack("<HB", data[pos + 4:pos + 7])
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind == 0 and length == 0:
            continue
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            out.append(Record.FromString(pending))
    return out


def test_wandb_offline_and_mlflow_log_what_tensorboard_logs(tmp_path, cache, monkeypatch):
    wandb = pytest.importorskip("wandb")
    mlflow_client = pytest.importorskip("mlflow.tracking")
    env = {**cli_env(cache), "WANDB_MODE": "offline", "WANDB_SILENT": "true", "MLFLOW_DISABLE_TELEMETRY": "true",
           "WANDB_DISABLE_GIT": "true"}
    env.pop("MLFLOW_TRACKING_URI", None)
    out = tmp_path / "run"
    subprocess.run([sys.executable, "-m", "normlab", "train", "tiny", "--set", "train.steps=6", "--set",
                    "train.log_every=2", "--set", "train.eval_every=3", "--set", "model.context=16", "--set",
                    "train.track=[tensorboard, wandb, mlflow]", "--out", str(out)], env=env, check=True,
                   capture_output=True, timeout=300)
    tb = {(t, s): v for t, s, v in read_scalars(out / "tb")}
    hp = read_hparams(out / "tb")
    assert ("val/bpb", 6) in tb and ("train/loss", 6) in tb and hp["status"] == "STATUS_SUCCESS"

    # MLflow: the local store under the run directory, read with MLflow's own client
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    client = mlflow_client.MlflowClient(tracking_uri=(out / "mlruns").as_uri())
    exp = client.get_experiment_by_name("normlab")
    (run,) = client.search_runs([exp.experiment_id])
    assert run.info.status == "FINISHED" and run.data.tags["normlab.status"] == "completed"
    assert run.info.run_name == "run"
    assert run.data.params == {
        k: str(v) for k, v in flat_hparams(yaml.safe_load((out / "config.yaml").read_text())).items()
    }
    for tag in {t for t, _ in tb}:
        hist = {m.step: m.value for m in client.get_metric_history(run.info.run_id, tag.replace("@", "_"))}
        assert hist == pytest.approx({s: v for (t, s), v in tb.items() if t == tag}, rel=1e-6), tag

    # W&B offline: the run's .wandb file holds the config, every history row and the final status
    (wfile,) = (out / "wandb").glob("offline-run-*/run-*.wandb")
    history, config, summary = {}, {}, {}
    for rec in _wandb_records(wfile):
        kind = rec.WhichOneof("record_type")
        if kind == "history":
            items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.history.item}
            step = rec.history.step.num
            history.update({(k, step): v for k, v in items.items() if not k.startswith("_")})
        elif kind == "config":
            config.update({i.key: json.loads(i.value_json) for i in rec.config.update})
        elif kind == "summary":
            summary.update({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.summary.update})
        elif kind == "run":
            config.update({i.key: json.loads(i.value_json) for i in rec.run.config.update})
    assert history.keys() == tb.keys()
    assert all(history[k] == pytest.approx(tb[k], rel=1e-6) for k in tb)
    flat = flat_hparams(yaml.safe_load((out / "config.yaml").read_text()))
    assert {k: (v.get("value") if isinstance(v, dict) else v) for k, v in config.items() if k in flat} == flat
    assert summary.get("status") == "completed" and wandb.__version__


def test_unknown_or_missing_tracker_is_one_line(tmp_path, cache):
    from tests.helpers import assert_bad_input, run_inproc

    r = run_inproc("train", "tiny", "--set", "train.track=[tensorbord]", "--out", str(tmp_path / "r"), cache=cache)
    assert_bad_input(r, "unknown train.track entry 'tensorbord'", "did you mean 'tensorboard'")


def _free_port() -> int:
    """A loopback port with nothing listening on it (bound, then closed)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_mlflow_server_is_one_warning_and_the_run_finishes(tmp_path, cache, monkeypatch):
    pytest.importorskip("mlflow.tracking")
    from tests.helpers import run_inproc

    url = f"http://127.0.0.1:{_free_port()}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", url)
    for var in ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_TIMEOUT"):
        monkeypatch.delenv(var, raising=False)  # put back after the test whatever the tracker sets
    out = tmp_path / "run"
    t0 = time.monotonic()
    r = run_inproc("train", "tiny", "--set", "train.steps=4", "--set", "train.eval_every=2", "--set",
                   "model.context=16", "--set", "train.track=[tensorboard, mlflow]", "--out", str(out), cache=cache)
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    lines = [ln for ln in r.stderr.replace(str(tmp_path), "TMP").splitlines() if "mlflow" in ln.lower()]
    assert len(lines) == 1 and lines[0].startswith("warning: train.track mlflow:") and url in lines[0], r.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["step"] == 4
    assert {t for t, _, _ in read_scalars(out / "tb")} >= {"train/loss", "val/bpb"}  # the other tracker logged
    assert not (out / "mlruns").exists()

    # train.track_required: the same server is an error before anything is written
    out2 = tmp_path / "required"
    r = run_inproc("train", "tiny", "--set", "train.track=[mlflow]", "--set", "train.track_required=true",
                   "--out", str(out2), cache=cache)
    from tests.helpers import assert_bad_input

    assert_bad_input(r, "train.track mlflow", url, "train.track_required")
    assert not out2.exists()
    assert time.monotonic() - t0 < 120  # the probe is bounded (PROBE_TIMEOUT_S), not MLflow's retries


def test_probe_keeps_a_listening_server_and_drops_a_silent_one(monkeypatch):
    import socket

    from normlab.errors import NormlabError
    from normlab.train.tracking import probe_trackers, tracker_server

    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{srv.getsockname()[1]}/")
        assert probe_trackers(["tensorboard", "mlflow"], timeout=2) == ["tensorboard", "mlflow"]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{_free_port()}")
    assert probe_trackers(["tensorboard", "mlflow"], timeout=2) == ["tensorboard"]
    with pytest.raises(NormlabError, match="track_required"):
        probe_trackers(["mlflow"], required=True, timeout=2)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///mlflow.db")  # a local store: nothing to probe
    assert tracker_server("mlflow") is None
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert tracker_server("wandb") is None


def test_a_tracker_failing_mid_run_is_dropped_with_one_warning(tmp_path, capsys):
    from normlab.train.tracking import Tracker

    calls = []

    class Flaky:
        def log(self, record):
            calls.append(record["step"])
            raise ConnectionError("connection refused\n\x1b[31mred")

        def close(self, status):
            calls.append(status)

    tracker = Tracker(tmp_path / "tb", {}, track=[])
    tracker.trackers.append(("mlflow", Flaky()))
    for step in (1, 2, 3):
        tracker.log({"step": step, "loss": 1.0})
    tracker.close("completed")
    err = capsys.readouterr().err.splitlines()
    assert calls == [1]  # dropped after its first failure: no further log, no close
    assert err == ["warning: train.track mlflow: failed while logging (connection refused); training goes on "
                   "without mlflow"]


def test_a_name_lookup_that_hangs_is_bounded_by_the_probe_timeout(monkeypatch):
    """``getaddrinfo`` has no timeout of its own (a dead DNS server holds it for the resolver's retries): the probe
    gives up on it at its deadline with one reason naming the host, and still connects through a lookup that
    answers."""
    import socket
    import threading

    from normlab.errors import NormlabError
    from normlab.train.tracking import probe_trackers, unreachable

    release = threading.Event()
    real = socket.getaddrinfo

    def slow(host, *a, **kw):
        if host == "tracker.example":
            release.wait(60)  # a resolver that does not answer
            raise socket.gaierror(-3, "Temporary failure in name resolution")
        return real(host, *a, **kw)

    monkeypatch.setattr(socket, "getaddrinfo", slow)
    try:
        t0 = time.monotonic()
        assert unreachable("http://tracker.example:5000", timeout=0.5) == \
            "looking up tracker.example took longer than 0.5 s"
        monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://tracker.example:5000/")
        with pytest.raises(NormlabError, match=r"does not answer \(looking up tracker.example took longer than "
                                               r"0.5 s\); train.track_required is true"):
            probe_trackers(["mlflow"], required=True, timeout=0.5)
        assert time.monotonic() - t0 < 10
    finally:
        release.set()
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        assert unreachable(f"http://localhost:{srv.getsockname()[1]}/", timeout=5) is None  # through the lookup
    assert unreachable(f"http://127.0.0.1:{_free_port()}", timeout=5) == "Connection refused"
