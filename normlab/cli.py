"""``normlab`` command line: thin subcommands over the library.

Every user error is one line on stderr and exit status 2 (``--debug`` shows the traceback); every command that
prints results takes ``--json`` and then prints exactly one JSON object on stdout.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

from normlab.errors import EXIT_BAD_INPUT, NormlabError
from normlab.validate import MAX_SEED, float_in, int_in


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2 (argparse prints usage + message)
        message = re.sub(r"^argument (--[\w-]+)(?:/\S+)?: must", r"\1 must", message)  # a range flag (validate.py)
        print(f"error: {message} (see '{self.prog} --help')", file=sys.stderr)
        raise SystemExit(EXIT_BAD_INPUT)


def _emit(obj: Any, as_json: bool, human: str) -> None:
    if as_json:
        from normlab.io import dumps

        print(dumps(obj, default=float))
    else:
        print(human)


def cmd_train(args: argparse.Namespace) -> int:
    from normlab.commands.train import run_train

    return run_train(args)


def cmd_eval(args: argparse.Namespace) -> int:
    from normlab.commands.evaluate import run_eval

    return run_eval(args)


def cmd_convert(args: argparse.Namespace) -> int:
    from normlab.commands.convert import run_convert

    return run_convert(args)


def cmd_remove_norm(args: argparse.Namespace) -> int:
    from normlab.commands.surgery import run_remove_norm

    return run_remove_norm(args)


def cmd_quantize(args: argparse.Namespace) -> int:
    from normlab.commands.surgery import run_quantize

    return run_quantize(args)


def cmd_export(args: argparse.Namespace) -> int:
    from normlab.commands.interop import run_export

    return run_export(args)


def cmd_import(args: argparse.Namespace) -> int:
    from normlab.commands.interop import run_import

    return run_import(args)


def cmd_generate(args: argparse.Namespace) -> int:
    from normlab.commands.generate import run_generate

    return run_generate(args)


def cmd_calibrate(args: argparse.Namespace) -> int:
    from normlab.commands.calibrate import run_calibrate

    return run_calibrate(args)


def cmd_extrapolate(args: argparse.Namespace) -> int:
    from normlab.commands.extrapolate import run_extrapolate

    return run_extrapolate(args)


def cmd_diagnose(args: argparse.Namespace) -> int:
    from normlab.commands.diagnose import run_diagnose

    return run_diagnose(args)


def cmd_compare(args: argparse.Namespace) -> int:
    from normlab.commands.compare import run_compare

    return run_compare(args)


def cmd_runs(args: argparse.Namespace) -> int:
    from normlab.commands.runs import run_runs

    return run_runs(args)


def cmd_report(args: argparse.Namespace) -> int:
    from normlab.commands.report import run_report

    return run_report(args)


def cmd_scaling(args: argparse.Namespace) -> int:
    from normlab.commands.scaling import run_scaling

    return run_scaling(args)


def cmd_claims(args: argparse.Namespace) -> int:
    from normlab.commands.claims import run_claims

    return run_claims(args)


def cmd_norms(args: argparse.Namespace) -> int:
    from normlab.norms import list_norms

    rows = list_norms()
    if args.json:
        print(json.dumps({"norms": rows}))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table("name", "description", "paper")
    for r in rows:
        table.add_row(r["name"], r["description"], r["paper"])
    Console(markup=False).print(table)
    return 0


class _Version(argparse.Action):
    """``--version``, computed only when asked (the git lookup costs a subprocess)."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        from normlab.provenance import version_string

        print(f"normlab {version_string()}")
        raise SystemExit(0)


