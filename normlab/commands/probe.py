"""``normlab probe RUN_DIR``: in-context probes of a trained run -- induction (loss on the second copy of a repeated
random sequence vs the first) and associative recall (accuracy at the query of ``k1 v1 ... kn vn kq``), on
synthetic data from a fixed seed; each measure with its 95% interval and its comparison to chance (above / not
above: the interval clear of the chance level; normlab.eval.probes; docs/advise.md). ``--json`` prints one
object."""

from __future__ import annotations

import argparse
import json

from normlab.validate import int_in


def run_probe(args: argparse.Namespace) -> int:
    from normlab.eval.probes import probe_run  # torch: not at import (building the parser stays torch-free)

    res = probe_run(args.run_dir, length=args.length, pairs=args.pairs, sequences=args.sequences, seed=args.seed,
                    symbols=args.symbols, batch_size=args.batch_size)
    if args.json:
        print(json.dumps(res, allow_nan=False))
        return 0
    ind, rec = res["induction"], res["recall"]
    k = ind["symbols"]
    print(f"induction gain {ind['induction_gain']:.3f} nats, 95% CI {_ci(ind['induction_gain_ci95'])}: "
          f"{ind['vs_chance']} (chance: 0)")
    print(f"  {ind['sequences']} random sequences of {ind['length']} tokens from {k} token ids ({args.symbols}), "
          f"each repeated once, seed {args.seed}: first copy {ind['first_copy_loss']:.3f} nats (chance ln {k} = "
          f"{ind['chance_first_copy_loss']:.3f}), second copy {ind['second_copy_loss']:.3f} (perfect copying: 0)")
    print(f"associative recall accuracy {rec['accuracy']:.3f}, 95% CI {_ci(rec['accuracy_ci95'])}: "
          f"{rec['vs_chance']} (chance 1/{rec['num_values']} = {rec['chance_accuracy']:.4f})")
    print(f"  {rec['correct']}/{rec['sequences']} sequences of {rec['pairs']} key-value pairs and a query, seed "
          f"{args.seed}; loss {rec['loss']:.3f} nats, 95% CI {_ci(rec['loss_ci95'])} (uniform: "
          f"{rec['chance_loss']:.3f})")
    return 0


def _ci(interval: list[float] | None) -> str:
    """``[low, high]`` as text (``–`` without an interval: one sequence)."""
    return "–" if interval is None else f"{interval[0]:.3f} to {interval[1]:.3f}"


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``normlab probe`` with its flags (called by ``normlab.cli.build_parser``)."""
    p = sub.add_parser("probe", help="in-context probes of a run: induction and associative recall vs chance")
    p.add_argument("run_dir")
    p.add_argument("--length", type=int_in(2, 2**20), help="tokens per random sequence (default: context / 2)")
    p.add_argument("--pairs", type=int_in(1, 2**20), help="key-value pairs per recall sequence (default: up to 16)")
    p.add_argument("--sequences", type=int_in(1, 100_000), default=64, help="sequences per probe (default 64)")
    p.add_argument("--seed", type=int_in(0, 2**63 - 1), default=0, help="seed of the synthetic data (default 0)")
    p.add_argument("--symbols", choices=("data", "all"), default="data",  # normlab.eval.probes.SYMBOLS
                   help="token ids to draw from: those in the run's training split (default) or the whole vocabulary")
    p.add_argument("--batch-size", type=int_in(1, 2**16), default=16)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run_probe)
