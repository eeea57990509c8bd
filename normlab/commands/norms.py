"""``normlab norms``: the registered norms (name, description, paper)."""

from __future__ import annotations

import argparse
import json


def run_norms(args: argparse.Namespace) -> int:
    from normlab.norms import list_norms

    rows = list_norms()
    if args.json:
        print(json.dumps({"norms": rows}))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table("name", "description", "paper")
    for r in rows:
        table.add_row(r["name"], r["description"], r["paper"])
    Console(markup=False).print(table)
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``normlab norms`` with their flags (called by ``normlab.cli.build_parser``)."""
    n = sub.add_parser("norms", help="list the registered norms")
    n.add_argument("--json", action="store_true")
    n.set_defaults(func=run_norms)
