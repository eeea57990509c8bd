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
    rep = write_report(d)
    if args.json:
        print(dumps({"html": rep["html"], "md": rep["md"], "ranking": rep["ranking"], "summary": rep["summary"]},
                         default=float))
    else:
        print(f"report: {rep['html']}\n        {rep['md']}")
        print_ranking(rep["report"])
    return 0
