"""``normlab diagnose RUN_DIR``: post-hoc diagnostics on a fixed sample of a split -> ``RUN_DIR/diagnostics.json``
and PNG plots in ``RUN_DIR/diagnostics/`` (docs/diagnostics.md)."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console
from rich.table import Table

from normlab.commands.args import data_arg
from normlab.errors import NormlabError
from normlab.io import check_dir, check_file_slot, check_inside, dumps, read_json_object, write_json
from normlab.safety import printable
from normlab.rundir.files import SUMMARY_FILE
from normlab.rundir.readers import open_run
from normlab.validate import int_in


def run_diagnose(args: argparse.Namespace) -> int:
    import torch  # not loaded by `normlab --help`

    from normlab.diagnostics.analyze import diagnose_model, sample_sequences, training_records, training_summary
    from normlab.diagnostics.plots import write_plots

    if args.sequences < 1 or (args.context is not None and args.context < 1):
        raise NormlabError(f"--sequences and --context must be >= 1, got {args.sequences} and {args.context}")
    run = open_run(args.run_dir, source=args.data, split=args.split, context=args.context, batch=args.sequences,
                   what="diagnose (all activations of the sample are kept)")
    run_dir, cfg, context = run.run_dir, run.cfg, run.context
    sfx = run.suffix
    plots_dir = check_dir(check_inside(run_dir, run_dir / f"diagnostics{sfx}"), "diagnostics directory")
    out_json = check_file_slot(check_inside(run_dir, run_dir / f"diagnostics{sfx}.json"))
    tokens = run.tokens
    idx, targets, starts = sample_sequences(tokens, args.sequences, context)
    if isinstance(cfg.train.threads, int):  # a count set in the run's config (auto / null: torch's default)
        torch.set_num_threads(cfg.train.threads)
    result = diagnose_model(run.model, idx, targets, ablate_residual=args.ablate_residual_sinks)
    records = training_records(run_dir)
    spikes = None
    if (run_dir / SUMMARY_FILE).is_file():
        spikes = read_json_object(run_dir / SUMMARY_FILE, "summary").get("loss_spikes")
    m = cfg.model
    out = {
        "run_dir": str(run_dir), "weights": str(run.weights), "split": args.split, "sequences": args.sequences,
        "context": context, "starts": starts,
        "model": {"placement": m.placement, "norm": m.norm, "depth": m.depth, "width": m.width, "heads": m.heads,
                  "positions": m.positions, "attention": m.attention},
        **result,
        "training": {**training_summary(records), "loss_spikes": spikes}, **run.data_record,
    }
    title = printable(f"{run_dir.name}: {m.placement}-{m.norm}, depth {m.depth}")  # plot titles
    out["plots"] = [f"diagnostics{sfx}/{n}" for n in write_plots(result, records, plots_dir, title)]
    write_json(out_json, out)
    if args.json:
        print(dumps(out))
        return 0
    _print_headline(out)
    return 0


def _fmt(v: float | None, spec: str = ".4g") -> str:
    return "n/a" if v is None else format(v, spec)


def _print_headline(d: dict) -> None:
    v, ms, s, e = d["variance"], d["massive"], d["sinks"], d["layer_effectiveness"]
    t = Table("block", "resid RMS", "resid var", "top |h|", "median |h|", "ratio", "angular dist", "skip Δloss",
              title=printable(f"{d['run_dir']} ({d['split']}, {d['sequences']} x {d['context']} tokens)"))
    t.add_row("embed", _fmt(v["rms"][0]), _fmt(v["var"][0]), "", "", "", "", "")
    for l, (mb, eb) in enumerate(zip(ms["blocks"], e["blocks"])):
        t.add_row(str(l), _fmt(v["rms"][l + 1]), _fmt(v["var"][l + 1]), _fmt(mb["top"][0]["value"]),
                  _fmt(mb["median"]), _fmt(mb["ratio"], ".1f") + (" *" if mb["flagged"] else ""),
                  _fmt(eb["angular_distance"], ".3f"), _fmt(eb["skip_loss_increase"], "+.4f"))
    con = Console(markup=False)
    con.print(t)
    lines = [f"log-variance slope {_fmt(v['log_var_slope'], '.4f')} per block "
             f"(x{_fmt(v['var_growth_per_block'], '.3f')} per block; block outputs only: "
             f"{_fmt(v['log_var_slope_blocks'], '.4f')}); base loss {e['base_loss']:.4f} nats/token",
             f"massive activations (|h| > 100 and > 1000x median): {'yes' if ms['any_flagged'] else 'none'}; "
             f"max top1/median {_fmt(ms['max_ratio'], '.1f')}"]
    if s.get("available"):
        lines.append(f"attention sinks (T={s['context']}, > {s['epsilon']}): sink rate {s['sink_rate']:.1%}, "
                     f"mean first-token importance {s['first_token_importance_mean']:.3f}")
    else:
        lines.append(f"attention sinks unavailable: {s['reason']}")
    rs = d["residual_sinks"]
    lines.append(f"residual sinks (|h| > {rs['ratio']:g}x median on >= {rs['persist']:.0%} of tokens): dims "
                 f"{rs['dims'] or 'none'}; largest share of mean(h^2) {rs['max_rms_share']:.1%}")
    ab = d.get("residual_sink_ablation")
    if ab:
        lines.append(f"clipping them to the median scale: loss {ab['base_loss']:.4f} -> {ab['clipped_loss']:.4f} "
                     f"({ab['increase']:+.4f} nats/token; as many other dims clipped: {ab['control_increase']:+.4f})")
    tr = d["training"]
    if tr.get("loss_spikes") is not None:
        lines.append(f"loss spikes during training: {tr['loss_spikes']['count']}")
    sfx = f"_data-{d['data']['content_hash'][:12]}" if d.get("data") else ""
    lines.append(printable(f"wrote {Path(d['run_dir']) / f'diagnostics{sfx}.json'} and {len(d['plots'])} plots"))
    for line in lines:
        con.print(line)


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``normlab diagnose`` with their flags (called by ``normlab.cli.build_parser``)."""
    dg = sub.add_parser("diagnose", help="diagnostics of a run: variance vs depth, massive activations, attention "
                        "sinks, layer effectiveness, norm parameters -> RUN_DIR/diagnostics.json + PNGs")
    dg.add_argument("run_dir")
    dg.add_argument("--split", choices=["val", "test"], default="val")
    dg.add_argument("--sequences", type=int_in(1, 4096), default=16, help="number of sequences in the fixed sample")
    dg.add_argument("--context", type=int_in(1, 2**20), help="tokens per sequence (default: the training context)")
    dg.add_argument("--ablate-residual-sinks", action="store_true",
                    help="also the loss with the residual-sink dims clipped to the median scale at every block "
                    "output (Qiu et al. 2026), against as many other dims clipped")
    data_arg(dg)
    dg.add_argument("--json", action="store_true")
    dg.set_defaults(func=run_diagnose)
