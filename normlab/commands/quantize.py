"""``normlab quantize``: simulated RTN quantization of a trained run (optional Hadamard rotation), written as a new
run directory (normlab/surgery; docs/surgery.md)."""

from __future__ import annotations

import argparse
import json


def run_quantize(args: argparse.Namespace) -> int:
    from normlab.surgery.run_quantize import quantize_run

    acts = None if args.acts == "none" else int(args.acts)
    r = quantize_run(args.run_dir, args.out, weights=args.weights, group=args.group, acts=acts, rotate=args.rotate,
                     max_tokens=args.max_tokens, batch_size=args.batch_size, seed=args.seed)
    if args.json:
        print(json.dumps(r, default=float))
        return 0
    from rich.console import Console
    from rich.table import Table

    title = (f"{args.run_dir} -> {r['out']}: W{r['weights']}{'' if acts is None else f'A{acts}'} {r['scheme']}, "
             f"rotate {r['rotate']} (simulated: fake-quant fp32)")
    table = Table("linear", "shape", "‖W-Wq‖²/‖W‖²", "input absmax", "absmax/median", "kurtosis", title=title)
    for name, s in r["layers"].items():
        a = s.get("act") or {}
        table.add_row(name, "x".join(map(str, s["shape"])), f"{s['rel_err']:.3g}", f"{a.get('absmax', 0):.3g}",
                      f"{a.get('outlier_ratio', 0):.3g}", f"{a.get('kurtosis', 0):.3g}")
    Console().print(table)
    rot = r.get("rotation")
    if rot:
        print(f"rotation: {rot['rotation']} after --to {rot['conversion']}; max |logit diff| before quantization "
              f"{rot['max_abs_logit_diff']:.3g} (tolerance {rot['tolerance']:g})")
    print(f"bits/byte {r['bpb_before']:.4f} -> {r['bpb_after']:.4f} ({r['bpb_increase']:+.4f}) on "
          f"{r['eval_tokens']:,} validation tokens; {r['note']}")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``normlab quantize`` with its flags (called by ``normlab.cli.build_parser``)."""
    from normlab.validate import int_in

    qz = sub.add_parser("quantize", help="simulated RTN quantization of a run (optional Hadamard rotation, QuaRot "
                        "style) -> a fake-quantized run directory and per-layer statistics")
    qz.add_argument("run_dir")
    qz.add_argument("--weights", type=int, required=True, choices=[8, 4, 3], help="weight bits")
    qz.add_argument(
        "--group", type=int_in(1, 2**20), help="quantize per group of G inputs (default: per output channel)"
    )
    qz.add_argument("--acts", choices=["8", "none"], default="none", help="per-token activation bits at linear inputs")
    qz.add_argument("--rotate", choices=["none", "hadamard"], default="none",
                    help="hadamard: exact conversion to parameter-free RMSNorm, then a randomized Hadamard rotation")
    qz.add_argument("--out", required=True, help="new run directory (must not exist or be empty)")
    qz.add_argument("--seed", type=int_in(0, 2**31 - 1), default=0, help="seed of the random signs of the rotation")
    qz.add_argument(
        "--max-tokens", type=int_in(1, 2**40), default=8192, help="validation tokens for the bits/byte change"
    )
    qz.add_argument("--batch-size", type=int_in(1, 2**16), default=16)
    qz.add_argument("--json", action="store_true")
    qz.set_defaults(func=run_quantize)
