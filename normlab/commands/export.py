"""``normlab export RUN_DIR --to hf --out DIR``: a run as a Hugging Face transformers model directory
(docs/interop.md)."""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.table import Table

from normlab.commands.stages import StageProgress
from normlab.io import dumps

KEYS = ("arch", "hf_class", "max_abs_logit_diff", "greedy_equal", "tolerance", "doc_start_token", "out")


def print_result(r: dict, as_json: bool, title: str) -> None:
    """The result of ``export`` or ``import``: its ``KEYS`` as one JSON line or a table."""
    row = {k: r[k] for k in KEYS if k in r}
    if as_json:
        print(dumps(row))
        return

    table = Table("metric", "value", title=title)
    for k, v in row.items():
        table.add_row(k, f"{v:.3g}" if isinstance(v, float) else str(v))
    Console().print(table)


def run_export(args: argparse.Namespace) -> int:
    from normlab.interop.export import EXPORT_STAGES, export_run  # torch: not loaded by `normlab --help`

    with StageProgress("export", len(EXPORT_STAGES)) as say:  # on a terminal: stage lines and a bar on stderr
        r = export_run(args.run_dir, args.out, progress=say)
    print_result(r, args.json, f"{args.run_dir} -> {r['out']} (HF {r['arch']})")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``normlab export`` with its flags (called by ``normlab.cli.build_parser``)."""
    ex = sub.add_parser("export", help="write a run as a Hugging Face transformers model directory (exact, checked)")
    ex.add_argument("run_dir")
    ex.add_argument("--to", required=True, choices=["hf"], help="target format (hf: transformers)")
    ex.add_argument("--out", required=True, help="output directory (must not exist or be empty)")
    ex.add_argument("--json", action="store_true")
    ex.set_defaults(func=run_export)
