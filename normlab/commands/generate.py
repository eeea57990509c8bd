"""``normlab generate``: sample a continuation of a prompt from a run's model, streaming tokens to stdout.

Sampling options are those of ``normlab.eval.sampling.sample_next`` (temperature, top-k, top-p, min-p, top-nσ);
the model's KV-cache / recurrent-state API (``init_state``/``step``) is used when it has one, else the full forward
over the last ``context`` tokens is recomputed per token. With ``--json`` nothing streams; one JSON object is
printed at the end.
"""

from __future__ import annotations

import argparse
import codecs
import sys
import time

from normlab.errors import NormlabError
from normlab.io import dumps
from normlab.rundir.readers import load_run, run_tokenizer
from normlab.validate import MAX_SEED, int_in

MAX_NEW_TOKENS = 100_000


def run_generate(args: argparse.Namespace) -> int:
    import torch  # not loaded by `normlab --help`

    from normlab.eval.sampling import check_sampling_args, generate_tokens

    sampling = {"temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p, "min_p": args.min_p,
                "top_nsigma": args.top_nsigma}
    check_sampling_args(**sampling)
    if not 0 <= args.max_new_tokens <= MAX_NEW_TOKENS:
        raise NormlabError(f"--max-new-tokens must be in [0, {MAX_NEW_TOKENS}], got {args.max_new_tokens}")
    if args.prompt is not None and not args.prompt:
        raise NormlabError("--prompt must be a non-empty string")
    run = load_run(args.run_dir)
    tok = run_tokenizer(args.run_dir, run.cfg)  # the run's own tokenizer.json: no corpus needed
    origin = None
    if args.prompt is None:  # the beginning of a validation document of the run's own corpus, named on stderr
        from normlab.eval.documents import validation_prompt

        prompt_bytes, origin = validation_prompt(args.run_dir, run.cfg, args.seed)
        if not args.json:
            print(f"prompt: the first {origin['tokens']} tokens of validation document {origin['document']} of "
                  f"{origin['documents']} ({origin['source']}); --prompt TEXT for your own", file=sys.stderr)
    else:
        prompt_bytes = args.prompt.encode("utf-8", "surrogateescape")  # undecodable argv bytes come back as they were
    prompt_text = prompt_bytes.decode("utf-8", "replace")
    prompt_ids = tok.encode_prompt(prompt_bytes)  # after the document token with a +doc tokenizer
    model = run.model
    use_cache = hasattr(model, "step") and hasattr(model, "init_state")
    torch.manual_seed(args.seed)  # dropout is off in eval mode; this only pins any other RNG use
    gen = torch.Generator().manual_seed(args.seed)
    stream = not args.json
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    if stream:
        sys.stdout.write(prompt_text)
        sys.stdout.flush()
    out: list[int] = []
    t0 = time.perf_counter()
    for t in generate_tokens(model, prompt_ids, args.max_new_tokens, context=run.cfg.model.context,
                             use_cache=use_cache, generator=gen, **sampling):
        out.append(t)
        if stream:
            sys.stdout.write(decoder.decode(tok.decode_bytes([t])))
            sys.stdout.flush()
    elapsed = time.perf_counter() - t0
    text = tok.decode(out)
    if stream:
        sys.stdout.write(decoder.decode(b"", final=True) + "\n")
        sys.stdout.flush()
        return 0
    print(dumps({
        "prompt": prompt_text, "text": text, "tokens": out, "prompt_tokens": len(prompt_ids), "seed": args.seed,
        **sampling, "max_new_tokens": args.max_new_tokens, "cache": use_cache,
        "tokens_per_second": len(out) / elapsed if elapsed > 0 and out else None, "run_dir": str(args.run_dir),
        "prompt_source": origin or "--prompt",
    }))
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``normlab generate`` with their flags (called by ``normlab.cli.build_parser``)."""
    g = sub.add_parser("generate", help="sample a continuation of a prompt (tokens stream to stdout)")
    g.add_argument("run_dir")
    g.add_argument("--prompt", help="text to continue (default: the beginning of a validation document of the run's "
                                    "own corpus, document SEED mod n, its first min(32, context/2) tokens; "
                                    "stderr names it)")
    g.add_argument("--max-new-tokens", type=int_in(0, 100_000), default=200)
    g.add_argument("--temperature", type=float, default=1.0, help="0 = greedy")
    g.add_argument("--top-k", type=int_in(1, 2**31), help="keep the k most likely tokens")
    g.add_argument("--top-p", type=float, help="nucleus: smallest set with cumulative probability >= p")
    g.add_argument("--min-p", type=float, help="keep tokens with p >= min_p * p_max")
    g.add_argument("--top-nsigma", type=float,
                   help="top-nσ (Tang et al. 2024): keep logits >= max - n*std (1.0 is the paper's default)")
    g.add_argument("--seed", type=int_in(0, MAX_SEED), default=0)
    g.add_argument("--json", action="store_true", help="no streaming; print one JSON object at the end")
    g.set_defaults(func=run_generate)
