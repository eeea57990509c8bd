"""The one scheduling loop (normlab.experiments.scheduling.drive) against a scripted executor: the finish step, the
log line, the stop rule and the one signal handler, for an executor in another process and one in this process."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from normlab.errors import EXIT_FAILED, EXIT_INTERRUPTED
from normlab.experiments.progress import stopping_message
from normlab.experiments.scheduling import drive
from normlab.experiments.store import Store


def _store(tmp_path: Path, ids: list[str]) -> Store:
    store = Store(tmp_path / "results.sqlite")
    store.create("s", "h")
    store.register([{"run_id": r, "position": i, "variant": "v", "seed": i, "config_hash": "c", "axes": {},
                     "overrides": {}, "config": {}} for i, r in enumerate(ids)])
    return store


class Scripted:
    """Finishes each started run on the next poll with the exit status ``script[run_id]`` (None: records it
    completed itself, as a trainer does); ``on_start[run_id]``: the signals this process receives during the start."""

    tag, exited = "", "worker exited"

    def __init__(self, tmp_path, store, script, *, in_process=False, slots=2, on_start=None):
        self.sweep_dir, self.store, self.script = tmp_path, store, script
        self.in_process, self.announces, self.slots = in_process, not in_process, slots
        self.on_start = on_start or {}
        self.running: list[str] = []
        self.interrupts: list[int] = []
        self.closed = False

    def start(self, job, on_signal):
        (run_id,) = job
        self.store.start(run_id, calls_trainer=True)
        self.running.append(run_id)
        for signum in self.on_start.get(run_id, []):
            os.kill(os.getpid(), signum)
        return True

    def finished(self):
        out = []
        for r in self.running:
            rc = self.script[r]
            if rc is None:
                self.store.update(r, status="completed", val_bpb=4.0, step=1)
            out.append((r, 0 if rc is None else rc))
        self.running = []
        return out

    def in_flight(self):
        return len(self.running)

    def interrupt(self, signals):
        self.interrupts.append(signals)

    def wait(self):
        pass

    def close(self):
        self.closed = True

    def log_of(self, run_id):
        return self.sweep_dir / "logs" / f"{run_id}.log"

    def progress_line(self, done):
        return ""


def test_the_finish_step_records_what_the_trainer_left_open(tmp_path):
    ids = ["a", "b", "c"]
    store = _store(tmp_path, ids)
    ex = Scripted(tmp_path, store, {"a": None, "b": EXIT_FAILED, "c": EXIT_INTERRUPTED})
    lines, trained = [], []
    assert drive(ex, store, [[r] for r in ids], lines.append, trained) == "completed"  # another process: goes on
    rows = {r["run_id"]: r for r in store.runs()}
    assert trained == ids and ex.closed
    assert rows["a"]["status"] == "completed"
    assert rows["b"]["status"] == "failed" and rows["b"]["error"] == "worker exited with status 1; see logs/b.log"
    assert rows["c"]["status"] == "interrupted"
    assert rows["c"]["error"] == "worker exited with status 130; see logs/c.log"
    assert lines[0].startswith("[1/3] a: completed, sampled val 4.0000 bits/byte")
    assert lines[1] == f"[2/3] b: failed: worker exited with status 1; see logs/b.log (log: {tmp_path / 'logs/b.log'})"
    assert lines[2] == "[–/3] c: interrupted at step 0 (resumable)"  # not counted as done: it resumes later


class Counting(Scripted):
    """Says how many runs the loop counts as done in each progress line."""

    def progress_line(self, done):
        return f"; {done} done"


def test_an_interrupted_run_is_not_counted_as_done(tmp_path):
    """After Ctrl-C (exit 130) the run's line and the sweep's count leave it out (it resumes on the next run of
    the command); completed and failed runs are counted."""
    ids = ["a", "b", "c", "d"]
    store = _store(tmp_path, ids)
    ex = Counting(tmp_path, store, {"a": None, "b": EXIT_INTERRUPTED, "c": EXIT_FAILED, "d": None}, slots=1)
    lines: list[str] = []
    drive(ex, store, [[r] for r in ids], lines.append, [])
    assert [ln.split("]")[0] + "]" for ln in lines] == ["[1/4]", "[–/4]", "[2/4]", "[3/4]"]
    assert [ln.rsplit("; ", 1)[1] for ln in lines] == ["1 done", "1 done", "2 done", "3 done"]


def test_the_log_line_flags_a_run_that_did_not_learn(tmp_path):
    """The ``[k/N] run: completed, sampled val L bits/byte`` line says "did not learn" beside L when L is at or above
    the unigram level its summary.json records minus 0.1 (the scripted runs end at 4.0), and nothing when it is below
    or no level was recorded."""
    import json

    ids = ["at", "below", "none"]
    store = _store(tmp_path, ids)
    for run_id, level in (("at", 4.05), ("below", 4.2)):
        (tmp_path / "runs" / run_id).mkdir(parents=True)
        (tmp_path / "runs" / run_id / "summary.json").write_text(json.dumps({"status": "completed",
                                                                             "unigram_bpb": level}))
    lines: list[str] = []
    drive(Scripted(tmp_path, store, dict.fromkeys(ids), slots=1), store, [[r] for r in ids], lines.append, [])
    assert lines[0].startswith("[1/3] at: completed, sampled val 4.0000 bits/byte -- did not learn (at or above the "
                               "unigram 4.050 - 0.1 bits/byte), "), lines[0]
    assert lines[1].startswith("[2/3] below: completed, sampled val 4.0000 bits/byte, ") and "learn" not in lines[1]
    assert lines[2].startswith("[3/3] none: completed, sampled val 4.0000 bits/byte, ") and "learn" not in lines[2]


def test_a_run_interrupted_in_this_process_stops_the_sweep(tmp_path):
    ids = ["a", "b", "c"]
    store = _store(tmp_path, ids)
    ex = Scripted(tmp_path, store, {"a": None, "b": EXIT_INTERRUPTED, "c": None}, in_process=True, slots=1)
    trained: list[str] = []
    assert drive(ex, store, [[r] for r in ids], lambda s: None, trained) == "interrupted"
    assert trained == ["a", "b"] and store.get("c")["status"] == "pending"


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_starts_nothing_more_and_is_forwarded(tmp_path, signum):
    """The first signal: the stopping message once (with the runs in flight), the executor told; a second one is
    counted and forwarded, never raised; no job starts after it; the old handler is back afterwards."""
    ids = ["a", "b", "c", "d"]
    store = _store(tmp_path, ids)
    ex = Scripted(tmp_path, store, dict.fromkeys(ids), slots=2, on_start={"a": [signum, signum]})
    lines, trained = [], []
    before = signal.getsignal(signum)
    assert drive(ex, store, [[r] for r in ids], lines.append, trained) == "interrupted"
    assert signal.getsignal(signum) is before
    assert trained == ["a"]  # the signal came during a's start: b never started
    assert ex.interrupts == [1, 2] and lines.count(stopping_message(1)) == 1
    assert [store.get(r)["status"] for r in ids] == ["completed", "pending", "pending", "pending"]
