"""normlab.experiments.sequential: a sweep run in rounds until decided, interrupted in a later round (a real SIGINT
to ``normlab compare --until-decided``), resumes and finishes when the same command is run again -- also when
the interrupted rounds are a replication's (``--replicate-on``)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import yaml

from normlab.errors import NormlabError
from normlab.experiments.store import Store
from normlab.experiments.sweep import slug
from tests.helpers import cli_env, normlab

SET = {"train.steps": 40, "train.eval_every": 20, "train.eval_batches": 2, "train.log_every": 5,
       "train.checkpoint_every": 5, "diag.every": 20}
SPEC = {"name": "ud", "base": "tiny", "set": SET, "seeds": [0, 1], "primary": "final_loss",
        "variants": [{"name": "LN", "set": {"model.norm": "layernorm"}},
                     {"name": "RMS", "set": {"model.norm": "rmsnorm"}}]}
ARGS = ["--until-decided", "--max-seeds", "4", "--workers", "1", "--json"]
OTHER = "synthetic:markov?order=2&alphabet=8&length=200000&concentration=0.2&seed=0"  # tiny's chain, shorter


def _interrupt_when(cmd: list[str], cache: Path, ready: Callable[[list[str]], bool]) -> tuple[int, str, str]:
    """Start ``cmd``; once ``ready(stderr lines so far)``, send SIGINT (what Ctrl-C sends); bounded in time.
    Returns (exit status, stdout, stderr)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env(cache))
    err: list[str] = []
    reader = threading.Thread(target=lambda: err.extend(proc.stderr), daemon=True)
    reader.start()
    try:
        deadline = time.time() + 400  # a loaded machine takes a few seconds per worker start
        while time.time() < deadline and proc.poll() is None and not ready(err):
            time.sleep(0.05)
        assert proc.poll() is None, "".join(err)[-3000:]
        proc.send_signal(signal.SIGINT)
        out = proc.communicate(timeout=120)[0]
    finally:
        proc.kill()
    reader.join(timeout=10)
    return proc.returncode, out, "".join(err)


def _checkpointed(run_dir: Path) -> bool:
    return (run_dir / "checkpoints").is_dir() and any((run_dir / "checkpoints").iterdir())


def _all_completed(sweep_dir: Path, n: int) -> None:
    rows = Store(sweep_dir / "results.sqlite").runs()
    assert len(rows) == n and {r["status"] for r in rows} == {"completed"}, [(r["run_id"], r["status"]) for r in rows]


def test_an_until_decided_sweep_interrupted_in_round_two_resumes_to_its_decision(tmp_path, cache):
    f = tmp_path / "ud.yaml"
    f.write_text(yaml.safe_dump(SPEC, sort_keys=False))
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "normlab.cli", "compare", str(f), "--out", str(out), *ARGS]
    rc, stdout, stderr = _interrupt_when(cmd, cache, lambda err: any("round 2/" in ln for ln in err)
                                         and _checkpointed(out / "runs" / "ln-s2"))
    assert rc == 130 and json.loads(stdout)["status"] == "interrupted", stderr[-3000:]
    cut = Store(out / "results.sqlite").get("ln-s2")
    assert cut["status"] == "interrupted" and 0 < cut["step"] < 40
    again = normlab("compare", str(f), "--out", str(out), *ARGS, cache=cache)
    assert again.returncode == 0, again.stderr[-3000:]  # was: "4 runs, 0 to run ... did not finish", exit 1
    res = json.loads(again.stdout)
    assert res["status"] == "completed" and res["until_decided"]["looks"] == 2 == len(res["sequential"]["looks"])
    assert res["until_decided"]["stopped"] in ("decided", "undecidable", "max_seeds")  # was: "failed", looks 0
    _all_completed(out, 8)
    row = Store(out / "results.sqlite").get("ln-s2")
    assert row["step"] == 40 and row["train_calls"] == 2  # resumed from its checkpoint, not trained again
    assert set(res["trained"]) == {"ln-s2", "ln-s3", "rms-s2", "rms-s3"}  # round 1 is not trained again


def test_a_replication_interrupted_in_its_round_two_resumes_to_its_decision(tmp_path, cache):
    f = tmp_path / "ud.yaml"
    f.write_text(yaml.safe_dump(SPEC, sort_keys=False))
    out = tmp_path / "out"
    rep = out / "replication" / slug(OTHER)
    cmd = [sys.executable, "-m", "normlab.cli", "compare", str(f), "--out", str(out), "--replicate-on", OTHER, *ARGS]

    def round_two_of_the_replication(err: list[str]) -> bool:  # its seeds are its own block: read them from its store
        if not (rep / "results.sqlite").is_file():
            return False
        try:
            rows = Store(rep / "results.sqlite").runs()
        except NormlabError:  # being created
            return False
        seeds = sorted({r["seed"] for r in rows})
        return len(seeds) > 2 and _checkpointed(rep / "runs" / next(r["run_id"] for r in rows if r["seed"] == seeds[2]))

    rc, stdout, stderr = _interrupt_when(cmd, cache, round_two_of_the_replication)
    assert rc == 130 and json.loads(stdout)["status"] == "interrupted", stderr[-3000:]
    cut = [r for r in Store(rep / "results.sqlite").runs() if r["status"] != "completed"]
    assert cut and any(r["status"] == "interrupted" and r["step"] > 0 for r in cut)
    again = normlab("compare", str(f), "--out", str(out), "--replicate-on", OTHER, *ARGS, cache=cache)
    assert again.returncode == 0, again.stderr[-3000:]
    (r,) = json.loads(again.stdout)["replications"]
    assert r["status"] == "completed" and r["sequential"]["stopped"] in ("decided", "undecidable", "max_seeds")
    assert r["sequential"]["looks"] == 2
    _all_completed(rep, 8)
    for row in cut:  # the interrupted one resumed, the pending ones trained once
        got = Store(rep / "results.sqlite").get(row["run_id"])
        assert got["step"] == 40 and got["train_calls"] == (2 if row["status"] == "interrupted" else 1)
