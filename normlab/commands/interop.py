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
