"""``normlab report DIR [DIR ...]``: (re)write a sweep's report.html / report.md from its results store, or one
report comparing any run directories (normlab.report.rundirs)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from normlab.errors import NormlabError
from normlab.io import dumps
from normlab.validate import int_in


def run_report(args: argparse.Namespace) -> int:
    # matplotlib (the report) and compare's printers: not loaded by `normlab --help`
    from normlab.commands.compare import print_lr, print_ranking
    from normlab.report import write_report
    from normlab.report.rundirs import default_out, load_dirs

    dirs = [Path(d) for d in args.dirs]
    for d in dirs:
        if not d.is_dir():
            raise NormlabError(f"directory {d} does not exist (give a sweep directory or run directories)")
    if args.quantize or args.label_free:  # per-run surgery metrics
        from normlab.report.surgery_columns import measure_sweep

        if args.max_tokens < 1:
            raise NormlabError(f"--max-tokens must be >= 1, got {args.max_tokens}")
        for d in dirs:
            if (d / "results.sqlite").is_file():
                measure_sweep(d, quantize=args.quantize, label_free_scores=args.label_free, max_tokens=args.max_tokens,
                              log=lambda s: print(s, file=sys.stderr, flush=True))
    if len(dirs) == 1 and (dirs[0] / "results.sqlite").is_file() and not args.out:
        rep = write_report(dirs[0], baseline=args.baseline)
    else:
        out = Path(args.out) if args.out else default_out(dirs)
        if out.exists() and not out.is_dir():
            raise NormlabError(f"--out {out} exists and is not a directory")
        report = load_dirs(dirs, out, args.baseline)
        out.mkdir(parents=True, exist_ok=True)
        rep = write_report(out, rep=report)
    if args.json:
        print(dumps({"html": rep["html"], "md": rep["md"], "ranking": rep["ranking"], "summary": rep["summary"],
                     "lr": rep["lr"], "sequential": rep["sequential"], "replication": rep["replication"]},
                    default=float))
    else:
        print(f"report: {rep['html']}\n        {rep['md']}")
        print_lr(rep["report"])
        print_ranking(rep["report"])
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``normlab report`` with their flags (called by ``normlab.cli.build_parser``)."""
    rp = sub.add_parser("report", help="write report.html and report.md from a sweep's stored results, or compare "
                                       "any run directories (a single run gets its own page)")
    rp.add_argument("dirs", nargs="+", metavar="DIR", help="a sweep directory, or run / sweep directories to compare")
    rp.add_argument("--out", help="where the report goes (default: the sweep dir; one run: its own dir; several: "
                                  "runs/report-<hash>)")
    rp.add_argument("--baseline", metavar="VARIANT", help="the variant paired differences compare with "
                                                          "(default: the sweep's baseline:, else the first)")
    rp.add_argument("--quantize", action="store_true",
                    help="add bits/byte increase under W4 RTN and W4 + Hadamard per variant "
                         "(simulated; per run, cached)")
    rp.add_argument("--label-free", action="store_true",
                    help="add MaNo / Matrix Nuclear-Norm per variant and their correlation with the loss across runs")
    rp.add_argument(
        "--max-tokens", type=int_in(1, 2**40), default=8192, help="validation tokens for --quantize / --label-free"
    )
    rp.add_argument("--json", action="store_true")
    rp.set_defaults(func=run_report)
