"""``normlab scaling SWEEP_DIR``: scaling-law fits per variant of a sweep over model sizes, forecasts at 10x and
100x the largest size, crossovers and signal-to-noise (docs/scaling.md); ``--json`` prints them as one object."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from normlab.errors import NormlabError


def run_scaling(args: argparse.Namespace) -> int:
    from normlab.report.analysis import load  # matplotlib: not loaded by `normlab --help`
    from normlab.report.scaling import analyse, is_size_sweep, to_json

    d = Path(args.sweep_dir)
    if not d.is_dir():
        raise NormlabError(f"sweep directory {d} does not exist")
    rep = load(d)
    if not is_size_sweep(rep):
        raise NormlabError(f"{d} is not a size sweep: no variant was run at >= 3 model sizes (width, depth); "
                           "give the sweep 'sizes' or 'size_grid' (docs/scaling.md)")
    an = analyse(rep)
    if args.json:
        print(json.dumps(to_json(an), allow_nan=False))
        return 0

    from normlab.report.scaling_section import tables

    console = Console(width=max(120, Console().width))
    for key, title in (("fits", "Fitted L(N) = E + A N^-alpha (bits/byte)"), ("forecast", "Forecasts and crossovers"),
                       ("points", "Each size at its best learning rate (head norm: Filatov et al. 2025)"),
                       ("confounds", "Design confounds (what changes with size besides N)")):
        head, rows = tables(an)[key]
        if not rows:
            continue
        table = Table(*head, title=title)
        for r in rows:
            table.add_row(*r)
        console.print(table)
    for line in an.summary:
        print(f"- {line}")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``normlab scaling`` with their flags (called by ``normlab.cli.build_parser``)."""
    sc = sub.add_parser("scaling", help="fit L(N) = E + A N^-alpha per variant of a size sweep: forecasts, "
                        "crossovers, signal-to-noise")
    sc.add_argument("sweep_dir")
    sc.add_argument("--json", action="store_true")
    sc.set_defaults(func=run_scaling)
