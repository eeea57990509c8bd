"""``normlab extrapolate``: loss and bits-per-byte at ``factor x`` the training context, per position bucket.

Writes ``RUN_DIR/extrapolation.json`` and ``RUN_DIR/extrapolation.png``; ``--json`` prints one object whose
``results`` key holds the list of ``{factor, context, loss, bpb, buckets, ...}`` (see
``normlab.eval.extrapolation``). Evaluation-time overrides (``args.overrides``, e.g. ``model.lssa_reweight=true``;
see ``normlab.rundir.readers.apply_eval_overrides``) write ``extrapolation_overrides.json`` / ``.png`` instead.
"""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.table import Table

from normlab.commands.args import data_arg, eval_set_arg
from normlab.errors import NormlabError
from normlab.io import check_file_slot, check_inside, dumps, write_json
from normlab.safety import printable
from normlab.rundir.readers import open_config, open_run
from normlab.validate import float_in, int_in


def run_extrapolate(args: argparse.Namespace) -> int:
    from normlab.attention import check_attention_context  # torch: not loaded by `normlab --help`
    from normlab.eval.extrapolation import check_positions, extrapolate, parse_factors, plot_extrapolation

    factors = parse_factors(args.factors)
    if args.max_tokens < 0 or args.batch_size < 1 or not args.memory_gb > 0:
        raise NormlabError("--max-tokens must be >= 0, --batch-size >= 1 and --memory-gb > 0")
    cfg = open_config(args.run_dir)
    check_positions(factors, cfg.model.context, cfg.model.positions)  # before loading anything
    check_attention_context(cfg.model, max(max(1, round(f * cfg.model.context)) for f in factors))
    # at the training context; longer ones were checked above, per factor
    run = open_run(args.run_dir, overrides=args.overrides, source=args.data, split=args.split)
    mc, data, overrides = run.cfg.model, run.data, run.overrides
    rep = extrapolate(run.model, run.tokens, data.token_bytes, train_context=mc.context,
                      factors=factors, positions=mc.positions, attention=mc.attention,
                      max_tokens=args.max_tokens, memory_gb=args.memory_gb, batch_size=args.batch_size)
    rep.update({"split": args.split, "positions": mc.positions, "attention": mc.attention,
                "run_dir": str(args.run_dir), "weights": str(run.weights)})
    if overrides:
        rep["overrides"] = overrides
    rep.update(run.data_record)
    run_dir = run.run_dir
    stem = ("extrapolation_overrides" if overrides else "extrapolation") + run.suffix
    for suffix in (".json", ".png"):  # both slots checked before either is written
        check_file_slot(check_inside(run_dir, run_dir / f"{stem}{suffix}"))
    write_json(run_dir / f"{stem}.json", rep)
    plot_extrapolation(rep, run_dir / f"{stem}.png",
                       title=printable(f"{run_dir.name}: {rep['attention']} attention, {mc.positions} positions")
                       + (f" ({', '.join(overrides)})" if overrides else ""))
    if args.json:
        print(dumps(rep))
        return 0

    table = Table("factor", "context", "loss", "bits/byte", "tokens",
                  title=printable(f"{run_dir} length extrapolation ({args.split}, training context {mc.context})"))
    for r in rep["results"]:
        table.add_row(str(r["factor"]), str(r["context"]), f"{r['loss']:.4f}", f"{r['bpb']:.4f}",
                      f"{r['tokens']:,}")
    Console(markup=False).print(table)
    for s in rep["skipped"]:
        print(f"skipped factor {s['factor']} (context {s['context']}): {s['reason']}")
    print(printable(f"wrote {run_dir / (stem + '.json')} and {run_dir / (stem + '.png')}"))
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``normlab extrapolate`` with their flags (called by ``normlab.cli.build_parser``)."""
    x = sub.add_parser("extrapolate", help="loss and bits-per-byte at multiples of the training context")
    eval_set_arg(x)
    x.add_argument("run_dir")
    x.add_argument("--factors", default="1,2,4,8,16", help="comma-separated multiples of the training context")
    x.add_argument("--split", choices=["val", "test"], default="val")
    x.add_argument(
        "--max-tokens", type=int_in(0, 2**40), default=0, help="use only the first N tokens of the split (0 = all)"
    )
    data_arg(x)
    x.add_argument("--memory-gb", type=float_in(0, 2**20, lo_open=True), default=4.0,
                   help="skip factors whose one window needs more (estimate)")
    x.add_argument("--batch-size", type=int_in(1, 2**16), default=16,
                   help="windows per forward (lowered to fit --memory-gb)")
    x.add_argument("--json", action="store_true")
    x.set_defaults(func=run_extrapolate)
