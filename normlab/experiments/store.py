"""The results store: ``SWEEP_DIR/results.sqlite`` (WAL mode, busy timeout), written by many worker processes.

Tables::

    meta(key PRIMARY KEY, value)                  schema, sweep_name, sweep_hash, created_at
    runs(run_id PRIMARY KEY, position, variant, seed, config_hash, axes_json, overrides_json, config_json,
         status, step, steps, val_bpb, best_val_bpb, final_val_loss, train_loss, entropy_floor_bpb,
         tokens_per_s, wall_s, peak_mem_mb, params, train_calls, error, started_at, finished_at)
    curves(run_id, step, key, value, PRIMARY KEY (run_id, step, key))   every numeric metrics.jsonl value

``val_bpb`` is the run's final validation bits/byte (normlab.names); a store written before that name has the
column ``final_val_bpb``: reading maps it to ``val_bpb``, and ``create`` (``normlab compare`` on that sweep)
renames the column in place, so old sweep directories keep working.

``status`` is ``pending`` (not started), ``running``, ``completed``, ``diverged``, ``interrupted`` (resumable) or
``failed`` (the worker stopped with an error; retried on the next ``compare``). ``train_calls`` counts how often a
worker invoked the trainer for the run (a resumed run has 2). Every write is one short ``BEGIN IMMEDIATE``
transaction on its own connection, so concurrent workers serialise on SQLite's lock instead of losing rows; a lock
held longer than the busy timeout (``NORMLAB_DB_TIMEOUT`` seconds, default 60) is a one-line error.
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from normlab.errors import NormlabError
from normlab.io import loads_json
from normlab.names import OLD_NAMES, renamed
from normlab.validate import env_value

SCHEMA = 1
FINAL = ("completed", "diverged")
RUN_COLUMNS = (
    "run_id", "position", "variant", "seed", "config_hash", "axes_json", "overrides_json", "config_json", "status",
    "step", "steps", "val_bpb", "best_val_bpb", "final_val_loss", "train_loss", "entropy_floor_bpb",
    "tokens_per_s", "wall_s", "peak_mem_mb", "params", "train_calls", "error", "started_at", "finished_at",
)
NUMERIC_COLUMNS = ("position", "seed", "step", "steps", "val_bpb", "best_val_bpb", "final_val_loss", "train_loss",
                   "entropy_floor_bpb", "tokens_per_s", "wall_s", "peak_mem_mb", "params", "train_calls",
                   "started_at", "finished_at")
_DDL = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY, position INTEGER, variant TEXT NOT NULL, seed INTEGER NOT NULL,
    config_hash TEXT NOT NULL, axes_json TEXT NOT NULL, overrides_json TEXT NOT NULL, config_json TEXT NOT NULL,
    status TEXT NOT NULL DEFAULT 'pending', step INTEGER, steps INTEGER, val_bpb REAL, best_val_bpb REAL,
    final_val_loss REAL, train_loss REAL, entropy_floor_bpb REAL, tokens_per_s REAL, wall_s REAL,
    peak_mem_mb REAL, params INTEGER, train_calls INTEGER NOT NULL DEFAULT 0, error TEXT,
    started_at REAL, finished_at REAL
);
CREATE TABLE IF NOT EXISTS curves (
    run_id TEXT NOT NULL, step INTEGER NOT NULL, key TEXT NOT NULL, value REAL,
    PRIMARY KEY (run_id, step, key)
);
"""


def _rename_old_columns(con: sqlite3.Connection) -> None:
    """Rename the ``runs`` columns of a store written before normlab.names (``final_val_bpb`` -> ``val_bpb``)."""
    have = {r[1] for r in con.execute("PRAGMA table_info(runs)").fetchall()}
    for old, new in OLD_NAMES.items():
        if old in have and new not in have:
            con.execute(f"ALTER TABLE runs RENAME COLUMN {old} TO {new}")


def db_timeout() -> float:
    """``NORMLAB_DB_TIMEOUT`` (seconds, default 60); a bad value (not a number, not in (0, a year]) is one line."""
    return env_value("NORMLAB_DB_TIMEOUT", 60.0)


