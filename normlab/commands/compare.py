"""``normlab compare SWEEP.yaml|--preset NAME``: run a sweep in parallel, store the results, write the report."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from normlab.errors import EXIT_INTERRUPTED
from normlab.io import dumps


def print_ranking(rep: Any, title: str | None = None) -> None:
    """The ranking table on stdout (rich)."""
    from rich.console import Console
    from rich.table import Table

    from normlab.report import table_cells

    head, rows = table_cells(rep)
    table = Table(*head, title=title)
    for i, col in enumerate(table.columns):
        col.justify = "left" if i == 1 else "right"
    for v, cells in zip(rep.variants, rows):
        table.add_row(*cells, style="bold green" if v.rank == 1 else ("red" if v.ci is None else None))
    Console(width=max(120, Console().width), markup=False).print(table)


def print_lr(rep: Any) -> None:
    """The learning-rate ranking (a grid) and the paired differences, on stdout (rich); nothing without them."""
    from rich.console import Console
    from rich.table import Table

    from normlab.report import lrsection

    grid = rep.grid
    if grid is None:
        return
    console = Console(width=max(120, Console().width))
    tables = []
    if grid.is_grid:
        tables.append(("LR sensitivity ranking", *lrsection.ranking_cells(grid)))
    if grid.paired:
        tables.append((f"Paired differences vs {grid.baseline}", *lrsection.paired_cells(grid)))
    for title, head, rows in tables:
        t = Table(*head, title=title)
        for col in t.columns:
            col.justify = "left" if col.header in lrsection.LEFT else "right"
        for r in rows:
            t.add_row(*r)
        console.print(t)


def run_compare(args: argparse.Namespace) -> int:
    from normlab.experiments.runner import default_sweep_dir, run_sweep
    from normlab.experiments.sweep import load_sweep
    from normlab.report import write_report

    sweep = load_sweep(args.sweep, preset=args.preset)
    out = Path(args.out) if args.out else default_sweep_dir(sweep)
    try:
        outcome = run_sweep(sweep, out, workers=args.workers, executor=args.executor, address=args.address)
    except KeyboardInterrupt:  # Ctrl-C before any worker started (data preparation, store setup)
        print(f"interrupted before training started; re-run the same command to start {out}", file=sys.stderr)
        return EXIT_INTERRUPTED
    counts = outcome.counts()
    base = {"sweep_dir": str(out), "sweep": sweep.name, "sweep_hash": sweep.hash, "status": outcome.status,
            "counts": counts, "trained": outcome.trained, "skipped": outcome.skipped, "workers": outcome.workers,
            "threads": outcome.threads, "executor": args.executor, "wall_s": outcome.wall_s,
            "packing": outcome.packing, "sweep_tokens_per_s": outcome.sweep_tokens_per_s}
    if outcome.status == "interrupted":
        msg = f"interrupted; finished runs are stored in {out}. Re-run the same command to resume."
        print(dumps(base) if args.json else msg, file=sys.stdout if args.json else sys.stderr)
        return EXIT_INTERRUPTED
    rep = write_report(out)
    failed = [r for r in outcome.runs if r["status"] not in ("completed", "diverged")]
    if args.json:
        print(dumps({**base, "report_html": rep["html"], "report_md": rep["md"], "ranking": rep["ranking"],
                     "summary": rep["summary"], "lr": rep["lr"]}, default=float))
    else:
        print(f"\nreport: {rep['html']}\n        {rep['md']}")
        print_lr(rep["report"])
        if not (rep["report"].grid and rep["report"].grid.is_grid):
            print_ranking(rep["report"])
        for line in rep["summary"]:
            print(f"- {line}")
    if failed:
        ids = ", ".join(r["run_id"] for r in failed)
        print(f"{len(failed)} run(s) did not finish ({ids}); see {out / 'logs'}; re-run to retry them", file=sys.stderr)
        return 1
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``normlab compare`` with their flags (called by ``normlab.cli.build_parser``)."""
    from normlab.validate import int_in

    cp = sub.add_parser("compare", help="train many variants in parallel, store the results, write a report")
    cp.add_argument("sweep", nargs="?", help="sweep YAML file (docs/compare.md); or use --preset")
    cp.add_argument("--preset", help="a shipped sweep in normlab/configs/sweeps/ (quick, depth, attention, dyt, scaling)")
    cp.add_argument("--out", help="sweep directory (default: runs/compare-<sweep name>); re-run to resume")
    cp.add_argument("--workers", type=int_in(1, 1024), help="parallel worker processes (default: one per core, at most one per run)")
    cp.add_argument("--executor", choices=["local", "ray"], default="local",
                    help="local worker processes (default) or Ray tasks on a cluster (docs/distributed.md)")
    cp.add_argument("--address", metavar="auto|HOST:PORT|ray://HOST:PORT",
                    help="the Ray cluster (with --executor ray): auto (the one 'ray start --head' started here), its "
                         "GCS address, or ray://HOST:PORT for the Ray client (default: RAY_ADDRESS or a new "
                         "one-machine cluster)")
    cp.add_argument("--json", action="store_true", help="print one JSON object at the end (progress goes to stderr)")
    cp.set_defaults(func=run_compare)
