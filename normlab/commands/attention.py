"""``normlab attention``: the registered attention kinds (``model.attention``) and the facts each declares."""

from __future__ import annotations

import argparse

from normlab.commands.listing import print_listing

_YES = {True: "yes", False: "no"}


def run_attention(args: argparse.Namespace) -> int:
    from normlab.attention import list_attention  # torch: not loaded by `normlab --help`

    return print_listing("attention", list_attention(), {
        "name": lambda r: r["name"],
        "description": lambda r: r["description"],
        "paper": lambda r: r["paper"],
        "T x T scores": lambda r: _YES[r["score_matrix"]],
        "options": lambda r: ", ".join(r["options"]),
        "eval-time": lambda r: ", ".join(r["eval_keys"]),
        "convert / export": lambda r: f"{_YES[r['convertible']]} / {_YES[r['exportable']]}",
    }, args.json)


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``normlab attention`` with its flags (called by ``normlab.cli.build_parser``)."""
    a = sub.add_parser("attention", help="list the registered attention kinds (model.attention)")
    a.add_argument("--json", action="store_true")
    a.set_defaults(func=run_attention)