class Store:
    """Access to one sweep's ``results.sqlite``. Cheap to construct; every call opens its own connection."""

    def __init__(self, path: str | Path, timeout: float | None = None):
        self.path = Path(path)
        self.timeout = db_timeout() if timeout is None else timeout

    # -- connections and errors ------------------------------------------------------------------------------
    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        if os.path.lexists(self.path) and not self.path.is_file():  # a FIFO or device: sqlite could block on it
            raise NormlabError(f"results store {self.path} is not a regular file; normlab reads only regular files")
        try:
            con = sqlite3.connect(str(self.path), timeout=self.timeout, isolation_level=None)
        except sqlite3.Error as e:
            raise NormlabError(f"cannot open results store {self.path}: {e}") from None
        try:
            con.execute(f"PRAGMA busy_timeout = {int(self.timeout * 1000)}")
            con.row_factory = sqlite3.Row
            yield con
        except sqlite3.OperationalError as e:
            msg = str(e)
            if "locked" in msg or "busy" in msg:
                raise NormlabError(
                    f"results store {self.path} is locked by another process (waited {self.timeout:g}s); "
                    "wait for it to finish or stop it, then re-run"
                ) from None
            raise NormlabError(f"results store {self.path}: {msg}") from None
        except sqlite3.DatabaseError as e:
            raise NormlabError(f"{self.path} is not a normlab results store ({e})") from None
        finally:
            con.close()

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        with self._connect() as con:
            con.execute("BEGIN IMMEDIATE")
            try:
                yield con
            except BaseException:
                con.execute("ROLLBACK")
                raise
            con.execute("COMMIT")

    # -- creation and identity -------------------------------------------------------------------------------
    def create(self, sweep_name: str, sweep_hash: str) -> None:
        """Create the schema (idempotent) and record the sweep's identity; WAL mode persists in the file."""
        with self._connect() as con:
            mode = con.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise NormlabError(f"results store {self.path}: cannot enable WAL mode (got {mode})")
            con.executescript(_DDL)
        with self._write() as con:
            _rename_old_columns(con)
            for k, v in (("schema", str(SCHEMA)), ("sweep_name", sweep_name), ("sweep_hash", sweep_hash),
                         ("created_at", f"{time.time():.3f}")):
                con.execute("INSERT OR IGNORE INTO meta(key, value) VALUES (?, ?)", (k, v))

    def meta(self) -> dict[str, str]:
        if not os.path.lexists(self.path):
            raise NormlabError(
                f"{self.path.parent} is not a sweep directory (no results.sqlite); run normlab compare first"
            )
        with self._connect() as con:
            try:
                rows = con.execute("SELECT key, value FROM meta").fetchall()
            except sqlite3.OperationalError as e:
                if "no such table" in str(e):
                    raise NormlabError(f"{self.path} is not a normlab results store (no meta table)") from None
                raise
        return {r["key"]: r["value"] for r in rows}

    def set_meta(self, key: str, value: str) -> None:
        with self._write() as con:
            con.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)", (key, value))

    # -- runs ------------------------------------------------------------------------------------------------
    def register(self, runs: list[dict[str, Any]]) -> int:
        """Insert runs not yet stored (status ``pending``); returns how many were new."""
        with self._write() as con:
            before = con.execute("SELECT COUNT(*) FROM runs").fetchone()[0]
            for r in runs:
                con.execute(
                    "INSERT OR IGNORE INTO runs(run_id, position, variant, seed, config_hash, axes_json, "
                    "overrides_json,"
                    " config_json) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (r["run_id"], r["position"], r["variant"], r["seed"], r["config_hash"], json.dumps(r["axes"]),
                     json.dumps(r["overrides"]), json.dumps(r["config"])),
                )
            return con.execute("SELECT COUNT(*) FROM runs").fetchone()[0] - before

    def runs(self, damaged: str = "raise") -> list[dict[str, Any]]:
        """All runs in sweep order, JSON columns decoded (``axes``, ``overrides``, ``config``). A damaged row (a
        column of the wrong type, invalid JSON) is a one-line error, or with ``damaged="mark"`` (``normlab runs``)
        a row with ``status`` ``malformed``, the reason in ``error`` and its other values None."""
        self.meta()
        with self._connect() as con:
            rows = con.execute("SELECT * FROM runs ORDER BY position, run_id").fetchall()
        out = []
        for row in rows:
            d = renamed(dict(row))  # final_val_bpb (old store) -> val_bpb
            try:
                out.append(self._checked_row(dict(d)))
            except NormlabError as e:
                if damaged != "mark":
                    raise
                out.append({**{c: None for c in RUN_COLUMNS if not c.endswith("_json")}, "axes": {}, "overrides": {},
                            "config": {}, "run_id": str(d.get("run_id")), "variant": str(d.get("variant")),
                            "status": "malformed", "error": str(e)})
        return out

    def _checked_row(self, d: dict[str, Any]) -> dict[str, Any]:
        """Decode the JSON columns and check every column's type; a damaged row is a one-line error."""
        rid = d.get("run_id")
        for col in ("axes", "overrides", "config"):
            raw = d.pop(f"{col}_json")
            try:  # the bounded reader: nesting and integer digits (Python's 4300-digit ValueError)
                d[col] = loads_json(raw if isinstance(raw, (str, bytes)) else "", f"{col}_json")
            except NormlabError as e:
                raise NormlabError(f"results store {self.path} is damaged: run {rid!r} has invalid JSON in "
                                   f"{col}_json ({str(raw)[:40]!r}: {str(e).split(': ', 1)[-1][:80]})") from None
            if not isinstance(d[col], dict if col == "config" else (dict, list)):
                raise NormlabError(f"results store {self.path} is damaged: run {rid!r} {col}_json is not a mapping")
        train = d["config"].get("train", {})
        lr = train.get("lr") if isinstance(train, dict) else None
        if not isinstance(train, dict) or ("lr" in train and not (
                isinstance(lr, (int, float)) and not isinstance(lr, bool) and math.isfinite(lr))):
            raise NormlabError(f"results store {self.path} is damaged: run {rid!r} config_json has no numeric "
                               "train.lr (every stored config is a full, resolved config)")
        for col in NUMERIC_COLUMNS:
            v = d.get(col)
            if v is not None and (not isinstance(v, (int, float)) or isinstance(v, bool)):
                raise NormlabError(f"results store {self.path} is damaged: run {rid!r} column {col} holds {v!r}, "
                                   "not a number")
        for col in ("run_id", "variant", "status"):
            if not isinstance(d.get(col), str):
                raise NormlabError(f"results store {self.path} is damaged: run {rid!r} column {col} holds "
                                   f"{d.get(col)!r}, not text")
        return d

    def get(self, run_id: str) -> dict[str, Any]:
        for r in self.runs():
            if r["run_id"] == run_id:
                return r
        raise NormlabError(f"run '{run_id}' is not in {self.path}")

    def update(self, run_id: str, **fields: Any) -> None:
        bad = set(fields) - set(RUN_COLUMNS)
        if bad:
            raise ValueError(f"unknown run columns {sorted(bad)}")
        cols = ", ".join(f"{k} = ?" for k in fields)
        with self._write() as con:
            con.execute(f"UPDATE runs SET {cols} WHERE run_id = ?", (*fields.values(), run_id))

    def start(self, run_id: str, *, calls_trainer: bool) -> None:
        """Mark a run ``running`` (and count one trainer invocation when ``calls_trainer``)."""
        with self._write() as con:
            con.execute(
                "UPDATE runs SET status = 'running', error = NULL, started_at = ?, "
                "train_calls = train_calls + ? WHERE run_id = ?",
                (time.time(), 1 if calls_trainer else 0, run_id),
            )

    def finish(self, run_id: str, result: dict[str, Any], curves: list[tuple[int, str, float]]) -> None:
        """Record a run's result row and replace its curves, in one transaction."""
        fields = {k: v for k, v in result.items() if k in RUN_COLUMNS}
        fields["finished_at"] = time.time()
        cols = ", ".join(f"{k} = ?" for k in fields)
        with self._write() as con:
            con.execute(f"UPDATE runs SET {cols} WHERE run_id = ?", (*fields.values(), run_id))
            con.execute("DELETE FROM curves WHERE run_id = ?", (run_id,))
            con.executemany("INSERT OR REPLACE INTO curves(run_id, step, key, value) VALUES (?, ?, ?, ?)",
                            [(run_id, s, k, v) for s, k, v in curves])

    def curves(self, run_id: str | None = None, *,
               finite: bool = False) -> dict[str, dict[str, list[tuple[int, float]]]]:
        """``{run_id: {key: [(step, value), ...]}}`` sorted by step; ``finite``: without the points whose value is
        null (a NaN or a missing number the run logged), as the report's statistics and figures read them."""
        with self._connect() as con:
            q = "SELECT run_id, step, key, value FROM curves"
            rows = con.execute(q + (" WHERE run_id = ?" if run_id else "") + " ORDER BY run_id, key, step",
                               (run_id,) if run_id else ()).fetchall()
        out: dict[str, dict[str, list[tuple[int, float]]]] = {}
        for r in rows:
            v, step = r["value"], r["step"]
            if (v is not None and (not isinstance(v, (int, float)) or isinstance(v, bool))) or not isinstance(
                step, int
            ):
                raise NormlabError(f"results store {self.path} is damaged: curve {r['key']!r} of run {r['run_id']!r} "
                                   f"holds step {step!r}, value {v!r}, not numbers")
            if finite and (v is None or not math.isfinite(v)):
                continue
            out.setdefault(r["run_id"], {}).setdefault(r["key"], []).append((step, v))
        return out
