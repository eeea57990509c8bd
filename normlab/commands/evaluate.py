"""``normlab eval``: loss, bits-per-byte, token/byte/word perplexity on a split of a run's corpus."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from normlab.errors import NormlabError
from normlab.io import write_json


def run_eval(args: argparse.Namespace) -> int:
    from normlab.eval.lm import evaluate
    from normlab.rundir import load_run
    from normlab.train.loop import load_data

    run = load_run(args.run_dir)
    cfg = run.cfg
    context = args.context or cfg.model.context
    if context < 1:
        raise NormlabError(f"--context must be >= 1, got {context}")
    if cfg.model.positions == "learned" and context > cfg.model.context:
        raise NormlabError(
            f"--context {context} exceeds the learned position table ({cfg.model.context}); "
            "learned positions cannot extrapolate"
        )
    if args.batch_size < 1 or args.max_tokens < 0:
        raise NormlabError("--batch-size must be >= 1 and --max-tokens >= 0")
    data = load_data(cfg)
    tokens = data.val if args.split == "val" else data.test
    m = evaluate(run.model, tokens, data.token_bytes, data.tokenizer.decode, context=context, stride=args.stride,
                 batch_size=args.batch_size, max_tokens=args.max_tokens or None)
    m.update({"split": args.split, "context": context, "stride": args.stride or context,
              "run_dir": str(args.run_dir), "weights": str(run.weights)})
    if data.entropy_floor_bpb is not None:
        m["entropy_floor_bpb"] = data.entropy_floor_bpb
        m["gap_bpb"] = m["bits_per_byte"] - data.entropy_floor_bpb
    write_json(Path(args.run_dir) / f"eval_{args.split}.json", m)
    if args.json:
        print(json.dumps(m))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table("metric", "value", title=f"{args.run_dir} ({args.split}, context {context}, stride {m['stride']})")
    for k in ("loss", "bits_per_byte", "token_perplexity", "byte_perplexity", "word_perplexity",
              "entropy_floor_bpb", "gap_bpb", "tokens", "bytes", "words"):
        if k in m:
            v = m[k]
            table.add_row(k, f"{v:,}" if isinstance(v, int) else f"{v:.4f}")
    Console().print(table)
    return 0
