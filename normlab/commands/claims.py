"""``normlab claims``: re-measure published normalization claims (normlab.experiments.claims).

Prints a table (claim, paper, metric, expected, measured mean ± 95% CI half-width, verdict) or, with ``--json``,
one object whose ``claims`` list holds ``{claim, paper, metric, expected, measured, ci, verdict, ...}``.
Results go to ``OUT/claims.json`` (default ``runs/claims-<budget>``); ``--budget full`` (or ``--docs``) also writes
``docs/claims.md`` under the current directory (``--docs FILE`` names another file).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shlex
import sys
from pathlib import Path

from normlab.errors import EXIT_INTERRUPTED

DOCS = Path("docs") / "claims.md"  # relative to the current directory (the repo root in a checkout), never the package


def _fmt(v: float | None) -> str:
    if v is None:
        return "n/a"
    a = abs(v)
    return f"{v:.2e}" if (a != 0 and (a < 1e-3 or a >= 1e4)) else f"{v:.4f}"


def measured_text(c: dict) -> str:
    if c["measured"] is None:
        return "n/a"
    if c.get("direction") == "exact":
        return f"{_fmt(c['measured'])} (max)"
    if c["ci"] is None:
        return f"{_fmt(c['measured'])} (n={c['n']})"
    half = (c["ci"][1] - c["ci"][0]) / 2
    return f"{_fmt(c['measured'])} ± {_fmt(half)}"


def run_claims(args: argparse.Namespace) -> int:
    from normlab.io import dumps
    from normlab.errors import NormlabError
    from normlab.experiments.claims import get_budget, run_suite, select

    budget = get_budget(args.budget)
    claims = select(args.only)
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

    try:
        report = run_suite(claims, budget, out, seeds=args.seeds, workers=workers, reuse=reuse,
                           executor=args.executor, address=args.address)
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
        write_docs(saved, Path(args.docs) if isinstance(args.docs, str) else DOCS)
    if args.json:
        print(dumps(report, default=float))
        return 0
    from rich.console import Console
    from rich.table import Table

    t = Table("claim", "paper", "metric", "expected", "measured (mean ± 95% CI)", "verdict",
              title=f"normlab claims — budget {budget.name}, {report['seeds']} seed(s)")
    colour = {"held": "green", "not held": "red", "inconclusive": "yellow"}
    from rich.markup import escape

    for c in report["claims"]:
        t.add_row(escape(f"{c['name']}: {c['claim']}"), escape(c["paper"]), escape(c["metric"]), escape(c["expected"]),
                  escape(measured_text(c)), f"[{colour[c['verdict']]}]{c['verdict']}[/]")
    con = Console()
    con.print(t)
    for c in report["claims"]:
        if c["verdict"] == "inconclusive" or c["n"] == 0:
            con.print(escape(f"{c['name']}: {c['reason']}"))
    con.print(f"wrote {out / 'claims.json'} ({report['trained_runs']} trained, {report['reused_runs']} reused, "
              f"{report['elapsed_s']:.0f} s)")
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


def claim_scale(c: dict) -> str:
    """Model width, blocks, steps and training tokens of the runs behind claim ``c`` (one seed's run directories,
    a grid variant's at every learning rate, read from their ``config.yaml``; tokens = steps x batch x grad_accum x
    context); ``n/a`` without runs."""
    from normlab.errors import NormlabError
    from normlab.rundir import open_config

    shapes: dict[tuple, None] = {}
    first = ((c.get("runs") or [{}])[0] or {}).values()  # variant -> run dir, or lr -> run dir for a grid variant
    for run_dir in [d for v in first for d in (v.values() if isinstance(v, dict) else [v])]:
        try:
            cfg = open_config(run_dir)
        except NormlabError:
            continue
        m, t = cfg.model, cfg.train
        tokens = t.steps * t.batch_size * t.grad_accum * m.context
        shapes[(m.width, m.depth, t.steps, tokens)] = None
    if not shapes:
        return "n/a"
    return "; ".join(f"width {w}, {d} blocks, {s} steps, {_count(tok)} tokens" for w, d, s, tok in shapes)


def _count(n: int) -> str:
    return f"{n / 1e6:.3g}M" if n >= 1e6 else f"{n / 1e3:.3g}k"


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def write_docs(report: dict, path: Path) -> None:
    from normlab.experiments.claims.specs import CLAIMS, grid_claim_names
    from normlab.io import write_text

    GRID_CLAIMS = grid_claim_names()

    meaning = {c.name: c.meaning for c in CLAIMS}
    provenance = {c.name: ([f"Source: {c.source}."] if c.source else [])
                  + ([f"Deviations: {c.deviations}"] if c.deviations else []) for c in CLAIMS}
    b = report["budget_spec"]
    m = report["machine"]
    date = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    lines = [
        "# Published claims re-measured at CPU scale",
        "",
        f"Budget **{report['budget']}**, {report['seeds']} seeds, written {date} by",
        "",
        f"    {report['command']}",
        "",
        *([f"> These are **{report['budget']}-budget** results, not the full budget: `normlab claims --budget full` "
           "had not finished when this file was written. Re-run it (complete runs are reused) to replace this file.",
           ""] if report["budget"] != "full" else []),
        f"Machine: {m['platform']}, {m['cpu_count']} cores, Python {m['python']}, torch {m['torch']}; load average "
        f"at the end {m['loadavg_at_end']} (the machine was shared with other jobs). Wall time {report['elapsed_s'] / 60:.1f} "
        f"min ({report['trained_runs']} runs trained, {report['reused_runs']} reused).",
        "",
        f"Setup: corpus `{b['source']}` (bytes tokenizer), context {b['context']}, width {b['width']}, {b['heads']} heads; "
        f"shallow models {b['depth']} blocks, depth studies {b['deep_depth']} blocks; {b['steps']} steps of batch "
        f"{b['batch_size']}, peak LR {b['lr']}, warm-up {b['warmup_steps']} steps (except where a claim says), AdamW. "
        "One run per variant and seed (seeds 0..n-1 drive init and data order); runs are shared between claims.",
        "",
        *([f"Learning-rate sweep claims (Wortsman et al. 2023, arXiv:2309.14322): every grid variant is trained at "
           f"each peak LR in {', '.join(f'{x:g}' for x in b['grid_lrs'])}, {b['grid_depth']} blocks, {b['grid_steps']} "
           f"steps, warm-up {b['grid_warmup']} steps (except where a claim says); LR sensitivity = mean over the "
           "grid of min(L, L_init) - L* in bits/byte (a diverged run scores its loss at initialisation).", ""]
          if "grid_lrs" in b and any(c["name"] in GRID_CLAIMS for c in report["claims"]) else []),
        "Measured = mean over seeds ± half-width of the 95% Student-t interval (t quantile with n-1 degrees of "
        "freedom). Verdict: **held** when the CI excludes the no-effect value on the claimed side, **not held** "
        "when it excludes it on the other side, **inconclusive** otherwise (equivalence claims: CI inside / "
        "outside the margin; exactness claims: every seed within the tolerance). A claim that does not hold at "
        "this scale is a finding about small models, not a refutation of the paper.",
        "",
        "Scale: the width, blocks, steps and training tokens of the runs behind each claim (from their "
        "config.yaml; tokens = steps x batch x context).",
        "",
        "| # | claim | paper | metric | scale | expected | measured | verdict |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for i, c in enumerate(report["claims"], 1):
        cells = [str(i), f"{c['claim']} (`{c['name']}`)", c["paper"], c["metric"], claim_scale(c), c["expected"],
                 measured_text(c), f"**{c['verdict']}**"]
        lines.append("| " + " | ".join(x.replace("|", "\\|") for x in cells) + " |")
    lines += ["", "Caveats: these are tiny byte-level models trained for a few hundred steps (validation bits/byte "
              "of roughly 3-4, far from converged; validation = a fixed sample of windows spread over the split), "
              "so every verdict is about this scale and budget; 95% intervals over "
              f"{report['seeds']} seeds are wide, and a claim can flip with more steps. Each claim follows its "
              "paper's recipe where the scale allows (DyT: the authors' LLaMA recipe with an untied head; LSSAR "
              "trained with re-weighting, the eval-only switch a separate measurement; PowerNorm groups = heads; "
              "LINA's input convolution); each section below names its source and its deviations. The per-seed "
              "details show the underlying numbers (e.g. both bits/byte values, both slopes).",
              "", "## What each metric means, and the per-seed values", ""]
    for c in report["claims"]:
        vals = ", ".join(_fmt(v) for v in c["values"]) if c["values"] else "none"
        ci = f"[{_fmt(c['ci'][0])}, {_fmt(c['ci'][1])}]" if c["ci"] else "n/a"
        lines += [f"### `{c['name']}` — {c['verdict']}", "", meaning.get(c["name"], ""), "",
                  *(sum(([x, ""] for x in provenance.get(c["name"], [])), [])),
                  f"Per-seed values: {vals}; 95% CI {ci}; {c['reason']}.", ""]
        details = [_flat(d) for d in c.get("details") or []]
        c = {**c, "details": details}
        keys = sorted({k for d in details for k, v in d.items() if isinstance(v, (int, float))})
        if keys:
            lines.append("Per-seed details: " + "; ".join(
                f"{k} = " + ", ".join(_fmt(d.get(k)) if isinstance(d.get(k), (int, float)) else "n/a"
                                     for d in c["details"]) for k in keys) + ".")
            lines.append("")
    lines += [f"Raw results: `{report['out']}/claims.json` (per-seed values, details and run directories).", ""]
    write_text(path, "\n".join(lines))


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``normlab claims`` with their flags (called by ``normlab.cli.build_parser``)."""
    from normlab.validate import int_in

    cl = sub.add_parser("claims", help="re-measure published normalization claims with seeds and 95%% CIs")
    cl.add_argument("--only", metavar="NAME", help="run only these claims (comma-separated names)")
    cl.add_argument("--seeds", type=int_in(1, 1000), help="number of seeds (default: the budget's)")
    cl.add_argument("--budget", choices=["tiny", "quick", "full"], default="quick",
                    help="tiny: seconds (tests); quick: < 15 min on 2 cores; full: about 1 h on 2 idle cores, writes docs/claims.md")
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
    cl.add_argument("--json", action="store_true")
    cl.set_defaults(func=run_claims)
