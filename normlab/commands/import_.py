"""``normlab import HF_DIR --out RUN_DIR``: a local Hugging Face model directory as a normlab run (docs/interop.md).
The module is ``import_`` because ``import`` is a Python keyword."""

from __future__ import annotations

import argparse
import sys

from normlab.commands.export import print_result

SHOWN_KEYS = 8  # ignored config.json keys named in the note; hf_import.json lists them all


def ignored_note(keys: list[str]) -> str | None:
    """The one-line note naming the ``config.json`` keys the import dropped (None when there are none)."""
    if not keys:
        return None
    more = f" and {len(keys) - SHOWN_KEYS} more" if len(keys) > SHOWN_KEYS else ""
    return (f"note: config.json keys normlab does not map were ignored: {', '.join(keys[:SHOWN_KEYS])}{more} "
            "(hf_import.json lists them; the model is built from the keys docs/interop.md lists)")


def run_import(args: argparse.Namespace) -> int:
    from normlab.interop.hf_import import import_hf  # torch: not loaded by `normlab --help`

    r = import_hf(args.hf_dir, args.out, data=args.data, tokenizer=args.tokenizer)
    note = ignored_note(r["ignored_config_keys"])
    if note:
        print(note, file=sys.stderr)
    print_result(r, args.json, f"{args.hf_dir} (HF {r['arch']}) -> {r['out']}")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``normlab import`` with its flags (called by ``normlab.cli.build_parser``)."""
    im = sub.add_parser("import", help="turn a local Hugging Face model directory into a normlab run (exact, checked)")
    im.add_argument("hf_dir")
    im.add_argument("--out", required=True, help="new run directory (must not exist or be empty)")
    im.add_argument("--data", default="pystdlib", help="data.source of the new run (docs/data.md)")
    im.add_argument("--tokenizer", help="bytes or a tokenizer.json path (default: the HF directory's tokenizer)")
    im.add_argument("--json", action="store_true")
    im.set_defaults(func=run_import)
