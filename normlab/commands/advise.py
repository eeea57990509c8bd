"""``normlab advise [RUN_DIR | CONFIG.yaml | PRESET]``: per normalization decision, what the stored evidence decides
(effect, interval, Holm p, corpora, the scale it was measured at), what it leaves undecided, how far your model is
from it, and the sweep that would decide the next question at your scale (docs/advise.md); ``--json``: one object."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from normlab.errors import NormlabError, printable
from normlab.io import dumps


def _tokens(text: str) -> int:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of tokens such as 1e9, got {text!r}") from None
    if not math.isfinite(v) or v < 1 or v > 1e15:
        raise argparse.ArgumentTypeError(f"must be between 1 and 1e15 tokens, got {text!r}")
    return int(v)


def _config(args: argparse.Namespace):
    """The target RunConfig, its source for the sweep's ``base`` and a measured rate from a run, if any."""
    from normlab.config import load_config
    from normlab.rundir.files import CONFIG_FILE
    from normlab.rundir.readers import read_summary

    src, run_dir = args.source or "small", None
    p = Path(src)
    if p.is_dir():
        run_dir, p = p, p / CONFIG_FILE
        if not p.is_file():
            raise NormlabError(f"{run_dir} is not a normlab run directory (no {CONFIG_FILE})")
    base = str(p.resolve()) if p.is_file() else src
    over = [f"{k}={v}" for k, v in (("model.width", args.width), ("model.depth", args.depth),
                                    ("model.context", args.context), ("model.heads", args.heads),
                                    ("train.batch_size", args.batch_size), ("optim.name", args.optimizer),
                                    ("train.precision", args.precision), ("model.vocab_size", args.vocab_size))
            if v is not None]
    if args.width is not None and args.heads is None and args.width % 64 == 0:
        over.append(f"model.heads={args.width // 64}")  # head_dim 64, as GPT-2
    cfg = load_config(base, over)
    if args.tokens is not None:
        per_step = cfg.train.batch_size * cfg.train.grad_accum * cfg.model.context
        cfg = load_config(base, over + [f"train.steps={max(1, math.ceil(args.tokens / per_step))}"])
    elif args.steps is not None:
        cfg = load_config(base, over + [f"train.steps={args.steps}"])
    rate = None
    if run_dir is not None:
        sm = read_summary(run_dir) or {}
        if sm.get("tokens_per_s") and sm.get("flops_per_token"):
            rate = (sm["tokens_per_s"] * sm["flops_per_token"], f"{run_dir}'s own training, measured")
    return cfg, base, rate


def run_advise(args: argparse.Namespace) -> int:
    from normlab.report.advise import advise, gemm_rate, render
    from normlab.report.evidence import load_evidence
    from normlab.report.scaling_evidence import load_scaling_evidence

    for d in args.from_dirs:
        if not (Path(d) / "results.sqlite").is_file():
            raise NormlabError(f"--from {d}: not a sweep directory (no results.sqlite)")
    cfg, base, rate = _config(args)
    if rate is None:
        prec = "bf16" if cfg.train.precision == "bf16" else "fp32"
        rate = (gemm_rate(prec), f"a 1024x1024 {prec} matmul on this CPU, measured now; a training step runs at "
                "its own rate")
    out = None if args.no_write or args.write is None else Path(args.write)
    res = advise(cfg, load_evidence(), from_dirs=[Path(d) for d in args.from_dirs], baseline=args.baseline,
                 rate=rate[0], rate_source=rate[1], sweep_path=out, base=base, scaling=load_scaling_evidence())
    # strict JSON (a non-finite number in the evidence as null); the text with control characters as escapes
    print(dumps(res) if args.json else "\n".join(printable(x) for x in render(res).split("\n")))
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``normlab advise`` with its flags (called by ``normlab.cli.build_parser``)."""
    from normlab.validate import int_in

    positive_int = int_in(1, 2**31)

    a = sub.add_parser("advise", help="what the stored evidence decides for the model you intend to train, how far "
                       "away it was measured, and the sweep that would decide the next question")
    a.add_argument("source", nargs="?", help="a run directory, config YAML or preset (default: small)")
    a.add_argument("--width", type=positive_int, help="your model's width (d_model)")
    a.add_argument("--depth", type=positive_int, help="your model's number of blocks")
    a.add_argument("--context", type=positive_int, help="your model's context length in tokens")
    a.add_argument("--vocab-size", type=positive_int,
                   help="your vocabulary size (default: the config's tokenizer, 256 for bytes); sets FLOPs/token")
    a.add_argument("--heads", type=positive_int, help="default with --width: width / 64 when it divides")
    a.add_argument("--batch-size", type=positive_int, help="sequences per step (default: the config's)")
    steps = a.add_mutually_exclusive_group()
    steps.add_argument("--steps", type=positive_int, help="training steps (default: the config's)")
    steps.add_argument("--tokens", type=_tokens, help="training tokens, e.g. 1e9 (sets the steps)")
    a.add_argument("--optimizer", help="optim.name (adamw, adamp, sgdp)")
    a.add_argument("--precision", help="train.precision (auto, fp32, bf16)")
    a.add_argument("--from", dest="from_dirs", nargs="+", default=[], metavar="DIR",
                   help="sweep directories to compare at equal steps and equal FLOPs")
    a.add_argument("--baseline", help="the variant the --from comparisons use (default: each sweep's first)")
    a.add_argument("--write", metavar="FILE", help="write the next question's sweep YAML to FILE (nothing is written "
                   "without it)")
    a.add_argument("--no-write", action="store_true", help="write no sweep YAML (the default; kept for scripts)")
    a.add_argument("--json", action="store_true")
    a.set_defaults(func=run_advise)
