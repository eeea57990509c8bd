"""``normlab quantize``: simulated RTN quantization of a trained run (optional Hadamard rotation), written as a new
run directory (normlab/surgery; docs/surgery.md)."""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.table import Table

from normlab.commands.stages import StageProgress
from normlab.io import dumps
from normlab.validate import float_in, int_in


def run_quantize(args: argparse.Namespace) -> int:
    from normlab.surgery.run_quantize import quantize_run, quantize_stages  # torch: not loaded by `normlab --help`

    acts = None if args.acts == "none" else int(args.acts)
    stages = quantize_stages(args.rotate, args.norm_tweak, args.linearity)
    with StageProgress("quantize", len(stages)) as say:  # on a terminal: stage lines and a bar on stderr
        r = quantize_run(args.run_dir, args.out, weights=args.weights, group=args.group, acts=acts,
                         rotate=args.rotate, max_tokens=args.max_tokens, batch_size=args.batch_size, seed=args.seed,
                         grid=args.grid, tweak=args.norm_tweak, tweak_samples=args.tweak_samples,
                         tweak_lr=args.tweak_lr, linearity=args.linearity, progress=say)
    if args.json:
        print(dumps(r, default=float))  # strict: an all-zero activation's outlier ratio is inf
        return 0

    title = (f"{args.run_dir} -> {r['out']}: W{r['weights']}{'' if acts is None else f'A{acts}'} {r['scheme']}, "
             f"rotate {r['rotate']} (simulated: fake-quant fp32)")
    table = Table("linear", "shape", "‖W-Wq‖²/‖W‖²", "input absmax", "absmax/median", "kurtosis", title=title)
    for name, s in r["layers"].items():
        a = s.get("act") or {}
        table.add_row(name, "x".join(map(str, s["shape"])), f"{s['rel_err']:.3g}", f"{a.get('absmax', 0):.3g}",
                      f"{a.get('outlier_ratio', 0):.3g}", f"{a.get('kurtosis', 0):.3g}")
    # as wide as the table needs (a layer name is never cut to fit an 80-column terminal; the terminal wraps)
    Console(width=max(Console().width, Console(width=10_000).measure(table).maximum)).print(table)
    rot = r.get("rotation")
    if rot:
        print(f"rotation: {rot['rotation']} after --to {rot['conversion']}; max |logit diff| before quantization "
              f"{rot['max_abs_logit_diff']:.3g} (tolerance {rot['tolerance']:g})")
    nt = r.get("norm_tweak")
    if nt:
        e = nt["output_error"]
        print(f"norm tweak ({nt['samples']} training-split windows, lr {nt['lr']:g}): output error calibration "
              f"{e['calibration']['before']:.3g} -> {e['calibration']['after']:.3g}, held-out "
              f"{e['held_out']['before']:.3g} -> {e['held_out']['after']:.3g}")
    lin = r.get("linearity")
    if lin:
        rows = ", ".join(f"W{x['bits']} {x['measured']:+.4f} vs {x['predicted']:+.4f}" for x in lin["rows"])
        print(f"linearity theorem ({lin['grid']} grid), measured vs predicted bits/byte increase: {rows}")
    print(f"bits/byte {r['bpb_before']:.4f} -> {r['bpb_after']:.4f} ({r['bpb_increase']:+.4f}) on "
          f"{r['eval_tokens']:,} validation tokens; {r['note']}")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``normlab quantize`` with its flags (called by ``normlab.cli.build_parser``)."""
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
    qz.add_argument("--grid", choices=["rtn", "higgs"], default="rtn",
                    help="rtn: round to nearest on a uniform grid; higgs: randomized Hadamard per group + Lloyd-Max "
                    "Gaussian grid (Malinovskii et al. 2024)")
    qz.add_argument("--norm-tweak", action="store_true",
                    help="Norm Tweaking (Li et al. 2024): fit each block's norm parameters so the quantized block's "
                    "channel statistics match the float block's, on windows of the training split")
    qz.add_argument("--tweak-samples", type=int_in(1, 4096), default=32, help="Norm Tweaking calibration windows")
    qz.add_argument("--tweak-lr", type=float_in(0, 10, lo_open=True), default=1e-3,
                    help="Norm Tweaking Adam learning rate")
    qz.add_argument("--linearity", action="store_true",
                    help="HIGGS linearity-theorem check: predicted vs measured bits/byte increase at 8, 4, 3 bits")
    qz.add_argument("--out", required=True, help="new run directory (must not exist or be empty)")
    qz.add_argument("--seed", type=int_in(0, 2**31 - 1), default=0,
                    help="seed of the random signs of the rotation, the HIGGS Hadamard and the linearity noise")
    qz.add_argument(
        "--max-tokens", type=int_in(1, 2**40), default=8192, help="validation tokens for the bits/byte change"
    )
    qz.add_argument("--batch-size", type=int_in(1, 2**16), default=16)
    qz.add_argument("--json", action="store_true")
    qz.set_defaults(func=run_quantize)
