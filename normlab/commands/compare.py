"""``normlab compare SWEEP.yaml|--preset NAME``: run a sweep in parallel, store the results, write the report."""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

from normlab.errors import EXIT_INTERRUPTED, NormlabError
from normlab.io import dumps, from_disk_full_note
from normlab.presets import sweep_presets
from normlab.commands.tables import print_table
from normlab.safety import printable
from normlab.validate import int_in


PAIRED_TERMINAL_DROP = ("test", "smallest exact p", "exact p", "per-seed corr", "Welch p")
"""Columns of the paired-differences table left to report.md / report.html on the terminal (100 columns)."""


def print_ranking(rep: Any, title: str | None = None) -> None:
    """The ranking table on stdout (normlab.commands.tables: fits 100 columns)."""
    from normlab.report import table_cells

    head, rows = table_cells(rep)
    styles = ["bold green" if v.rank == 1 else ("red" if v.ci is None else None) for v in rep.variants]
    print_table(head, rows, title=title, styles=styles)


def print_lr(rep: Any) -> None:
    """The learning-rate ranking (a grid) and the paired differences, on stdout (normlab.commands.tables: fit 100
    columns); nothing without them."""
    from normlab.report import lrsection

    grid = rep.grid
    if grid is None:
        return
    if grid.is_grid:
        print_table(*lrsection.ranking_cells(grid), title="LR sensitivity ranking", left=lrsection.LEFT)
    if grid.paired:
        print_table(*lrsection.paired_cells(grid), title=f"Paired differences vs {grid.baseline}",
                    left=lrsection.LEFT, drop=PAIRED_TERMINAL_DROP)


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``30m``, ``2h``, ``1h30m`` -> seconds (> 0); anything else is an argparse error."""
    m = re.fullmatch(r"\s*(?:(\d+(?:\.\d+)?)h)?\s*(?:(\d+(?:\.\d+)?)m)?\s*(?:(\d+(?:\.\d+)?)s?)?\s*", text or "")
    if not m or not any(m.groups()):
        raise argparse.ArgumentTypeError(f"invalid duration {text!r}; allowed: seconds or e.g. 90s, 30m, 2h, 1h30m")
    h, mi, sec = (float(g) if g else 0.0 for g in m.groups())
    total = h * 3600 + mi * 60 + sec
    if total <= 0:
        raise argparse.ArgumentTypeError(f"duration must be > 0, got {text!r}")
    return total


def _execute(sweep: Any, out: Path, args: argparse.Namespace) -> Any:
    """Run ``sweep`` in ``out`` through the one entry (``normlab.experiments.run``): in rounds until decided when it
    has a sequential plan (the looks decided by normlab.decide.looks), else once."""
    from normlab.experiments.entry import run  # torch: not when the parser is built

    return run(sweep, out, executor=args.executor, workers=args.workers, address=args.address, stack=args.stack,
               budget_s=args.budget)


def _load(args: argparse.Namespace, source: str | None = None) -> Any:
    """The sweep (with ``--until-decided``'s plan added when it declares none; on ``source`` for a replication)."""
    from normlab.decide.plan import default_plan
    from normlab.experiments.sweep import load_sweep, parse_sweep

    sweep = load_sweep(args.sweep, preset=args.preset)
    if getattr(args, "overrides", None):
        sweep = with_overrides(sweep, args.overrides)
    raw = None
    if args.until_decided or args.max_seeds is not None:
        if not args.until_decided:
            raise NormlabError("--max-seeds needs --until-decided")
        if sweep.resolved.looks is None:
            raw = {**sweep.spec, "sequential": default_plan(len(sweep.resolved.seeds), args.max_seeds)}
        elif args.max_seeds is not None and args.max_seeds != sweep.resolved.looks[-1]:
            raise NormlabError(f"--max-seeds {args.max_seeds} contradicts the sweep's sequential plan (looks "
                               f"{sweep.resolved.looks}); change the sweep file instead")
    elif args.budget is not None and sweep.resolved.looks is None:
        raise NormlabError("--budget needs --until-decided (or a sequential: plan in the sweep)")
    if raw is not None:
        sweep = parse_sweep(raw, source=f"sweep '{sweep.name}'")
    if source is not None:
        from normlab.experiments.replication import replication_sweep

        sweep = replication_sweep(sweep, source)
    return sweep


def with_overrides(sweep: Any, overrides: list[str]) -> Any:
    """``sweep`` with ``--set KEY=VALUE`` items added to its ``set:`` (applied to every run; later items win), so
    they are part of the sweep's spec, its ``sweep.yaml`` and its hash. A key that a variant, an axis or the
    learning-rate grid sets is refused: there the sweep's own value would win for some runs."""
    from normlab.config import apply_overrides
    from normlab.experiments.sweep import parse_sweep
    from normlab.experiments.sweepfile import LR_KEY, flatten

    f = sweep.resolved  # typed: variants, axes, set
    added: dict[str, Any] = {}
    for item in overrides:
        added.update(flatten(apply_overrides({}, [item]), "--set"))
    for key in added:
        owner = next((f"variant '{name}'" for name, vset in f.variants if key in vset), None)
        if key in f.axes:
            owner = "an axis"
        if key == LR_KEY and sweep.lr_grid:
            owner = "its lr_grid"
        if owner:
            raise NormlabError(f"--set {key}: sweep '{sweep.name}' varies it ({owner}); --set applies to every run, "
                               "so it may only set keys the sweep does not vary (edit a copy of the sweep file)")
    return parse_sweep({**sweep.spec, "set": {**f.overrides, **added}}, source=f"sweep '{sweep.name}' with --set")


def print_decisions(rep: dict[str, Any]) -> None:
    """The sequential looks' outcome and each replication's verdicts, one line each (stdout)."""
    block = rep.get("sequential")
    if block:
        print(f"seeds until decided: {len(block['looks'])} look(s), {block['seeds_spent']} seeds, stopped: "
              f"{block['stopped']}")
        for c in block["decisions"]:
            print(printable(f"  {c['variant']} vs {c['baseline']} ({c['metric']}): {c['decision']}"))
    for r in rep.get("replication") or []:
        print(printable(f"replication on {r['source']}:"))
        for c in r["comparisons"]:
            print(printable(f"  {c['variant']} vs {c['baseline']} ({c['metric']}): {c['verdict']} "
                            f"({c['original']['decision']} / {c['replication']['decision']})"))


def run_compare(args: argparse.Namespace) -> int:
    from normlab.experiments.sweepdir import default_sweep_dir
    from normlab.experiments.sweep import slug
    from normlab.report import write_report

    sweep = _load(args)
    sources = [s for s in [args.replicate_on or sweep.resolved.replicate] if s]
    replicas = [(s, _load(args, s), f"replication/{slug(s)}") for s in sources]  # checked before anything runs
    for _, rsweep, _ in replicas:  # and its data: a source that cannot be read is refused before any training
        from normlab.experiments.replication import check_replication_data

        check_replication_data(rsweep)
    out = Path(args.out) if args.out else default_sweep_dir(sweep)
    if not args.out and args.overrides:  # another design than the file's: its own folder, named by its hash
        out = out.with_name(f"{out.name}-{sweep.hash[:8]}")
    try:
        outcome = _execute(sweep, out, args)
        rep_out = []
        for s, rsweep, rel in replicas:
            if outcome.status == "interrupted":
                break
            from normlab.report.sequential import record_replication

            record_replication(out, s, rel)
            routcome = _execute(rsweep, out / rel, args)
            write_report(out / rel)
            rep_out.append({"source": s, "sweep_dir": str(out / rel), "status": routcome.status,
                            "sequential": routcome.until_decided})
            outcome.status = routcome.status
            outcome.runs = outcome.runs + routcome.runs
    except KeyboardInterrupt:  # Ctrl-C before any worker started (data preparation, store setup)
        print(printable(f"interrupted before training started; re-run the same command to start {out}"),
              file=sys.stderr)
        return EXIT_INTERRUPTED
    counts = outcome.counts()
    base = {"sweep_dir": str(out), "sweep": sweep.name, "sweep_hash": sweep.hash, "status": outcome.status,
            "counts": counts, "trained": outcome.trained, "skipped": outcome.skipped, "workers": outcome.workers,
            "threads": outcome.threads, "executor": args.executor, "wall_s": outcome.wall_s,
            "packing": outcome.packing, "sweep_tokens_per_s": outcome.sweep_tokens_per_s}
    if outcome.until_decided is not None:
        base["until_decided"] = outcome.until_decided
    if replicas:
        base["replications"] = rep_out
    if outcome.status == "interrupted":
        msg = printable(f"interrupted; finished runs are stored in {out}. Re-run the same command to resume.")
        print(dumps(base) if args.json else msg, file=sys.stdout if args.json else sys.stderr)
        return EXIT_INTERRUPTED
    full = next((e for e in (from_disk_full_note(r.get("error")) for r in outcome.runs if r["status"] == "failed")
                 if e is not None), None)
    if full is not None:  # the documented one line (normlab.safety.os_error_line), exit 2; no report on a full disk
        raise full
    rep = write_report(out)
    failed = [r for r in outcome.runs if r["status"] not in ("completed", "diverged")]
    if args.json:
        print(dumps({**base, "report_html": rep["html"], "report_md": rep["md"], "ranking": rep["ranking"],
                     "summary": rep["summary"], "lr": rep["lr"], "sequential": rep["sequential"],
                     "replication": rep["replication"]}, default=float))
    else:
        print(f"\nreport: {printable(rep['html'])}\n        {printable(rep['md'])}")
        print_lr(rep["report"])
        if not (rep["report"].grid and rep["report"].grid.is_grid):
            print_ranking(rep["report"])
        for line in rep["summary"]:
            print(printable(f"- {line}"))
        print_decisions(rep)
    if failed:
        ids = ", ".join(r["run_id"] for r in failed)
        print(printable(f"{len(failed)} run(s) did not finish ({ids}); see {out / 'logs'}; re-run to retry them"),
              file=sys.stderr)
        return 1
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``normlab compare`` with their flags (called by ``normlab.cli.build_parser``)."""
    cp = sub.add_parser("compare", help="train many variants in parallel, store the results, write a report")
    cp.add_argument("sweep", nargs="?", help="sweep YAML file (docs/compare.md); or use --preset")
    cp.add_argument("--preset", help=f"a shipped sweep in normlab/configs/sweeps/ ({', '.join(sweep_presets())})")
    cp.add_argument("--out", help="sweep directory (default: runs/compare-<sweep name>, with --set "
                    "runs/compare-<sweep name>-<sweep hash>); re-run to resume")
    cp.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="override a config key in every run of the sweep, e.g. --set train.steps=50 (repeatable; "
                    "part of the sweep's hash; a key the sweep varies is refused)")
    cp.add_argument(
        "--workers", type=int_in(1, 1024), help="parallel worker processes (default: one per core, at most one per run)"
    )
    cp.add_argument("--executor", choices=["local", "ray"], default="local",
                    help="local worker processes (default) or Ray tasks on a cluster (docs/distributed.md)")
    cp.add_argument("--address", metavar="auto|HOST:PORT|ray://HOST:PORT",
                    help="the Ray cluster (with --executor ray): auto (the one 'ray start --head' started here), its "
                         "GCS address, or ray://HOST:PORT for the Ray client (default: RAY_ADDRESS or a new "
                         "one-machine cluster)")
    cp.add_argument("--until-decided", action="store_true",
                    help="run seeds in rounds, a look after each, until every primary comparison is decided "
                    "(Lan-DeMets O'Brien-Fleming-type alpha spending, Holm over the family; docs/compare.md)")
    cp.add_argument("--max-seeds", type=int_in(2, 1000), metavar="N",
                    help="with --until-decided: the seed cap (default: 4 rounds of the sweep's seeds)")
    cp.add_argument("--budget", type=parse_duration, metavar="DURATION",
                    help="with --until-decided: start no round that would end past this wall time (90s, 30m, 2h)")
    cp.add_argument("--replicate-on", metavar="SOURCE",
                    help="run the same declared design on this data source too (docs/data.md) and show each primary "
                    "conclusion on both; overrides the sweep's replicate:")
    cp.add_argument("--stack", choices=["auto", "on", "off"],
                    help="train runs of one architecture (a variant's seeds and learning rates) as one stacked model: "
                    "auto (on a CUDA device; off on CPU), on, off (default: the runs' train.stack; docs/compare.md)")
    cp.add_argument("--json", action="store_true", help="print one JSON object at the end (progress goes to stderr)")
    cp.set_defaults(func=run_compare)
