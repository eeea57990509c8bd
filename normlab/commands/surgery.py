"""``normlab remove-norm`` and ``normlab quantize``: surgery on a trained run, written as a new run directory
(normlab/surgery; docs/surgery.md)."""

from __future__ import annotations

import argparse
import json


def run_remove_norm(args: argparse.Namespace) -> int:
    from normlab.surgery.remove_norm import remove_norm_run

    r = remove_norm_run(args.run_dir, args.out, steps=args.steps, lr=args.lr, schedule=args.schedule,
                        data_source=args.data, max_tokens=args.max_tokens, batch_size=args.batch_size,
                        control=args.control, quiet=args.json)
    if args.json:
        print(json.dumps(r, default=float))
        return 0
    from rich.console import Console
    from rich.table import Table

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