def _data_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", metavar="SOURCE", help="score another corpus (any data.source) with the run's own "
                   "tokenizer; results go to files suffixed _data-<content hash> (default: the run's corpus, "
                   "refused if it changed since training)")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="normlab", description="Normalization lab for transformer language models.")
    p.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    p.add_argument("--version", action=_Version, nargs=0,
                   help="print normlab's version (and git commit when run from a checkout) and exit")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    t = sub.add_parser("train", help="train a model from a YAML config or preset")
    t.add_argument("config", nargs="?", help="YAML file or preset name (shipped in normlab/configs/: tiny, small, dyt)")
    t.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key, e.g. --set model.norm=rmsnorm (repeatable)")
    t.add_argument("--out", help="run directory (default: runs/<config>-<hash>)")
    t.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its last checkpoint")
    t.add_argument("--init-from", metavar="RUN_DIR",
                   help="start from RUN_DIR's weights (fine-tune / continue with a changed config of equal shapes)")
    t.add_argument("--nproc", type=int_in(1, 4096), metavar="N",
                   help="data-parallel on N local processes (torchrun + DDP; docs/distributed.md)")
    t.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    t.set_defaults(func=cmd_train)

    e = sub.add_parser("eval", help="evaluate a run: loss, bits-per-byte, perplexities")
    e.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="evaluation-time key only, e.g. model.lssa_reweight=true")
    e.add_argument("run_dir")
    e.add_argument("--split", choices=["val", "test"], default="val")
    e.add_argument("--context", type=int_in(1, 2**20), help="window length (default: the training context)")
    e.add_argument("--stride", type=int_in(1, 2**20), help="sliding-window stride (default: context = non-overlapping)")
    e.add_argument("--batch-size", type=int_in(1, 2**16), default=16)
    _data_arg(e)
    e.add_argument("--label-free", action="store_true",
                   help="also MaNo (Xie et al. 2024) and Matrix Nuclear-Norm (Li et al. 2024) scores, no labels used")
    e.add_argument("--max-tokens", type=int_in(0, 2**40), default=0,
                   help="score only the first N tokens (0 = all; with --documents: whole documents up to N tokens)")
    e.add_argument("--documents", action="store_true",
                   help="harness-exact mode: each document scored separately (lm-eval loglikelihood_rolling)")
    e.add_argument("--doc-start", type=int_in(0, 2**31), metavar="ID",
                   help="with --documents: token id that conditions each document's first token "
                        "(default: an imported model's bos/eos token, else the newline token)")
    e.add_argument("--json", action="store_true")
    e.set_defaults(func=cmd_eval)

    c = sub.add_parser("convert", help="exact conversion of a Pre-LN run: to Pre-RMSNorm, Pre-CRMSNorm, or folded norms")
    c.add_argument("run_dir")
    c.add_argument("--to", required=True, choices=["rmsnorm", "crmsnorm", "folded"],
                   help="rmsnorm / crmsnorm: Jiang et al. 2023; folded: norm gains (and eval-mode stats) into linears")
    c.add_argument("--out", help="new run directory (default: RUN_DIR-<to>; must not exist or be empty)")
    c.add_argument("--max-tokens", type=int_in(1, 2**40), default=4096, help="validation tokens for the bits-per-byte check")
    c.add_argument("--batch-size", type=int_in(1, 2**16), default=16)
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=cmd_convert)

    rm = sub.add_parser("remove-norm", help="remove LayerNorm/RMSNorm by fine-tuning (fixed-scale schedule, "
                        "Heimersheim 2024) -> a norm-free run directory")
    rm.add_argument("run_dir")
    rm.add_argument("--out", required=True, help="new run directory (must not exist or be empty)")
    rm.add_argument("--steps", type=int_in(0, 10**7), default=100, help="fine-tuning steps after each stage (0 = no fine-tuning)")
    rm.add_argument("--lr", type=float_in(0, 10, lo_open=True), help="fine-tuning learning rate (default: the run's train.lr / 10)")
    rm.add_argument("--schedule", choices=["group", "site"], default="group",
                    help="group: all MLP-input norms, then all attention-input norms, then the final norm; "
                         "site: one norm at a time in that order")
    rm.add_argument("--data", metavar="SOURCE", help="fine-tune on this corpus (data.source) instead of the run's own")
    rm.add_argument("--control", action="store_true",
                    help="also fine-tune the original (with its norms) for the same total steps, for comparison")
    rm.add_argument("--max-tokens", type=int_in(1, 2**40), default=16384, help="validation tokens for the loss of each stage")
    rm.add_argument("--batch-size", type=int_in(1, 2**16), default=16)
    rm.add_argument("--json", action="store_true")
    rm.set_defaults(func=cmd_remove_norm)

    qz = sub.add_parser("quantize", help="simulated RTN quantization of a run (optional Hadamard rotation, QuaRot "
                        "style) -> a fake-quantized run directory and per-layer statistics")
    qz.add_argument("run_dir")
    qz.add_argument("--weights", type=int, required=True, choices=[8, 4, 3], help="weight bits")
    qz.add_argument("--group", type=int_in(1, 2**20), help="quantize per group of G inputs (default: per output channel)")
    qz.add_argument("--acts", choices=["8", "none"], default="none", help="per-token activation bits at linear inputs")
    qz.add_argument("--rotate", choices=["none", "hadamard"], default="none",
                    help="hadamard: exact conversion to parameter-free RMSNorm, then a randomized Hadamard rotation")
    qz.add_argument("--out", required=True, help="new run directory (must not exist or be empty)")
    qz.add_argument("--seed", type=int_in(0, 2**31 - 1), default=0, help="seed of the random signs of the rotation")
    qz.add_argument("--max-tokens", type=int_in(1, 2**40), default=8192, help="validation tokens for the bits/byte change")
    qz.add_argument("--batch-size", type=int_in(1, 2**16), default=16)
    qz.add_argument("--json", action="store_true")
    qz.set_defaults(func=cmd_quantize)

    ex = sub.add_parser("export", help="write a run as a Hugging Face transformers model directory (exact, checked)")
    ex.add_argument("run_dir")
    ex.add_argument("--to", required=True, choices=["hf"], help="target format (hf: transformers)")
    ex.add_argument("--out", required=True, help="output directory (must not exist or be empty)")
    ex.add_argument("--json", action="store_true")
    ex.set_defaults(func=cmd_export)

    im = sub.add_parser("import", help="turn a local Hugging Face model directory into a normlab run (exact, checked)")
    im.add_argument("hf_dir")
    im.add_argument("--out", required=True, help="new run directory (must not exist or be empty)")
    im.add_argument("--data", default="pystdlib", help="data.source of the new run (docs/data.md)")
    im.add_argument("--tokenizer", help="bytes or a tokenizer.json path (default: the HF directory's tokenizer)")
    im.add_argument("--json", action="store_true")
    im.set_defaults(func=cmd_import)

    g = sub.add_parser("generate", help="sample a continuation of a prompt (tokens stream to stdout)")
    g.add_argument("run_dir")
    g.add_argument("--prompt", required=True, help="text to continue")
    g.add_argument("--max-new-tokens", type=int_in(0, 100_000), default=200)
    g.add_argument("--temperature", type=float, default=1.0, help="0 = greedy")
    g.add_argument("--top-k", type=int_in(1, 2**31), help="keep the k most likely tokens")
    g.add_argument("--top-p", type=float, help="nucleus: smallest set with cumulative probability >= p")
    g.add_argument("--min-p", type=float, help="keep tokens with p >= min_p * p_max")
    g.add_argument("--top-nsigma", type=float,
                   help="top-nσ (Tang et al. 2024): keep logits >= max - n*std (1.0 is the paper's default)")
    g.add_argument("--seed", type=int_in(0, MAX_SEED), default=0)
    g.add_argument("--json", action="store_true", help="no streaming; print one JSON object at the end")
    g.set_defaults(func=cmd_generate)

    cb = sub.add_parser("calibrate", help="temperature scaling: ECE (15 bins), NLL, Brier before/after")
    cb.add_argument("run_dir")
    cb.add_argument("--split", choices=["val", "test"], default="val")
    cb.add_argument("--max-tokens", type=int_in(0, 2**40), default=0,
                    help="scored tokens: first half fits T, second half is held out (0 = the whole split)")
    _data_arg(cb)
    cb.add_argument("--batch-size", type=int_in(1, 2**16), default=16)
    cb.add_argument("--json", action="store_true")
    cb.set_defaults(func=cmd_calibrate)

    x = sub.add_parser("extrapolate", help="loss and bits-per-byte at multiples of the training context")
    x.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="evaluation-time key only, e.g. model.lssa_reweight=true")
    x.add_argument("run_dir")
    x.add_argument("--factors", default="1,2,4,8,16", help="comma-separated multiples of the training context")
    x.add_argument("--split", choices=["val", "test"], default="val")
    x.add_argument("--max-tokens", type=int_in(0, 2**40), default=0, help="use only the first N tokens of the split (0 = all)")
    _data_arg(x)
    x.add_argument("--memory-gb", type=float_in(0, 2**20, lo_open=True), default=4.0, help="skip factors whose one window needs more (estimate)")
    x.add_argument("--batch-size", type=int_in(1, 2**16), default=16, help="windows per forward (lowered to fit --memory-gb)")
    x.add_argument("--json", action="store_true")
    x.set_defaults(func=cmd_extrapolate)

    dg = sub.add_parser("diagnose", help="diagnostics of a run: variance vs depth, massive activations, attention "
                        "sinks, layer effectiveness, norm parameters -> RUN_DIR/diagnostics.json + PNGs")
    dg.add_argument("run_dir")
    dg.add_argument("--split", choices=["val", "test"], default="val")
    dg.add_argument("--sequences", type=int_in(1, 4096), default=16, help="number of sequences in the fixed sample")
    dg.add_argument("--context", type=int_in(1, 2**20), help="tokens per sequence (default: the training context)")
    _data_arg(dg)
    dg.add_argument("--json", action="store_true")
    dg.set_defaults(func=cmd_diagnose)

    cp = sub.add_parser("compare", help="train many variants in parallel, store the results, write a report")
    cp.add_argument("sweep", nargs="?", help="sweep YAML file (docs/compare.md); or use --preset")
    cp.add_argument("--preset", help="a shipped sweep in normlab/configs/sweeps/ (quick, depth, attention, dyt, scaling)")
    cp.add_argument("--out", help="sweep directory (default: runs/compare-<sweep name>); re-run to resume")
    cp.add_argument("--workers", type=int_in(1, 1024), help="parallel worker processes (default: one per core, at most one per run)")
    cp.add_argument("--executor", choices=["local", "ray"], default="local",
                    help="local worker processes (default) or Ray tasks on a cluster (docs/distributed.md)")
    cp.add_argument("--address", metavar="HOST:PORT", help="the Ray cluster (with --executor ray; default: "
                    "RAY_ADDRESS or a new one-machine cluster)")
    cp.add_argument("--json", action="store_true", help="print one JSON object at the end (progress goes to stderr)")
    cp.set_defaults(func=cmd_compare)

    rn = sub.add_parser("runs", help="list the runs of a sweep directory")
    rn.add_argument("sweep_dir")
    rn.add_argument("--format", choices=["table", "csv", "json"], default="table")
    rn.add_argument("--json", action="store_true", help="same as --format json")
    rn.set_defaults(func=cmd_runs)

    rp = sub.add_parser("report", help="write report.html and report.md from a sweep's stored results, or compare "
                                       "any run directories (a single run gets its own page)")
    rp.add_argument("dirs", nargs="+", metavar="DIR", help="a sweep directory, or run / sweep directories to compare")
    rp.add_argument("--out", help="where the report goes (default: the sweep dir; one run: its own dir; several: "
                                  "runs/report-<hash>)")
    rp.add_argument("--baseline", metavar="VARIANT", help="the variant paired differences compare with "
                                                          "(default: the sweep's baseline:, else the first)")
    rp.add_argument("--quantize", action="store_true",
                    help="add bits/byte increase under W4 RTN and W4 + Hadamard per variant (simulated; per run, cached)")
    rp.add_argument("--label-free", action="store_true",
                    help="add MaNo / Matrix Nuclear-Norm per variant and their correlation with the loss across runs")
    rp.add_argument("--max-tokens", type=int_in(1, 2**40), default=8192, help="validation tokens for --quantize / --label-free")
    rp.add_argument("--json", action="store_true")
    rp.set_defaults(func=cmd_report)

    sc = sub.add_parser("scaling", help="fit L(N) = E + A N^-alpha per variant of a size sweep: forecasts, "
                        "crossovers, signal-to-noise")
    sc.add_argument("sweep_dir")
    sc.add_argument("--json", action="store_true")
    sc.set_defaults(func=cmd_scaling)

    cl = sub.add_parser("claims", help="re-measure published normalization claims with seeds and 95%% CIs")
    cl.add_argument("--only", metavar="NAME", help="run only these claims (comma-separated names)")
    cl.add_argument("--seeds", type=int_in(1, 1000), help="number of seeds (default: the budget's)")
    cl.add_argument("--budget", choices=["tiny", "quick", "full"], default="quick",
                    help="tiny: seconds (tests); quick: < 15 min on 2 cores; full: ~30 min, writes docs/claims.md")
    cl.add_argument("--out", help="results and runs directory (default: runs/claims-<budget>); re-run to resume")
    cl.add_argument("--workers", type=int_in(1, 1024), help="parallel training processes (default: 2, tiny: 1)")
    cl.add_argument("--reuse", metavar="SWEEP_DIR", help="copy runs with exactly the same resolved config from this "
                                                          "sweep directory (e.g. the demo's) instead of training them")
    cl.add_argument("--executor", choices=["local", "ray"], default="local",
                    help="local processes (default) or Ray tasks on a cluster (docs/distributed.md)")
    cl.add_argument("--address", metavar="HOST:PORT", help="the Ray cluster (with --executor ray)")
    cl.add_argument("--docs", nargs="?", const=True, default=False, metavar="FILE",
                    help="also write the claims page: FILE, default docs/claims.md under the current directory "
                    "(always done for --budget full)")
    cl.add_argument("--json", action="store_true")
    cl.set_defaults(func=cmd_claims)

    n = sub.add_parser("norms", help="list the registered norms")
    n.add_argument("--json", action="store_true")
    n.set_defaults(func=cmd_norms)
    return p


def main(argv: list[str] | None = None) -> int:
    from normlab.safety import guarded

    parser = build_parser()
    args = parser.parse_args(argv)
    return guarded(lambda: int(args.func(args) or 0), debug=args.debug)


def entry() -> None:
    """Console-script entry point. A Ctrl-C while the parser is built (outside ``guarded``) is exit 130 too."""
    try:
        code = main()
    except KeyboardInterrupt:
        from normlab.errors import EXIT_INTERRUPTED

        print("interrupted (Ctrl-C); nothing was written", file=sys.stderr)
        code = EXIT_INTERRUPTED
    sys.exit(code)


if __name__ == "__main__":
    entry()
