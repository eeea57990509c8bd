"""``normlab runs DIR`` on a folder of single runs (issue 29 item 4): each row checked against the run's own
``summary.json`` / ``metrics.jsonl`` and the config hash recomputed from ``config.yaml``."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

from normlab.config import config_from_dict
from tests.helpers import assert_bad_input, run_inproc


def test_runs_lists_single_runs_under_a_folder(tmp_path, cache):
    root = tmp_path / "runs"
    fast = ["--set", "train.steps=2", "--set", "train.eval_every=2", "--set", "train.checkpoint_every=2",
            "--set", "model.context=16", "--set", "train.log_every=1"]
    run_inproc("train", "tiny", *fast, "--out", str(root / "a"), cache=cache, check=True)
    run_inproc("train", "tiny", *fast, "--set", "model.norm=rmsnorm", "--out", str(root / "group" / "b"),
               cache=cache, check=True)
    shutil.copytree(root / "a", root / "c")
    expected_c = json.loads((root / "c" / "summary.json").read_text())
    (root / "c" / "summary.json").unlink()  # as a run still training (or killed) looks
    (root / "sweep").mkdir()
    (root / "sweep" / "results.sqlite").write_bytes(b"")

    r = run_inproc("runs", str(root), "--format", "json", cache=cache, check=True)
    out = json.loads(r.stdout)
    assert out == json.loads(run_inproc("runs", str(root), "--json", cache=cache, check=True).stdout)
    rows = {row["path"]: row for row in out["runs"]}
    assert sorted(rows) == [str(root / "a"), str(root / "c"), str(root / "group" / "b")]
    assert out["sweeps"] == [str(root / "sweep")]
    for name in ("a", "group/b"):
        s = json.loads((root / name / "summary.json").read_text())
        row = rows[str(root / name)]
        assert (row["status"], row["step"], row["steps"], row["val_bpb"], row["config_hash"]) == (
            "completed", s["step"], s["steps"], s["val_bpb"], s["config_hash"])
    assert rows[str(root / "group" / "b")]["norm"] == "rmsnorm"
    c = rows[str(root / "c")]
    last = json.loads((root / "c" / "metrics.jsonl").read_text().splitlines()[-1])["step"]
    assert c["status"] == "unfinished" and c["step"] == last == 2 and c["val_bpb"] is None
    # one config hash everywhere: `normlab config` with the same arguments, the summary, and (without a summary)
    # the newest checkpoint agree; config.yaml holds the machine's resolved device / precision / compile instead of
    # `auto`, so its own hash is another one
    declared = json.loads(run_inproc("config", "tiny", *fast, "--json", cache=cache, check=True).stdout)["config_hash"]
    assert c["config_hash"] == expected_c["config_hash"] == rows[str(root / "a")]["config_hash"] == declared
    resolved = config_from_dict(yaml.safe_load((root / "c" / "config.yaml").read_text()))
    assert resolved.device != "auto" and resolved.hash() != declared

    table = run_inproc("runs", str(root), cache=cache, check=True).stdout
    assert "unfinished" in table and "completed" in table and f"normlab runs {root / 'sweep'}" in table


def test_run_folder_summary_runs_and_config_show_one_hash(tmp_path, cache, monkeypatch):
    """The default run folder ``runs/<config>-<hash8>`` and ``normlab runs`` show the hash ``normlab config`` prints."""
    monkeypatch.chdir(tmp_path)
    fast = ["--set", "train.steps=2", "--set", "train.eval_every=2", "--set", "model.context=16"]
    run_inproc("train", "tiny", *fast, cache=cache, check=True)
    (folder,) = (tmp_path / "runs").iterdir()
    declared = json.loads(run_inproc("config", "tiny", *fast, "--json", cache=cache, check=True).stdout)["config_hash"]
    assert folder.name == f"tiny-{declared[:8]}"
    assert json.loads((folder / "summary.json").read_text())["config_hash"] == declared
    (row,) = json.loads(run_inproc("runs", "runs", "--json", cache=cache, check=True).stdout)["runs"]
    assert row["config_hash"] == declared


def test_runs_on_a_folder_without_runs_is_one_line(tmp_path, cache):
    r = run_inproc("runs", str(tmp_path), cache=cache)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "holds no normlab runs" in r.stderr


# ------------------------------------------------------------------ unsafe or malformed files (a row, not a hang)
def _fake_run(d, summary=None):
    """A run directory without training: tiny's config.yaml and, when given, ``summary`` as summary.json."""
    from normlab.config import load_config

    d.mkdir(parents=True)
    (d / "config.yaml").write_text(yaml.safe_dump(load_config("tiny").to_dict(), sort_keys=False))
    if summary is not None:
        (d / "summary.json").write_text(json.dumps(summary))
    return d


