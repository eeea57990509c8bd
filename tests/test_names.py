"""One name for bits per byte (issue 12 item 9, normlab.names): outputs write ``bpb`` / ``val_bpb`` / ``val/bpb``,
and files written with the old names (``bits_per_byte``, the store column ``final_val_bpb``) keep working.

The old-store fixture is a results store exactly as normlab wrote it before the rename (the ``runs`` table with
``final_val_bpb``); references: the values put into it, and sqlite's own view of its columns."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from statistics import mean

import pytest

from normlab.names import read_bpb, renamed
from tests.helpers import run_inproc

ROWS = [("Alpha", 0, 1.50), ("Alpha", 1, 1.60), ("Beta", 0, 1.90), ("Beta", 1, 2.00)]


def old_store(d: Path) -> Path:
    """A sweep directory whose results.sqlite has the pre-rename column ``final_val_bpb``."""
    from normlab.config import load_config
    from normlab.experiments.store import Store

    d.mkdir()
    st = Store(d / "results.sqlite")
    st.create("old", "h0")
    cfg = load_config("tiny").to_dict()
    st.register([{"run_id": f"r{i}", "position": i, "variant": v, "seed": s, "config_hash": "c", "axes": {},
                  "overrides": {}, "config": cfg} for i, (v, s, _) in enumerate(ROWS)])
    con = sqlite3.connect(d / "results.sqlite")
    con.execute("ALTER TABLE runs RENAME COLUMN val_bpb TO final_val_bpb")  # as the old schema named it
    for i, (_, _, bpb) in enumerate(ROWS):
        con.execute("UPDATE runs SET status='completed', step=8, steps=8, final_val_bpb=?, best_val_bpb=?, "
                    "tokens_per_s=100.0 WHERE run_id=?", (bpb, bpb, f"r{i}"))
    con.commit()
    con.close()
    return d


def columns(path: Path) -> set[str]:
    con = sqlite3.connect(path)
    try:
        return {r[1] for r in con.execute("PRAGMA table_info(runs)")}
    finally:
        con.close()


def test_old_store_reads_as_val_bpb_and_runs_report_work(tmp_path, cache):
    s = old_store(tmp_path / "s")
    assert "final_val_bpb" in columns(s / "results.sqlite")
    rows = json.loads(run_inproc("runs", str(s), "--json", cache=cache, check=True).stdout)
    rows = rows["runs"] if isinstance(rows, dict) else rows
    assert [r["val_bpb"] for r in rows] == [b for _, _, b in ROWS] and all("final_val_bpb" not in r for r in rows)
    rep = json.loads(run_inproc("report", str(s), "--json", cache=cache, check=True).stdout)
    ranking = {r["variant"]: r["val_bpb_mean"] for r in rep["ranking"]}
    assert ranking == {"Alpha": pytest.approx(mean([1.5, 1.6])), "Beta": pytest.approx(mean([1.9, 2.0]))}
    assert "final_val_bpb" in columns(s / "results.sqlite")  # reading did not change the user's file


def test_create_renames_the_old_column_and_keeps_the_values(tmp_path):
    from normlab.experiments.store import Store

    s = old_store(tmp_path / "s")
    st = Store(s / "results.sqlite")
    st.create("old", "h0")  # what `normlab compare` does first on an existing sweep directory
    assert "val_bpb" in columns(s / "results.sqlite") and "final_val_bpb" not in columns(s / "results.sqlite")
    assert [r["val_bpb"] for r in st.runs()] == [b for _, _, b in ROWS]
    st.finish("r0", {"status": "completed", "val_bpb": 1.25}, [])
    assert st.get("r0")["val_bpb"] == 1.25
    st.create("old", "h0")  # idempotent
    assert st.get("r1")["val_bpb"] == 1.60


def test_read_bpb_and_renamed():
    assert read_bpb({"bpb": 1.0, "bits_per_byte": 2.0}) == 1.0  # the new name wins
    assert read_bpb({"bits_per_byte": 2.0}) == 2.0
    assert read_bpb({"final_val_bpb": 3.0}, "val_bpb") == 3.0 and read_bpb({}, "val_bpb") is None
    assert renamed({"final_val_bpb": 3.0, "x": 1}) == {"val_bpb": 3.0, "x": 1}


def test_outputs_write_the_new_names(tmp_path, cache):
    """eval --json writes bpb (not bits_per_byte); a run's summary, metrics and TensorBoard use val_bpb / val/bpb."""
    from normlab.train.tracking import read_scalars

    out = tmp_path / "r"
    tiny = ["--set", "train.steps=4", "--set", "train.eval_every=2", "--set", "train.log_every=2",
            "--set", "train.eval_batches=1", "--set", "model.depth=1", "--set", "diag.every=0"]
    run_inproc("train", "tiny", *tiny, "--out", str(out), cache=cache, check=True)
    ev = json.loads(run_inproc("eval", str(out), "--max-tokens", "256", "--json", cache=cache, check=True).stdout)
    assert "bpb" in ev and "bits_per_byte" not in ev
    assert json.loads((out / "eval_val.json").read_text())["bpb"] == ev["bpb"]
    assert "val_bpb" in json.loads((out / "summary.json").read_text())
    recs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert any("val_bpb" in r for r in recs) and not any("bits_per_byte" in r for r in recs)
    tags = {t for t, _, _ in read_scalars(out / "tb")}
    assert "val/bpb" in tags and "val/bits_per_byte" not in tags


def test_block_grad_norm_is_the_root_sum_square_of_the_block_parts():
    """The one per-block gradient norm (report profile and the Mix-LN claim): attention, MLP and norm parts."""
    from normlab.names import block_grad_norms

    rec = {"step": 10, "diag/grad_norm/attn/0": 3.0, "diag/grad_norm/mlp/0": 4.0, "diag/grad_norm/norm/0": 12.0,
           "diag/grad_norm/attn/1": 1.0, "diag/grad_norm/mlp/1": 0.0, "diag/grad_norm/final_norm": 99.0}
    assert block_grad_norms(rec) == [13.0, 1.0]  # sqrt(9 + 16 + 144); block 1 lacks its norm part: 0
    assert block_grad_norms({"step": 1}) == []
