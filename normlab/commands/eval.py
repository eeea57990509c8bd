"""``normlab eval``: loss, bits-per-byte, token/byte/word perplexity on a split of a run's corpus.

Evaluation-time overrides (``args.overrides``, ``--set model.KEY=VALUE``): only the keys that change how a trained
model is evaluated without touching its weights (``normlab.rundir.readers.apply_eval_overrides``,
``normlab.attention.eval_time_keys()``, declared by each kind: the LSSAR re-weighting of
softplus attention, ``model.lssa_reweight`` / ``model.lssa_power``). The result then goes to
``eval_<split>_overrides.json`` with an ``overrides`` list, so the plain evaluation is never overwritten.

Two modes, named in the result's ``mode`` field: ``stream`` (default; the split's documents joined into one token
stream, rolling or strided windows, ``normlab.eval.lm``) and ``documents`` (``--documents``; each document scored
separately from a document-start token, lm-evaluation-harness ``loglikelihood_rolling`` exactly,
``normlab.eval.documents``), written to ``eval_<split>_documents.json``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console
from rich.table import Table

from normlab.commands.args import data_arg, eval_set_arg
from normlab.commands.stages import CountProgress
from normlab.errors import NormlabError
from normlab.io import check_file_slot, dumps, read_json, write_json
from normlab.names import eval_scope, split_bpb_label
from normlab.safety import printable
from normlab.rundir.files import HF_IMPORT_FILE
from normlab.rundir.readers import open_run
from normlab.stats.learning import DID_NOT_LEARN_MARGIN, learning_record
from normlab.validate import ARG_BOUNDS, SPLITS, flag_in, int_in


def run_eval(args: argparse.Namespace) -> int:
    from normlab.eval.lm import evaluate  # torch: not loaded by `normlab --help`

    if args.batch_size < 1 or args.max_tokens < 0:
        raise NormlabError("--batch-size must be >= 1 and --max-tokens >= 0")
    # scoring needs no full context window (lm-eval scores a document shorter than the context): 2 tokens will do
    run = open_run(args.run_dir, overrides=args.overrides, source=args.data, split=args.split, context=args.context,
                   batch=args.batch_size, what="eval", need_window=())
    context, data, overrides = run.context, run.data, run.overrides
    if args.documents:
        return _eval_documents(args, run, data, context, overrides)
    if args.doc_start is not None:
        raise NormlabError("--doc-start applies to --documents only")
    tokens = run.tokens
    with CountProgress(f"eval {args.split}", "tokens") as tick:  # a bar on a terminal's stderr only
        m = evaluate(run.model, tokens, data.token_bytes, data.tokenizer.decode_bytes, context=context,
                     stride=args.stride, batch_size=args.batch_size, max_tokens=args.max_tokens or None, progress=tick)
    m.update({"mode": "stream", "scope": eval_scope(args.max_tokens or None),
              "tokenizer": data.tokenizer.name,  # a "+doc" tokenizer's separators are scored too
              "split": args.split, "split_bytes": data.bytes_of(args.split), "context": context,
              "stride": args.stride or context,
              "run_dir": str(args.run_dir), "weights": str(run.weights)})
    if data.entropy_floor_bpb is not None:
        m["entropy_floor_bpb"] = data.entropy_floor_bpb
        m["gap_bpb"] = m["bpb"] - data.entropy_floor_bpb
    m.update(learning_record(m["bpb"], data.unigram_bpb))  # the unigram level beside the loss; did it learn
    if overrides:
        m["overrides"] = overrides
    m.update(run.data_record)
    if args.label_free:  # MaNo and Matrix Nuclear-Norm (normlab/surgery/label_free.py)
        from normlab.surgery.label_free import label_free_scores

        m["label_free"] = label_free_scores(run.model, tokens, context=context, batch_size=args.batch_size,
                                            max_tokens=args.max_tokens or m["tokens"])
    write_json(
        check_file_slot(Path(args.run_dir) / f"eval_{args.split}{'_overrides' if overrides else ''}{run.suffix}.json"),
        m,
    )
    if args.json:
        print(dumps(m))
        return 0

    table = Table("metric", "value",
                  title=printable(f"{args.run_dir} ({args.split}, context {context}, stride {m['stride']})"))
    for k in ("loss", "bpb", "unigram_bpb", "token_perplexity", "byte_perplexity", "unigram_byte_perplexity",
              "word_perplexity", "entropy_floor_bpb", "gap_bpb", "tokens", "bytes", "words"):
        if k in m:
            v = m[k]
            label = split_bpb_label(args.split, args.max_tokens or None) if k == "bpb" else k
            table.add_row(label, "null" if v is None else f"{v:,}" if isinstance(v, int) else f"{v:.4f}")
    for k in ("mano", "matrix_nuclear_norm"):
        if k in m.get("label_free", {}):
            table.add_row(f"{k} (label-free)", f"{m['label_free'][k]:.6f}")
    Console(markup=False).print(table)
    if m.get("word_perplexity_null"):
        print(f"word_perplexity is null: {m['word_perplexity_null']}")
    _print_learning(m)
    return 0


def _print_learning(m: dict) -> None:
    """One line when the scored loss did not learn (normlab.stats.learning: the report's rule)."""
    if m.get("did_not_learn"):
        print(f"did not learn: {m['bpb']:.4f} bits/byte is not below the corpus's unigram level {m['unigram_bpb']:.4f} "
              f"minus {DID_NOT_LEARN_MARGIN:g} (byte perplexity {m['byte_perplexity']:.2f} against the unigram's "
              f"{m['unigram_byte_perplexity']:.2f}): the model predicts no better than byte frequencies")


def _eval_documents(args: argparse.Namespace, run, data, context: int, overrides: list[str]) -> int:
    """``--documents``: lm-evaluation-harness rolling log-likelihood, one document at a time."""
    from normlab.eval.documents import evaluate_documents, split_documents

    if args.stride is not None:
        raise NormlabError("--stride does not apply to --documents (the harness scores disjoint windows)")
    docs = split_documents(args.run_dir, run.cfg, data, args.split, source=run.source)
    split_bytes = sum(len(d) for d in docs)
    if args.max_tokens:  # whole documents, in split order, until at least N tokens
        kept, n = [], 0
        for d in docs:
            if n >= args.max_tokens:
                break
            kept.append(d)
            n += len(data.tokenizer.encode(d))
        docs = kept
    prefix, why = args.doc_start, "--doc-start"
    imported = Path(args.run_dir) / HF_IMPORT_FILE
    if prefix is None and imported.is_file():
        prefix = read_json(imported, "import record").get("doc_start_token")
        why = "the imported model's bos/eos token"
        if not (isinstance(prefix, int) and 0 <= prefix < run.cfg.model.vocab_size):
            prefix = None  # an older import's id outside the vocabulary (GPT-2's 50256 in 256 tokens): not a token
    if prefix is None and data.tokenizer.doc_token is not None:
        prefix, why = int(data.tokenizer.doc_token), "the tokenizer's document token (+doc, seen in training)"
    if prefix is None:
        prefix, why = int(data.tokenizer.encode(b"\n")[0]), "newline (the tokenizer has no document token)"
    if not 0 <= prefix < run.cfg.model.vocab_size:
        raise NormlabError(f"--doc-start {prefix} is not a token id of this model (0..{run.cfg.model.vocab_size - 1})")
    m = evaluate_documents(run.model, docs, data.tokenizer.encode, prefix, context=context,
                           batch_size=args.batch_size)
    m.update({"mode": "documents", "tokenizer": data.tokenizer.name, "split": args.split,
              "split_bytes": split_bytes, "context": context, "doc_start_token": prefix,
              "doc_start_source": why, "word_count": "per document, len(re.split(r'\\s+', doc))",
              "run_dir": str(args.run_dir), "weights": str(run.weights)})
    m.update(learning_record(m.get("bpb"), data.unigram_bpb))
    if overrides:
        m["overrides"] = overrides
    m.update(run.data_record)
    write_json(Path(args.run_dir) / f"eval_{args.split}_documents{'_overrides' if overrides else ''}"
               f"{run.suffix}.json", m)
    if args.json:
        print(dumps(m))
        return 0

    table = Table("metric", "value", title=printable(f"{args.run_dir} ({args.split}, documents, context {context})"))
    for k in ("loss", "bpb", "unigram_bpb", "token_perplexity", "byte_perplexity", "unigram_byte_perplexity",
              "word_perplexity", "documents",
              "tokens", "bytes", "words", "doc_start_token"):
        if k not in m:
            continue
        v = m[k]
        table.add_row(k, "null" if v is None else f"{v:,}" if isinstance(v, int) else f"{v:.4f}")
    Console().print(table)
    if m.get("word_perplexity_null"):
        print(f"word_perplexity is null: {m['word_perplexity_null']}")
    _print_learning(m)
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``normlab eval`` with their flags (called by ``normlab.cli.build_parser``)."""
    e = sub.add_parser("eval", help="evaluate a run: loss, bits-per-byte, perplexities")
    eval_set_arg(e)
    e.add_argument("run_dir")
    e.add_argument("--split", choices=list(SPLITS), default="val",
                   help="which part of the corpus to score: val, test, or all (the whole corpus: train, val and "
                        "test; e.g. a file given with --data)")
    e.add_argument("--context", type=flag_in(ARG_BOUNDS["context"]),
                   help="window length (default: the training context)")
    e.add_argument("--stride", type=flag_in(ARG_BOUNDS["stride"]),
                   help="sliding-window stride (default: context = non-overlapping)")
    e.add_argument("--batch-size", type=flag_in(ARG_BOUNDS["batch_size"]), default=16)
    data_arg(e)
    e.add_argument("--label-free", action="store_true",
                   help="also MaNo (Xie et al. 2024) and Matrix Nuclear-Norm (Li et al. 2024) scores, no labels used")
    e.add_argument("--max-tokens", type=flag_in(ARG_BOUNDS["max_tokens"]), default=0,
                   help="score only the first N tokens (0 = all; with --documents: whole documents up to N tokens)")
    e.add_argument("--documents", action="store_true",
                   help="harness-exact mode: each document scored separately (lm-eval loglikelihood_rolling)")
    e.add_argument("--doc-start", type=int_in(0, 2**31), metavar="ID",
                   help="with --documents: token id that conditions each document's first token "
                        "(default: an imported model's bos/eos token, else the newline token)")
    e.add_argument("--json", action="store_true")
    e.set_defaults(func=run_eval)
