"""normlab.experiments.store: a corrupted results store is one line; the sweep never dies on a missing metric."""

from __future__ import annotations


import pytest

from tests.helpers import HOSTILE, assert_bad_input, make_sweep, run_inproc

pytestmark = pytest.mark.usefixtures("one_thread")


CORRUPT_STORE = [  # (SQL, command, fragments)
    ("UPDATE runs SET config_json='{bad'", "runs", ["results.sqlite", "is damaged", "config_json"]),
    ("UPDATE runs SET config_json='{bad'", "report", ["results.sqlite", "is damaged", "config_json"]),
    ("UPDATE curves SET value='abc'", "report", ["results.sqlite", "is damaged", "'abc'"]),
    ("UPDATE runs SET val_bpb='x'", "runs", ["results.sqlite", "val_bpb", "not a number"]),
]


@pytest.mark.parametrize("sql,cmd,fragments", CORRUPT_STORE, ids=[f"{c}: {q[:30]}" for q, c, _ in CORRUPT_STORE])
def test_corrupted_store_is_one_line(sql, cmd, fragments, tmp_path, cache):
    import sqlite3

    s = make_sweep(tmp_path / "s", HOSTILE[:2])
    con = sqlite3.connect(s / "results.sqlite")
    con.execute(sql)
    con.commit()
    con.close()
    assert_bad_input(run_inproc(cmd, str(s), cache=cache), *fragments)
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
