"""``normlab claims``: re-measure published normalization claims (normlab.experiments.claims).

Prints a table (claim, paper, metric, expected, measured mean ± raw 95% CI half-width, Holm-adjusted p, verdict)
and every revised definition, or, with ``--json``, one object whose ``claims`` list holds ``{claim, paper, metric,
expected, measured, ci, p, p_adj, verdict, raw_verdict, spec_hash, revised, ...}``. Results go to
``OUT/claims.json`` (default ``runs/claims-<budget>``); ``--budget full`` (or ``--docs``) also writes
``docs/claims.md`` under the current directory (``--docs FILE`` names another file). ``--render CLAIMS_JSON``
trains nothing: it judges a stored ``claims.json`` under the current rules and prints / writes the page from it.
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import sys
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from normlab.commands.stages import StageProgress
from normlab.errors import EXIT_INTERRUPTED, NormlabError, clip
from normlab.io import dumps, read_json
from normlab.safety import printable
from normlab.validate import int_in

DOCS = Path("docs") / "claims.md"  # relative to the current directory (the repo root in a checkout), never the package


def render(args: argparse.Namespace) -> int:
    """``--render CLAIMS_JSON``: judge a stored report under the current rules; print it, and with ``--docs``
    write the page. Nothing is trained or measured."""
    src = Path(args.render)
    stored = _stored(src, "--render")
    report = _judged(stored, src, "--render")
    confirmations = []
    if args.confirmation:
        from normlab.experiments.claims.budgets import confirmations_problem

        docs = [(_stored(Path(c), "--confirmation"), c) for c in args.confirmation]
        why = confirmations_problem(stored["budget_spec"], [(d, f"--confirmation {c}") for d, c in docs], str(src))
        if why:
            raise NormlabError(why)
        confirmations = [(_judged(d, Path(c), "--confirmation"), Path(c).name) for d, c in docs]
    report["render_command"] = " ".join(shlex.quote(p) for p in ["normlab", "claims", "--render", str(src)]
                                        + [x for c in args.confirmation or [] for x in ("--confirmation", c)]
                                        + (["--docs"] if args.docs else [])
                                        + ([args.docs] if isinstance(args.docs, str) else []))
    if args.docs:
        from normlab.experiments.claims.docs import write_docs

        write_docs(report, Path(args.docs) if isinstance(args.docs, str) else DOCS, tuple(confirmations))
    return show(report, args)


def _stored(src: Path, flag: str) -> dict:
    """A stored claims.json given to ``flag``, checked for the keys a page needs."""
    if not src.exists():  # a FIFO or directory is read_json's one line naming what it is
        raise NormlabError(f"{flag} {src}: no such file; give a claims.json written by normlab claims")
    stored = read_json(src, "claims results")
    need = ("claims", "budget", "budget_spec", "seeds", "command", "machine", "out")
    if not isinstance(stored, dict) or any(k not in stored for k in need) or not isinstance(stored["claims"], list):
        raise NormlabError(f"{flag} {src} is not a claims.json written by normlab claims (needs the keys "
                           f"{', '.join(need)})")
    if not isinstance(stored["budget_spec"], dict) or not all(isinstance(c, dict) for c in stored["claims"]):
        raise NormlabError(f"{flag} {src} is not a claims.json written by normlab claims (its budget_spec must be "
                           "an object and each entry of claims an object)")
    for i, c in enumerate(stored["claims"], 1):
        why = _numbers_problem(c)
        if why:
            raise NormlabError(f"{flag} {src}: claim {i} ({printable(c.get('name'))}): {why}")
    return stored


def _number(v: object) -> bool:
    """``v`` is null or an int/float a float holds (JSON allows integers beyond 1.8e308; NaN and inf are floats)."""
    if v is None or isinstance(v, float):
        return True
    return isinstance(v, int) and not isinstance(v, bool) and abs(v) <= 1.7976931348623157e308


def _numbers_problem(c: dict) -> str | None:
    """What is wrong with the numbers of one stored claim entry that the judge and the page compute with
    (``measured``, its ``ci`` and per-seed ``values``), or None; a missing key is left to the judge's message."""
    if not _number(c.get("measured")):
        return f"measured must be a number or null, got {clip(c['measured'], 60)}"
    ci = c.get("ci")
    if ci is not None and not (isinstance(ci, list) and len(ci) == 2 and all(x is not None and _number(x)
                                                                            for x in ci)):
        return f"ci must be null or a list of two numbers, got {clip(ci, 60)}"
    values = c.get("values", [])
    if not (isinstance(values, list) and all(_number(x) for x in values)):
        return f"values must be a list of numbers or nulls, got {clip(values, 60)}"
    return None


