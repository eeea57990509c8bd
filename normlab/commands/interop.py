"""``normlab export RUN_DIR --to hf --out DIR`` and ``normlab import HF_DIR --out RUN_DIR`` (docs/interop.md)."""

from __future__ import annotations

import argparse
import json

KEYS = ("arch", "hf_class", "max_abs_logit_diff", "greedy_equal", "tolerance", "doc_start_token", "out")


def _print(r: dict, as_json: bool, title: str) -> None:
    row = {k: r[k] for k in KEYS if k in r}
    if as_json:
        print(json.dumps(row))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table("metric", "value", title=title)
    for k, v in row.items():
        table.add_row(k, f"{v:.3g}" if isinstance(v, float) else str(v))
    Console().print(table)


def run_export(args: argparse.Namespace) -> int:
    from normlab.interop.export import export_run

    r = export_run(args.run_dir, args.out)
    _print(r, args.json, f"{args.run_dir} -> {r['out']} (HF {r['arch']})")
    return 0


def run_import(args: argparse.Namespace) -> int:
    from normlab.interop.hf_import import import_hf

    r = import_hf(args.hf_dir, args.out, data=args.data, tokenizer=args.tokenizer)
    _print(r, args.json, f"{args.hf_dir} (HF {r['arch']}) -> {r['out']}")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``normlab export, import`` with their flags (called by ``normlab.cli.build_parser``)."""
    ex = sub.add_parser("export", help="write a run as a Hugging Face transformers model directory (exact, checked)")
    ex.add_argument("run_dir")
    ex.add_argument("--to", required=True, choices=["hf"], help="target format (hf: transformers)")
    ex.add_argument("--out", required=True, help="output directory (must not exist or be empty)")
    ex.add_argument("--json", action="store_true")
    ex.set_defaults(func=run_export)

    im = sub.add_parser("import", help="turn a local Hugging Face model directory into a normlab run (exact, checked)")
    im.add_argument("hf_dir")
    im.add_argument("--out", required=True, help="new run directory (must not exist or be empty)")
    im.add_argument("--data", default="pystdlib", help="data.source of the new run (docs/data.md)")
    im.add_argument("--tokenizer", help="bytes or a tokenizer.json path (default: the HF directory's tokenizer)")
    im.add_argument("--json", action="store_true")
    im.set_defaults(func=run_import)
