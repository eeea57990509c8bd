"""normlab.experiments.store: a corrupted results store is one line; the sweep never dies on a missing metric."""

from __future__ import annotations


import pytest

from tests.helpers import HOSTILE, assert_bad_input, make_sweep, run_inproc

pytestmark = pytest.mark.usefixtures("one_thread")


NO_LR = "UPDATE runs SET config_json=json_remove(config_json, '$.train.lr')"
CORRUPT_STORE = [  # (SQL, command, fragments)
    ("UPDATE runs SET config_json='{bad'", "report", ["results.sqlite", "is damaged", "config_json"]),
    (NO_LR, "report", ["is damaged", "run 'r0'", "no numeric train.lr"]),  # was KeyError
    (NO_LR, "advise", ["is damaged", "run 'r0'", "no numeric train.lr"]),
    ("UPDATE runs SET config_json=replace(config_json, '\"seed\": 0', "
     "'\"seed\": ' || replace(hex(zeroblob(2500)), '0', '1') || '1')", "report",
     ["results.sqlite", "is damaged", "5,001 digits"]),
    ("UPDATE curves SET value='abc'", "report", ["results.sqlite", "is damaged", "'abc'"]),
]


@pytest.mark.parametrize("sql,cmd,fragments", CORRUPT_STORE, ids=[f"{c}: {q[:30]}" for q, c, _ in CORRUPT_STORE])
def test_corrupted_store_is_one_line(sql, cmd, fragments, tmp_path, cache):
    import sqlite3

    s = make_sweep(tmp_path / "s", HOSTILE[:2])
    con = sqlite3.connect(s / "results.sqlite")
    con.execute(sql)
    con.commit()
    con.close()
    argv = [cmd, str(s)] if cmd == "report" else ["advise", "--from", str(s), "--no-write"]
    assert_bad_input(run_inproc(*argv, cache=cache), *fragments)
    assert not (s / "report.md").exists()


def test_sweep_never_dies_on_a_missing_metric(tmp_path):
    """Issue row 1 in a sweep: a completed summary without val_bpb is recorded as failed (so the next compare
    re-runs it), the coordinator's progress line does not crash on it, and the worker does not treat it as done."""
    from normlab.experiments.progress import describe_row
    from normlab.experiments.store import FINAL, Store
    from normlab.experiments.worker import record

    s = make_sweep(tmp_path / "s", HOSTILE[:1])
    (s / "runs" / "r0").mkdir(parents=True)
    record(Store(s / "results.sqlite"), s, "r0", {"status": "completed", "step": 8, "steps": 8, "val_bpb": None},
           peak_mem_mb=1.0)
    row = Store(s / "results.sqlite").get("r0")
    assert row["status"] == "failed" and row["status"] not in FINAL and "val_bpb" in row["error"]
    assert "n/a" in describe_row({**row, "status": "completed"})


DAMAGED_ROW = [  # (SQL damaging run r1 only, the reason normlab runs shows for it)
    ("UPDATE runs SET config_json='{bad' WHERE run_id='r1'", "has invalid JSON in config_json"),
    ("UPDATE runs SET val_bpb='x' WHERE run_id='r1'", "column val_bpb holds 'x', not a number"),
    ("UPDATE runs SET axes_json='" + "[" * 100_000 + "' WHERE run_id='r1'", "has invalid JSON in axes_json"),
]


@pytest.mark.parametrize("sql,reason", DAMAGED_ROW, ids=["config_json", "val_bpb", "deep axes_json"])
def test_runs_marks_a_damaged_row_malformed_and_goes_on(sql, reason, tmp_path, cache):
    """``normlab runs SWEEP`` (``Store.runs(damaged="mark")``): the damaged row is listed as ``malformed`` with the
    one-line reason, every other row as stored; the report, which must compute on the rows, still refuses."""
    import json
    import sqlite3

    s = make_sweep(tmp_path / "s", HOSTILE[:3])
    con = sqlite3.connect(s / "results.sqlite")
    con.execute(sql)
    con.commit()
    con.close()
    rows = {r["run_id"]: r for r in json.loads(run_inproc("runs", str(s), "--json", cache=cache, check=True).stdout)
            ["runs"]}
    assert rows["r1"]["status"] == "malformed" and reason in rows["r1"]["error"] and rows["r1"]["val_bpb"] is None
    assert [(rows[r]["status"], rows[r]["val_bpb"]) for r in ("r0", "r2")] == [("completed", 1.5), ("completed", 1.7)]
    for fmt in ("table", "csv"):
        out = run_inproc("runs", str(s), "--format", fmt, cache=cache, check=True).stdout
        assert "malformed" in out and reason in " ".join(out.split())
    assert_bad_input(run_inproc("report", str(s), cache=cache), reason)


def test_a_fifo_results_store_is_one_line(tmp_path, cache):
    import os

    from normlab.errors import NormlabError
    from normlab.experiments.store import Store

    os.mkfifo(tmp_path / "results.sqlite")
    with pytest.raises(NormlabError, match="is not a regular file; normlab reads only regular files"):
        Store(tmp_path / "results.sqlite").runs()
    assert_bad_input(run_inproc("runs", str(tmp_path), cache=cache), "results.sqlite is not a regular file")


def test_null_curve_values_are_left_out_of_the_report_not_a_traceback(tmp_path, cache):
    """A run whose logged metrics hold null (NaN is stored as null) was a TypeError in the report's figures and
    instability signals; the points are left out, the rest of the curve and the ranking are as stored."""
    import json
    import sqlite3

    s = make_sweep(tmp_path / "s", HOSTILE[:3])
    con = sqlite3.connect(s / "results.sqlite")
    con.executemany("INSERT INTO curves (run_id, step, key, value) VALUES (?, ?, ?, NULL)",
                    [("r0", 6, "val_bpb"), ("r0", 6, "loss"), ("r0", 6, "diag/attn_logit_max/0"),
                     ("r0", 8, "diag/output_lse")])
    con.commit()
    con.close()
    from normlab.experiments.store import Store

    assert (6, None) in Store(s / "results.sqlite").curves("r0")["r0"]["val_bpb"]  # as stored
    assert Store(s / "results.sqlite").curves("r0", finite=True)["r0"]["val_bpb"] == [(4, 2.0), (8, 1.5)]
    rep = run_inproc("report", str(s), "--json", cache=cache)
    assert rep.returncode == 0 and "Traceback" not in rep.stderr, rep.stderr
    assert (s / "report.md").is_file() and json.loads(rep.stdout)
    adv = run_inproc("advise", "--from", str(s), "--no-write", cache=cache)
    assert adv.returncode == 0 and "Traceback" not in adv.stderr, adv.stderr
