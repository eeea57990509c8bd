"""``normlab convert RUN_DIR --to rmsnorm|crmsnorm|folded``: an exact conversion, checked, as a new run directory."""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.table import Table

from normlab.errors import NormlabError
from normlab.io import dumps
from normlab.validate import int_in


def run_convert(args: argparse.Namespace) -> int:
    from normlab.convert import convert_run  # torch: not loaded by `normlab --help`

    if args.batch_size < 1:
        raise NormlabError(f"--batch-size must be >= 1, got {args.batch_size}")
    r = convert_run(args.run_dir, args.to, args.out, max_tokens=args.max_tokens, batch_size=args.batch_size)
    row = {k: r[k] for k in ("max_abs_logit_diff", "bpb_before", "bpb_after", "out", "kind")}
    if args.json:
        print(dumps(row))
        return 0

    title = f"{args.run_dir} -> {r['out']} ({r['norm_from']} -> {r['norm_to']}, {args.to})"
    table = Table("metric", "value", title=title)
    table.add_row("max_abs_logit_diff", f"{r['max_abs_logit_diff']:.3g}")
    table.add_row("bpb_before", f"{r['bpb_before']:.8f}")
    table.add_row("bpb_after", f"{r['bpb_after']:.8f}")
    table.add_row("folded sites", str(len(r["folded_sites"])))
    table.add_row("kept sites", ", ".join(r["kept_sites"]) or "-")
    table.add_row("params", f"{r['params_before']:,} -> {r['params_after']:,}")
    Console(markup=False).print(table)
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``normlab convert`` with their flags (called by ``normlab.cli.build_parser``)."""
    c = sub.add_parser(
        "convert", help="exact conversion of a Pre-LN run: to Pre-RMSNorm, Pre-CRMSNorm, or folded norms"
    )
    c.add_argument("run_dir")
    c.add_argument("--to", required=True, choices=["rmsnorm", "crmsnorm", "folded"],
                   help="rmsnorm / crmsnorm: Jiang et al. 2023; folded: norm gains (and eval-mode stats) into linears")
    c.add_argument("--out", help="new run directory (default: RUN_DIR-<to>; must not exist or be empty)")
    c.add_argument(
        "--max-tokens", type=int_in(1, 2**40), default=4096, help="validation tokens for the bits-per-byte check"
    )
    c.add_argument("--batch-size", type=int_in(1, 2**16), default=16)
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=run_convert)
