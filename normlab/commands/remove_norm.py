"""``normlab remove-norm``: LayerNorm / RMSNorm removed from a trained run by fine-tuning, written as a new run
directory (normlab/surgery; docs/surgery.md)."""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.table import Table

from normlab.io import dumps
from normlab.validate import float_in, int_in


def run_remove_norm(args: argparse.Namespace) -> int:
    from normlab.surgery.remove_norm import remove_norm_run  # torch: not loaded by `normlab --help`

    r = remove_norm_run(args.run_dir, args.out, steps=args.steps, lr=args.lr, schedule=args.schedule,
                        data_source=args.data, max_tokens=args.max_tokens, batch_size=args.batch_size,
                        control=args.control, quiet=args.json)
    if args.json:
        print(dumps(r, default=float))
        return 0

    o = r["original"]
    table = Table("stage", "sites", "loss after removal", "after fine-tune", "Δ nats vs original", "Δ bits/byte",
                  title=f"{args.run_dir} -> {r['out']} (LayerNorm removal, {r['schedule']} schedule, "
                        f"{r['steps_per_stage']} steps per stage; original {o['loss']:.4f} nats/token, "
                        f"{o['bpb']:.4f} bits/byte)")
    for s in r["stages"]:
        tuned = s.get("after_finetune")
        table.add_row(f"{s['stage']} {s['label']}", str(len(s["sites"])), f"{s['after_removal']['loss']:.4f}",
                      f"{tuned['loss']:.4f}" if tuned else "-", f"{s['delta_nats']:+.4f}", f"{s['delta_bpb']:+.4f}")
    Console().print(table)
    line = f"final: Δ {r['delta_nats']:+.4f} nats/token, {r['delta_bpb']:+.4f} bits/byte vs the original"
    if r.get("control") and "delta_nats_vs_control" in r["control"]:
        c = r["control"]
        line += (f"; {c['delta_nats_vs_control']:+.4f} nats/token vs the LayerNorm model fine-tuned "
                 f"{c['steps']} steps alike")
    print(line + f"; no norm computes a statistic ({r['check']['norm_sites']} sites fixed)")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``normlab remove-norm`` with its flags (called by ``normlab.cli.build_parser``)."""
    rm = sub.add_parser("remove-norm", help="remove LayerNorm/RMSNorm by fine-tuning (fixed-scale schedule, "
                        "Heimersheim 2024) -> a norm-free run directory")
    rm.add_argument("run_dir")
    rm.add_argument("--out", required=True, help="new run directory (must not exist or be empty)")
    rm.add_argument("--steps", type=int_in(0, 10**7), default=100,
                    help="fine-tuning steps after each stage (0 = no fine-tuning)")
    rm.add_argument("--lr", type=float_in(0, 10, lo_open=True),
                    help="fine-tuning learning rate (default: the run's train.lr / 10)")
    rm.add_argument("--schedule", choices=["group", "site"], default="group",
                    help="group: all MLP-input norms, then all attention-input norms, then the final norm; "
                         "site: one norm at a time in that order")
    rm.add_argument("--data", metavar="SOURCE", help="fine-tune on this corpus (data.source) instead of the run's own")
    rm.add_argument("--control", action="store_true",
                    help="also fine-tune the original (with its norms) for the same total steps, for comparison")
    rm.add_argument(
        "--max-tokens", type=int_in(1, 2**40), default=16384, help="validation tokens for the loss of each stage"
    )
    rm.add_argument("--batch-size", type=int_in(1, 2**16), default=16)
    rm.add_argument("--json", action="store_true")
    rm.set_defaults(func=run_remove_norm)
