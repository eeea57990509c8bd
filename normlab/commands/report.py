"""``normlab report DIR [DIR ...]``: (re)write a sweep's report.html / report.md from its results store, or one
report comparing any run directories (normlab.report.rundirs)."""

from __future__ import annotations

import argparse
from pathlib import Path

from normlab.errors import NormlabError
from normlab.io import dumps


def run_report(args: argparse.Namespace) -> int:
    from normlab.commands.compare import print_lr, print_ranking
    from normlab.report import write_report
    from normlab.report.rundirs import default_out, load_dirs

    dirs = [Path(d) for d in args.dirs]
    for d in dirs:
        if not d.is_dir():
            raise NormlabError(f"directory {d} does not exist (give a sweep directory or run directories)")
    if getattr(args, "quantize", False) or getattr(args, "label_free", False):  # issue 13: per-run surgery metrics
        import sys

        from normlab.surgery.report_columns import measure_sweep

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
                     "lr": rep["lr"]}, default=float))
    else:
        print(f"report: {rep['html']}\n        {rep['md']}")
        print_lr(rep["report"])
        print_ranking(rep["report"])
    return 0