GOOD = {"status": "completed", "step": 2, "steps": 2, "val_bpb": 1.5, "best_val_bpb": 1.25, "config_hash": "abc"}


def test_a_fifo_summary_is_a_malformed_row_and_every_format_returns(tmp_path, cache):
    import os
    import subprocess

    from tests.helpers import normlab

    root = tmp_path / "runs"
    _fake_run(root / "good", GOOD)
    os.mkfifo(_fake_run(root / "pipe") / "summary.json")  # no writer: reading it would block forever
    reason = f"summary {root / 'pipe' / 'summary.json'} is a FIFO (named pipe), not a regular file"
    for fmt in ("json", "csv", "table"):
        try:
            r = normlab("runs", str(root), "--format", fmt, cache=cache, timeout=120)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"normlab runs --format {fmt} hung on a FIFO summary.json") from None
        assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
        assert reason in r.stdout and "malformed" in r.stdout
        if fmt == "json":
            rows = {row["path"]: row for row in json.loads(r.stdout)["runs"]}
            assert rows[str(root / "pipe")]["status"] == "malformed"
            assert rows[str(root / "pipe")]["error"].startswith(reason)
            good = rows[str(root / "good")]
            assert (good["status"], good["val_bpb"], good["best_val_bpb"], good["error"]) == ("completed", 1.5, 1.25,
                                                                                            None)
    try:
        r = normlab("report", str(root / "pipe"), cache=cache, timeout=120)
    except subprocess.TimeoutExpired:
        raise AssertionError("normlab report hung on a FIFO summary.json") from None
    assert_bad_input(r, reason)


WRONG_TYPES = [  # (summary key, value, the type the message names)
    ("val_bpb", "x", "a number"), ("best_val_bpb", [1.0], "a number"), ("step", True, "an integer"),
    ("steps", 2.5, "an integer"), ("status", 3, "text"),
]


@pytest.mark.parametrize("key,value,want", WRONG_TYPES, ids=[k for k, _, _ in WRONG_TYPES])
def test_a_summary_value_of_the_wrong_type_is_a_malformed_row(tmp_path, cache, key, value, want):
    root = tmp_path / "runs"
    _fake_run(root / "bad", {**GOOD, key: value})
    _fake_run(root / "good", GOOD)
    out = json.loads(run_inproc("runs", str(root), "--json", cache=cache, check=True).stdout)
    rows = {row["path"]: row for row in out["runs"]}
    bad = rows[str(root / "bad")]
    assert bad["status"] == "malformed" and bad["val_bpb"] is None
    assert bad["error"] == (f"summary {root / 'bad' / 'summary.json'}: \"{key}\" is {json.dumps(value)}, not {want} "
                            "(or null); the file is damaged or was not written by normlab")
    assert rows[str(root / "good")]["status"] == "completed"
    table = run_inproc("runs", str(root), cache=cache, check=True).stdout
    assert f"malformed bad: {bad['error']}" in " ".join(table.split())


def test_runs_on_a_file_says_it_is_a_file(tmp_path, cache):
    f = tmp_path / "summary.json"
    f.write_text("{}")
    assert_bad_input(run_inproc("runs", str(f), cache=cache), f"{f} is a file, not a directory")
    assert_bad_input(run_inproc("runs", str(tmp_path / "nope"), cache=cache), "does not exist")


def test_a_duplicate_key_in_a_runs_config_is_a_malformed_row(tmp_path, cache):
    root = tmp_path / "runs"
    run = _fake_run(root / "dup", GOOD)
    text = (run / "config.yaml").read_text()
    (run / "config.yaml").write_text(text + "seed: 3\n")  # tiny's config.yaml already has a top-level seed
    first = [i + 1 for i, line in enumerate(text.splitlines()) if line.startswith("seed:")][0]
    last = len(text.splitlines()) + 1
    (row,) = json.loads(run_inproc("runs", str(root), "--json", cache=cache, check=True).stdout)["runs"]
    assert row["status"] == "malformed"
    assert f"duplicate key 'seed' at lines {first} and {last}" in row["error"]