def _judged(stored: dict, src: Path, flag: str) -> dict:
    from normlab.experiments.claims.execution import judge
    try:
        return judge({**stored, "rendered_from": str(src)})
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise NormlabError(f"{flag} {src}: a claim entry is malformed ({e})") from None


def run_claims(args: argparse.Namespace) -> int:
    from normlab.experiments.claims import get_budget, run_suite, select
    if args.render:
        return render(args)
    if args.confirmation:
        raise NormlabError("--confirmation goes with --render FULL_CLAIMS_JSON (it adds a stored run's verdicts to "
                           "that page)")
    budget = get_budget(args.budget)
    claims = select(args.only or ",".join(budget.claims))  # a budget's own claims (scale) unless --only
    out = Path(args.out) if args.out else Path("runs") / f"claims-{budget.name}"
    workers = args.workers
    if workers is None and args.executor == "local":  # Ray: as many tasks as the cluster has CPUs
        workers = 1 if budget.name == "tiny" else min(2, os.cpu_count() or 1)
    if workers is not None and workers < 1:
        raise NormlabError(f"--workers must be >= 1, got {workers}")
    reuse = Path(args.reuse) if args.reuse else None
    if reuse is not None and not (reuse / "results.sqlite").is_file():
        raise NormlabError(f"--reuse {reuse} is not a sweep directory (no results.sqlite)")
    from normlab.experiments.executors import check_executor

    check_executor(args.executor, args.address)
    from normlab.experiments.claims.execution import SuiteStopped

    try:  # on a terminal: the training sweep's bar, then one of the claims measured (stage lines above it)
        with StageProgress("claims", len(claims), unit="claim") as say:
            report = run_suite(claims, budget, out, seeds=args.seeds, workers=workers, reuse=reuse,
                               executor=args.executor, address=args.address, progress=say)
    except SuiteStopped as e:  # interrupted (130) or runs failed (1): nothing measured
        if args.json:
            print(dumps({"status": "interrupted" if e.exit_code == EXIT_INTERRUPTED else "failed", "out": str(out),
                         "error": str(e), "failed": e.failed}))
        else:
            print(str(e), file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:  # Ctrl-C outside the runner: setup, waiting for --reuse runs, measuring
        print(f"interrupted; finished runs are kept in {out}; re-run the same command to resume", file=sys.stderr)
        return EXIT_INTERRUPTED
    report["command"] = command_line(args)
    report["machine"] = machine()
    from normlab.experiments.claims.execution import save_report

    saved = save_report(out / "claims.json", report)
    if budget.name == "full" or args.docs:
        from normlab.experiments.claims.docs import write_docs

        write_docs(saved, Path(args.docs) if isinstance(args.docs, str) else DOCS)
    show(saved, args)
    if not args.json:
        print(f"wrote {out / 'claims.json'} ({saved['trained_runs']} trained, {saved['reused_runs']} reused, "
              f"{saved['elapsed_s']:.0f} s)")
    return 0


def _cell(text: object) -> str:
    """``text`` for the terminal: control characters as escapes (``safety.printable``: a stored claims.json cannot
    move the cursor or recolour the screen), then rich markup escaped."""
    return escape(printable(text))


def show(report: dict, args: argparse.Namespace) -> int:
    """Print the judged ``report``: one JSON object (``--json``), or the verdict table, the reasons of the
    undecided claims and every revised definition."""
    if args.json:
        print(dumps(report, default=float))
        return 0
    from normlab.decide.vocab import HELD, colour
    from normlab.experiments.claims.docs import _p, measured_text

    t = Table("claim", "paper", "metric", "expected", "measured (mean ± raw 95% CI)", "p",
              _cell(f"{report.get('correction', 'holm')} p"), "verdict",
              title=_cell(f"normlab claims — budget {report['budget']}, {report['seeds']} seed(s)"))
    for c in report["claims"]:
        mark = ("" if c.get("current_definition", True) else " (earlier definition)") + (
            " (exploratory: revised after a verdict on these seeds)" if c.get("exploratory") else "")
        t.add_row(_cell(f"{c['name']}: {c['claim']}"), _cell(c["paper"]), _cell(c["metric"]), _cell(c["expected"]),
                  _cell(measured_text(c)), _p(c.get("p")), _p(c.get("p_adj")),
                  f"[{colour(c['verdict'])}]{_cell(c['verdict'] + mark)}[/]")
    con = Console()
    con.print(t)
    for c in report["claims"]:
        if c["verdict"] != HELD or c["n"] == 0:
            con.print(_cell(f"{c['name']}: {c['reason']}"))
    from normlab.experiments.claims.specs import CLAIMS

    shown = {c["name"] for c in report["claims"]}
    revs = [(c.name, r) for c in CLAIMS if c.name in shown for r in c.revised]
    if revs:
        con.print("Definitions revised (date, claim: what changed; why; verdict before):")
        for name, r in sorted(revs, key=lambda x: (x[1].date, x[0])):
            con.print(_cell(f"- {r.date}, {name}: {r.what}; why: {r.why}; verdict before: {r.verdict_before}"))
    return 0


def command_line(args: argparse.Namespace) -> str:
    """The ``normlab claims`` command that reproduces this result (from the parsed arguments)."""
    parts = ["normlab", "claims", "--budget", args.budget]
    if args.only:
        parts += ["--only", args.only]
    if args.seeds is not None:
        parts += ["--seeds", str(args.seeds)]
    if args.reuse:
        parts += ["--reuse", str(args.reuse)]
    if args.out:
        parts += ["--out", args.out]
    if args.workers is not None:
        parts += ["--workers", str(args.workers)]
    if args.docs:
        parts += ["--docs"] + ([args.docs] if isinstance(args.docs, str) and Path(args.docs) != DOCS else [])
    if args.executor != "local":
        parts += ["--executor", args.executor] + (["--address", args.address] if args.address else [])
    return " ".join(shlex.quote(p) for p in parts)


def machine() -> dict:
    import torch

    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(), "python": platform.python_version(), "torch": torch.__version__,
            "loadavg_at_end": [round(x, 2) for x in load] if load else None}


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``normlab claims`` with their flags (called by ``normlab.cli.build_parser``)."""
    cl = sub.add_parser("claims", help="re-measure published normalization claims with seeds and 95%% CIs")
    cl.add_argument("--only", metavar="NAME", help="run only these claims (comma-separated names)")
    cl.add_argument("--seeds", type=int_in(1, 1000), help="number of seeds (default: the budget's)")
    cl.add_argument("--budget", choices=["tiny", "quick", "full", "scale", "confirm", "followup", "rejudge",
                                         "frontier"],
                    default="quick",
                    help="tiny: seconds (tests); quick: < 15 min on 2 cores; full: about 1 h on 2 idle cores, "
                         "writes docs/claims.md; scale: the claims not decided at width 64, at 12 blocks of width "
                         "256 on a GPU (refused in one line without CUDA); confirm: full's runs on the fresh seed "
                         "block 6000-6004 for the claims revised after a verdict on seeds 0-4; followup: full's runs "
                         "on 12 seeds of the fresh block 7000-7011 for the claims whose verdicts differed between "
                         "two 5-seed confirmations (supersedes confirm's verdicts for them); frontier: full's runs on "
                         "the fresh block 23000-23004 for the claims of hyper-connections, mHC, nGPT, DeepNorm and "
                         "Derf (docs/streams.md)")
    cl.add_argument("--out", help="results and runs directory (default: runs/claims-<budget>); re-run to resume")
    cl.add_argument("--workers", type=int_in(1, 1024), help="parallel training processes (default: 2, tiny: 1)")
    cl.add_argument("--reuse", metavar="SWEEP_DIR", help="copy runs with exactly the same resolved config from this "
                                                          "sweep directory (e.g. the demo's) instead of training them")
    cl.add_argument("--executor", choices=["local", "ray"], default="local",
                    help="local processes (default) or Ray tasks on a cluster (docs/distributed.md)")
    cl.add_argument("--address", metavar="auto|HOST:PORT|ray://HOST:PORT",
                    help="the Ray cluster (with --executor ray): auto, HOST:PORT or ray://HOST:PORT")
    cl.add_argument("--docs", nargs="?", const=True, default=False, metavar="FILE",
                    help="also write the claims page: FILE, default docs/claims.md under the current directory "
                    "(always done for --budget full)")
    cl.add_argument("--render", metavar="CLAIMS_JSON",
                    help="train nothing: judge a stored claims.json under the current rules (Holm over the family, "
                    "margins, revisions) and print it; with --docs also write the page")
    cl.add_argument("--confirmation", metavar="CLAIMS_JSON", action="append",
                    help="with --render: a claims.json of the same budget on a fresh seed block (--budget confirm, "
                    "--budget followup with the confirmation it follows); repeatable; the page lists its "
                    "confirmatory verdict beside each exploratory one")
    cl.add_argument("--json", action="store_true")
    cl.set_defaults(func=run_claims)
