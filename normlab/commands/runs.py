"""``normlab runs [DIR] [--format table|csv|json]``: list the runs of a sweep from its results store, or, for any
other folder (``runs/``, where ``normlab train`` writes by default, and the default DIR), the single run
directories under it."""

from __future__ import annotations

import argparse
import csv
import json
import os
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from normlab.errors import NormlabError
from normlab.experiments.progress import run_unigram
from normlab.experiments.store import Store
from normlab.io import dumps
from normlab.rundir.files import CHECKPOINTS_DIR, CONFIG_FILE, METRICS_FILE, SUMMARY_FILE
from normlab.rundir.readers import last_step, open_config, read_run_hash, read_summary
from normlab.safety import printable
from normlab.stats.learning import did_not_learn

COLUMNS = ("run_id", "variant", "seed", "status", "step", "steps", "val_bpb", "best_val_bpb", "final_val_loss",
           "entropy_floor_bpb", "tokens_per_s", "wall_s", "peak_mem_mb", "params", "train_calls", "config_hash",
           "error", "unigram_bpb", "did_not_learn")


def _fmt(v: object, col: str) -> str:
    if v is None:
        return "–"
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return printable(v)  # a string from a file: control characters shown as escapes
    if col in ("val_bpb", "best_val_bpb", "final_val_loss", "entropy_floor_bpb"):
        return f"{v:.4f}"
    if col in ("tokens_per_s", "params"):
        return f"{v:,.0f}"
    if col in ("wall_s", "peak_mem_mb"):
        return f"{v:.0f}"
    return str(v)


def _learned(row: dict[str, Any]) -> dict[str, Any]:
    """The row with ``did_not_learn`` (normlab.stats.learning's rule on its final ``val_bpb`` against its
    ``unigram_bpb``; None without either)."""
    flag = did_not_learn(row["val_bpb"], row["unigram_bpb"]) if row.get("val_bpb") is not None else None
    return {**row, "did_not_learn": flag}


def _val_cell(row: dict[str, Any]) -> str:
    """The final validation bits/byte, flagged "did not learn" beside the unigram level where the rule says so."""
    cell = _fmt(row["val_bpb"], "val_bpb")
    return f"{cell} (did not learn: unigram {row['unigram_bpb']:.4f})" if row.get("did_not_learn") else cell


DEFAULT_DIR = "runs"
"""``normlab runs`` without DIR: the folder ``normlab train`` and ``compare`` write into by default."""


def run_runs(args: argparse.Namespace) -> int:
    d = Path(args.sweep_dir)
    if args.sweep_dir == DEFAULT_DIR and not os.path.lexists(d):
        raise NormlabError(f"no {DEFAULT_DIR}/ folder in {Path.cwd()} (normlab train and compare write there by "
                           "default); give a sweep directory or a folder of runs: normlab runs DIR")
    if not d.is_dir():
        raise NormlabError(f"{d} is a file, not a directory; give a sweep directory or a folder holding run "
                           "directories" if os.path.lexists(d) else f"directory {d} does not exist")
    if not os.path.lexists(d / "results.sqlite"):
        return _list_run_dirs(d, "json" if args.json else args.format)
    store = Store(d / "results.sqlite")
    meta = store.meta()
    rows = [_learned({**r, "unigram_bpb": run_unigram(d, r["run_id"]) if r["status"] == "completed" else None})
            for r in store.runs(damaged="mark")]
    fmt = "json" if args.json else args.format
    if fmt == "json":
        print(dumps({"sweep_dir": str(d), "sweep": meta.get("sweep_name"), "sweep_hash": meta.get("sweep_hash"),
                          "runs": rows}))
    elif fmt == "csv":
        w = csv.writer(sys.stdout, lineterminator="\n")
        w.writerow([*COLUMNS, "axes", "overrides"])
        for r in rows:
            w.writerow(
                [("" if r[c] is None else r[c]) for c in COLUMNS] + [json.dumps(r["axes"]), json.dumps(r["overrides"])]
            )
    else:
        cols = ("run_id", "variant", "seed", "status", "step", "val_bpb", "best_val_bpb", "tokens_per_s",
                "wall_s", "peak_mem_mb", "params")
        heads = ("run", "variant", "seed", "status", "step", "sampled val bpb", "best sampled val bpb", "tokens/s",
                 "wall s", "peak MB", "params")
        table = Table(*heads, title=printable(f"sweep '{meta.get('sweep_name')}' ({d}): {len(rows)} runs"))
        for r in rows:
            step = f"{r['step']}/{r['steps']}" if r["step"] is not None else "–"
            table.add_row(*[step if c == "step" else _val_cell(r) if c == "val_bpb" else _fmt(r[c], c)
                            for c in cols])
        console = Console(width=max(140, Console().width), markup=False)
        console.print(table)
        _print_malformed(console, [(r["run_id"], r) for r in rows])
    return 0


RUN_COLUMNS = ("path", "status", "step", "steps", "val_bpb", "best_val_bpb", "norm", "config_hash", "unigram_bpb",
               "did_not_learn")
SKIP_DIRS = {CHECKPOINTS_DIR, "tb", "logs", "diagnostics", ".git", "__pycache__"}


