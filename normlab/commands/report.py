"""``normlab report SWEEP_DIR``: (re)write report.html / report.md from the results store and run directories."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from normlab.errors import NormlabError
from normlab.io import dumps


def run_report(args: argparse.Namespace) -> int:
    from normlab.commands.compare import print_ranking
    from normlab.report import write_report

    d = Path(args.sweep_dir)
    if not d.is_dir():
        raise NormlabError(f"sweep directory {d} does not exist")
    if getattr(args, "quantize", False) or getattr(args, "label_free", False):  # issue 13: per-run surgery metrics
        import sys

        from normlab.surgery.report_columns import measure_sweep

        if args.max_tokens < 1:
            raise NormlabError(f"--max-tokens must be >= 1, got {args.max_tokens}")
        measure_sweep(d, quantize=args.quantize, label_free_scores=args.label_free, max_tokens=args.max_tokens,
                      log=lambda s: print(s, file=sys.stderr, flush=True))
    rep = write_report(d)
    if args.json:
        print(dumps({"html": rep["html"], "md": rep["md"], "ranking": rep["ranking"], "summary": rep["summary"]},
                         default=float))
    else:
        print(f"report: {rep['html']}\n        {rep['md']}")
        print_ranking(rep["report"])
    return 0
