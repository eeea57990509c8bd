"""``normlab attention``: the registered attention kinds (``model.attention``) and the facts each declares."""

from __future__ import annotations

import argparse
import json


def run_attention(args: argparse.Namespace) -> int:
    from normlab.attention import list_attention

    rows = list_attention()
    if args.json:
        print(json.dumps({"attention": rows}))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table("name", "description", "paper", "T x T scores", "options", "eval-time", "convert / export")
    yes = {True: "yes", False: "no"}
    for r in rows:
        table.add_row(r["name"], r["description"], r["paper"], yes[r["score_matrix"]], ", ".join(r["options"]),
                      ", ".join(r["eval_keys"]), f"{yes[r['convertible']]} / {yes[r['exportable']]}")
    Console(markup=False).print(table)
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``normlab attention`` with its flags (called by ``normlab.cli.build_parser``)."""
    a = sub.add_parser("attention", help="list the registered attention kinds (model.attention)")
    a.add_argument("--json", action="store_true")
    a.set_defaults(func=run_attention)