def find_run_dirs(root: Path) -> tuple[list[Path], list[Path]]:
    """``(run directories, sweep directories)`` under ``root`` (``root`` itself included), sorted. A run directory
    holds ``config.yaml`` and ``summary.json`` or ``metrics.jsonl``; a sweep directory ``results.sqlite``. Neither
    is searched further (a sweep's own runs are listed by ``normlab runs SWEEP_DIR``)."""
    runs, sweeps = [], []
    for dirpath, dirnames, filenames in os.walk(root):
        names = set(filenames)
        if "results.sqlite" in names:
            sweeps.append(Path(dirpath))
            dirnames[:] = []
        elif CONFIG_FILE in names and names & {SUMMARY_FILE, METRICS_FILE}:
            runs.append(Path(dirpath))
            dirnames[:] = []
        else:
            dirnames[:] = sorted(n for n in dirnames if n not in SKIP_DIRS and not n.startswith("."))
    return sorted(runs), sorted(sweeps)


def describe_run(run_dir: Path) -> dict[str, Any]:
    """One row of ``normlab runs`` for a single run directory, from its files only (no torch): ``status`` from
    ``summary.json`` (``unfinished`` without one: still training, or killed; ``step`` then is the last logged),
    ``val_bpb`` / ``best_val_bpb`` the final and best validation bits/byte, ``unigram_bpb`` the training split's
    unigram level and ``did_not_learn`` the one rule on the two (normlab.stats.learning; None without a level),
    ``config_hash`` the run's config hash
    (``read_run_hash``: the one ``normlab config`` prints and the run folder's name holds; config.yaml's own hash
    where the run recorded none). A file that cannot be trusted (a FIFO or device in its place, over the size cap,
    not JSON / YAML, a duplicate key, a value of the wrong type) makes the row ``status`` ``malformed`` with the
    one-line reason in ``error``; the listing goes on."""
    row: dict[str, Any] = {"path": str(run_dir), "status": "unfinished", "step": None, "steps": None,
                           "val_bpb": None, "best_val_bpb": None, "norm": None, "config_hash": None, "error": None,
                           "unigram_bpb": None, "did_not_learn": None}
    try:
        cfg = open_config(run_dir)
        row.update(steps=cfg.train.steps, norm=cfg.model.norm, config_hash=cfg.hash())
    except NormlabError as e:
        row.update(status="malformed", error=str(e))
        return row
    try:
        summary = read_summary(run_dir)
    except NormlabError as e:
        row.update(status="malformed", error=str(e))
        return row
    if summary is not None:
        row.update({k: summary.get(k, row[k]) for k in ("status", "step", "steps", "val_bpb", "best_val_bpb")})
        u = summary.get("unigram_bpb")
        row.update(_learned({**row, "unigram_bpb": u if isinstance(u, (int, float)) and not isinstance(u, bool)
                             else None}))
    else:
        row["step"] = last_step(run_dir / METRICS_FILE)
    try:
        row["config_hash"] = read_run_hash(run_dir) or row["config_hash"]
    except NormlabError as e:
        row.update(status="malformed", error=str(e))
    return row


def _print_malformed(console: Any, rows: list[tuple[str, dict[str, Any]]]) -> None:
    """One line under the table for each row marked ``malformed``: the run and why (the listing itself goes on)."""
    for name, r in rows:
        if r["status"] == "malformed":
            console.print(printable(f"malformed {name}: {r['error']}"), soft_wrap=True)


def _rel(path: str, root: Path) -> str:
    rel = Path(path).relative_to(root)
    return printable(rel if str(rel) != "." else root)  # a directory name: control characters as escapes


def _list_run_dirs(d: Path, fmt: str) -> int:
    found, sweeps = find_run_dirs(d)
    if not found and not sweeps:
        raise NormlabError(f"{d} holds no normlab runs (a run directory has config.yaml and summary.json or "
                           "metrics.jsonl; a sweep directory results.sqlite)")
    rows = [describe_run(p) for p in found]
    if fmt == "json":
        print(dumps({"dir": str(d), "runs": rows, "sweeps": [str(s) for s in sweeps]}))
    elif fmt == "csv":
        w = csv.writer(sys.stdout, lineterminator="\n")
        w.writerow([*RUN_COLUMNS, "error"])
        for r in rows:
            w.writerow([("" if r[c] is None else r[c]) for c in (*RUN_COLUMNS, "error")])
    else:
        table = Table("run", "status", "step", "sampled val bpb", "best sampled val bpb", "norm", "config hash",
                      title=printable(f"{d}: {len(rows)} runs"))
        for r in rows:
            step = f"{r['step']}/{r['steps']}" if r["step"] is not None else "–"
            table.add_row(_rel(r["path"], d), _fmt(r["status"], "status"), step, _val_cell(r),
                          _fmt(r["best_val_bpb"], "val_bpb"), _fmt(r["norm"], "norm"), _fmt(r["config_hash"], ""))
        console = Console(width=max(140, Console().width), markup=False)
        console.print(table)
        _print_malformed(console, [(_rel(r["path"], d), r) for r in rows])
        for s in sweeps:
            console.print(printable(f"sweep {s}: list its runs with 'normlab runs {s}'"), soft_wrap=True)
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``normlab runs`` with their flags (called by ``normlab.cli.build_parser``)."""
    rn = sub.add_parser("runs", help="list the runs of a sweep directory, or the run directories under a folder")
    rn.add_argument("sweep_dir", metavar="DIR", nargs="?", default=DEFAULT_DIR,
                    help="a sweep directory, or any folder holding run directories (default: runs/, where train and "
                    "compare write)")
    rn.add_argument("--format", choices=["table", "csv", "json"], default="table")
    rn.add_argument("--json", action="store_true", help="same as --format json")
    rn.set_defaults(func=run_runs)
