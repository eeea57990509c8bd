"""``normlab runs SWEEP_DIR [--format table|csv|json]``: list the runs of a sweep from its results store."""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

from normlab.errors import NormlabError
from normlab.io import dumps

COLUMNS = ("run_id", "variant", "seed", "status", "step", "steps", "val_bpb", "best_val_bpb", "final_val_loss",
           "entropy_floor_bpb", "tokens_per_s", "wall_s", "peak_mem_mb", "params", "train_calls", "config_hash",
           "error")


def _fmt(v: object, col: str) -> str:
    if v is None:
        return "–"
    if col in ("val_bpb", "best_val_bpb", "final_val_loss", "entropy_floor_bpb"):
        return f"{v:.4f}"
    if col in ("tokens_per_s", "params"):
        return f"{v:,.0f}"
    if col in ("wall_s", "peak_mem_mb"):
        return f"{v:.0f}"
    return str(v)


def run_runs(args: argparse.Namespace) -> int:
    from normlab.experiments.store import Store

    d = Path(args.sweep_dir)
    if not d.is_dir():
        raise NormlabError(f"sweep directory {d} does not exist")
    store = Store(d / "results.sqlite")
    meta = store.meta()
    rows = store.runs()
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
        from rich.console import Console
        from rich.table import Table

        cols = ("run_id", "variant", "seed", "status", "step", "val_bpb", "best_val_bpb", "tokens_per_s",
                "wall_s", "peak_mem_mb", "params")
        heads = ("run", "variant", "seed", "status", "step", "final val bpb", "best val bpb", "tokens/s", "wall s",
                 "peak MB", "params")
        table = Table(*heads, title=f"sweep '{meta.get('sweep_name')}' ({d}): {len(rows)} runs")
        for r in rows:
            step = f"{r['step']}/{r['steps']}" if r["step"] is not None else "–"
            table.add_row(*[step if c == "step" else _fmt(r[c], c) for c in cols])
        Console(width=max(140, Console().width), markup=False).print(table)
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``normlab runs`` with their flags (called by ``normlab.cli.build_parser``)."""
    rn = sub.add_parser("runs", help="list the runs of a sweep directory")
    rn.add_argument("sweep_dir")
    rn.add_argument("--format", choices=["table", "csv", "json"], default="table")
    rn.add_argument("--json", action="store_true", help="same as --format json")
    rn.set_defaults(func=run_runs)
