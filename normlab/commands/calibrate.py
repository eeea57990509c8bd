"""``normlab calibrate``: post-hoc temperature scaling (Guo et al. 2017) of a run's next-token probabilities.

The raw logits of the first ``--max-tokens`` scored tokens of a split (non-overlapping windows of the training
context) are split in two halves: ``T`` is fitted on the first half (NLL), and ECE (15 bins), NLL and Brier are
reported before (T = 1) and after on the second, held-out half. Writes ``RUN_DIR/calibration.json`` and
``RUN_DIR/reliability.png``.
"""

from __future__ import annotations

import argparse

from rich.console import Console
from rich.table import Table

from normlab.commands.args import data_arg
from normlab.errors import NormlabError
from normlab.io import check_file_slot, check_inside, dumps, write_json
from normlab.safety import printable
from normlab.rundir.readers import open_run
from normlab.validate import int_in

LOGITS_BUDGET = 1 << 30  # bytes of float32 logits held in memory (caps the token count for large vocabularies)


def run_calibrate(args: argparse.Namespace) -> int:
    # torch: not loaded by `normlab --help`
    from normlab.eval.calibration import (calibration_stats, collect_logits, ece_note, fit_temperature,
                                          reliability_diagram)

    if args.max_tokens < 0 or args.batch_size < 1:
        raise NormlabError("--max-tokens must be >= 0 and --batch-size >= 1")
    run = open_run(args.run_dir, source=args.data, split=args.split)
    cfg, sfx, run_dir = run.cfg, run.suffix, run.run_dir
    for name in (f"calibration{sfx}.json", f"reliability{sfx}.png"):  # both slots checked before either is written
        check_file_slot(check_inside(run_dir, run_dir / name))
    tokens = run.tokens
    avail = len(tokens) - 1
    cap = max(2, LOGITS_BUDGET // (4 * cfg.model.vocab_size))
    n = min(args.max_tokens or avail, avail, cap)
    if n < 2:
        raise NormlabError(f"--max-tokens {args.max_tokens}: need at least 2 scored tokens (one per half)")
    z, y = collect_logits(run.model, tokens, context=cfg.model.context, batch_size=args.batch_size, max_tokens=n)
    half = len(y) // 2
    temperature = fit_temperature(z[:half], y[:half])
    before = calibration_stats(z[half:], y[half:], 1.0)
    after = calibration_stats(z[half:], y[half:], temperature)
    m = {
        "ece_before": before["ece"], "ece_after": after["ece"], "temperature": temperature,
        "nll_before": before["nll"], "nll_after": after["nll"],
        "brier_before": before["brier"], "brier_after": after["brier"], "accuracy": before["accuracy"],
        "split": args.split, "context": cfg.model.context, "fit_tokens": half, "eval_tokens": len(y) - half,
        "bins": 15, "run_dir": str(args.run_dir), "weights": str(run.weights),
        "reliability_before": before["bins"], "reliability_after": after["bins"], **run.data_record,
    }
    why = ece_note(before, after, temperature)
    if why:
        m["ece_note"] = why
    if n < (args.max_tokens or avail) and n == cap:
        m["note"] = f"token count capped at {cap} to hold the logits in {LOGITS_BUDGET >> 20} MiB"
    write_json(run_dir / f"calibration{sfx}.json", m)
    reliability_diagram(before, after, run_dir / f"reliability{sfx}.png", temperature=temperature,
                        title=printable(f"{run_dir.name} ({args.split}, {len(y) - half} held-out tokens)"))
    if args.json:
        print(dumps(m))
        return 0

    table = Table("metric", "before (T = 1)", f"after (T = {temperature:.4f})",
                  title=printable(f"{run_dir} calibration ({args.split}: fit {half}, held-out {len(y) - half} tokens)"))
    for k in ("ece", "nll", "brier"):
        table.add_row(k, f"{m[k + '_before']:.4f}", f"{m[k + '_after']:.4f}")
    Console(markup=False).print(table)
    if why:
        print(f"note: {why}")
    print(printable(f"wrote {run_dir / f'calibration{sfx}.json'} and {run_dir / f'reliability{sfx}.png'}"))
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``normlab calibrate`` with their flags (called by ``normlab.cli.build_parser``)."""
    cb = sub.add_parser("calibrate", help="temperature scaling: ECE (15 bins), NLL, Brier before/after")
    cb.add_argument("run_dir")
    cb.add_argument("--split", choices=["val", "test"], default="val")
    cb.add_argument("--max-tokens", type=int_in(0, 2**40), default=0,
                    help="scored tokens: first half fits T, second half is held out (0 = the whole split)")
    data_arg(cb)
    cb.add_argument("--batch-size", type=int_in(1, 2**16), default=16)
    cb.add_argument("--json", action="store_true")
    cb.set_defaults(func=run_calibrate)
