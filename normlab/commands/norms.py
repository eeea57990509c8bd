"""``normlab norms``: the registered norms (name, description, paper)."""

from __future__ import annotations

import argparse

from normlab.commands.listing import print_listing


def run_norms(args: argparse.Namespace) -> int:
    from normlab.norms import list_norms  # torch: not loaded by `normlab --help`

    return print_listing("norms", list_norms(), {
        "name": lambda r: r["name"],
        "description": lambda r: r["description"],
        "paper": lambda r: r["paper"],
    }, args.json)


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``normlab norms`` with their flags (called by ``normlab.cli.build_parser``)."""
    n = sub.add_parser("norms", help="list the registered norms")
    n.add_argument("--json", action="store_true")
    n.set_defaults(func=run_norms)