def test_control_characters_from_files_and_directory_names_are_escaped_in_the_table(tmp_path, cache):
    """A summary.json status and a run directory's name holding ESC and a newline: the table shows them as escapes
    (no raw ESC reaches the terminal, each row stays on its own line); --json keeps the exact strings."""
    root = tmp_path / "runs"
    _fake_run(root / "x\x1b[2J\ny", {**GOOD, "status": "done\x1b[31m\nFAKE"})
    table = run_inproc("runs", str(root), cache=cache, check=True).stdout
    assert "\x1b" not in table
    assert "x\\x1b[2J\\ny" in table and "done\\x1b[31m\\nFAKE" in " ".join(table.split()).replace(" ", "")
    out = json.loads(run_inproc("runs", str(root), "--json", cache=cache, check=True).stdout)
    assert out["runs"][0]["status"] == "done\x1b[31m\nFAKE" and out["runs"][0]["path"] == str(root / "x\x1b[2J\ny")


def test_runs_flags_a_run_that_did_not_learn_beside_its_number(tmp_path, cache):
    """A run whose final val bits/byte is at or above its summary's unigram level minus 0.1 is marked in every
    format, single runs and a sweep's runs alike (normlab.stats.learning's rule; 2.75 vs 2.8 - 0.1 is flagged,
    2.65 is not, a run without a level is neither)."""
    import csv
    import io

    from tests.helpers import make_sweep

    root = tmp_path / "runs"
    _fake_run(root / "flat", {**GOOD, "val_bpb": 2.75, "unigram_bpb": 2.8})
    _fake_run(root / "learned", {**GOOD, "val_bpb": 2.65, "unigram_bpb": 2.8})
    _fake_run(root / "nolevel", GOOD)
    rows = {r["path"]: r for r in json.loads(run_inproc("runs", str(root), "--json", cache=cache, check=True)
                                             .stdout)["runs"]}
    assert [rows[str(root / n)]["did_not_learn"] for n in ("flat", "learned", "nolevel")] == [True, False, None]
    assert rows[str(root / "flat")]["unigram_bpb"] == 2.8
    table = run_inproc("runs", str(root), cache=cache, check=True).stdout
    flagged = [ln for ln in table.splitlines() if "did not learn" in ln]
    assert len(flagged) == 1 and "flat" in flagged[0] and "2.7500 (did not learn: unigram 2.8000)" in flagged[0]
    got = {r["path"]: r["did_not_learn"] for r in csv.DictReader(io.StringIO(
        run_inproc("runs", str(root), "--format", "csv", cache=cache, check=True).stdout))}
    assert got == {str(root / "flat"): "True", str(root / "learned"): "False", str(root / "nolevel"): ""}

    s = make_sweep(tmp_path / "s", [("A", 0, "completed", 2.75), ("B", 0, "completed", 2.65)])
    for rid in ("r0", "r1"):
        (s / "runs" / rid).mkdir(parents=True)
        (s / "runs" / rid / "summary.json").write_text(json.dumps({"status": "completed", "unigram_bpb": 2.8}))
    srows = {r["run_id"]: r for r in json.loads(run_inproc("runs", str(s), "--json", cache=cache, check=True)
                                                .stdout)["runs"]}
    assert (srows["r0"]["did_not_learn"], srows["r1"]["did_not_learn"]) == (True, False)
    table = run_inproc("runs", str(s), cache=cache, check=True).stdout
    assert [("r0" in ln) for ln in table.splitlines() if "did not learn" in ln] == [True]


def test_runs_without_a_directory_lists_runs_here(tmp_path, cache, monkeypatch):
    """``normlab runs`` alone reads ``runs/`` (where train and compare write); without one it says so in one line."""
    monkeypatch.chdir(tmp_path)
    assert_bad_input(run_inproc("runs", cache=cache), "no runs/ folder", "normlab runs DIR")
    _fake_run(tmp_path / "runs" / "a", GOOD)
    assert (json.loads(run_inproc("runs", "--json", cache=cache, check=True).stdout)
            == json.loads(run_inproc("runs", "runs", "--json", cache=cache, check=True).stdout))
    assert json.loads(run_inproc("runs", "--json", cache=cache, check=True).stdout)["dir"] == "runs"
