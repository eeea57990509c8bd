"""Score documents with EleutherAI lm-evaluation-harness itself: its HF model class ``HFLM`` on a local model
directory, ``loglikelihood_rolling`` per document, and the wikitext task's per-document counts and aggregations
(``process_results``: words = ``len(re.split(r"\\s+", doc))``, bytes = UTF-8 length; ``weighted_perplexity``,
``bits_per_byte``). The reference ``normlab eval --documents`` is checked against (tests/test_interop.py,
``scripts/lm_eval_crosscheck.py``). Needs the optional extra ``lm-eval``.
"""

from __future__ import annotations

import json
from pathlib import Path

from normlab.errors import NormlabError
from normlab.eval.documents import evaluate_documents, split_documents
from normlab.io import read_json_object
from normlab.rundir.readers import load_run, run_data


def harness_document_metrics(hf_dir: str | Path, docs: list[str], *, prefix_token_id: int | None,
                             max_length: int | None, batch_size: int = 4) -> dict[str, float]:
    """``{bits_per_byte, byte_perplexity, word_perplexity, words, bytes, documents}`` as lm-eval computes them.
    ``prefix_token_id`` / ``max_length`` None: HFLM's own defaults (the tokenizer's bos, else eos token; the model's
    context), what ``lm_eval --model hf --model_args pretrained=HF_DIR`` uses."""
    try:
        from lm_eval.api.instance import Instance
        from lm_eval.api.metrics import bits_per_byte, weighted_perplexity
        from lm_eval.models.huggingface import HFLM
        from lm_eval.tasks.wikitext.preprocess_wikitext import process_results
    except ImportError:
        raise NormlabError(
            "the harness cross-check needs lm-evaluation-harness: pip install 'normlab[lm-eval]'"
        ) from None
    given = {k: v for k, v in (("prefix_token_id", prefix_token_id), ("max_length", max_length)) if v is not None}
    lm = HFLM(pretrained=str(hf_dir), device="cpu", batch_size=batch_size, dtype="float32", trust_remote_code=False,
              **given)
    reqs = [Instance("loglikelihood_rolling", {"page": d}, (d,), i) for i, d in enumerate(docs)]
    lls = lm.loglikelihood_rolling(reqs, disable_tqdm=True)
    per_doc = [process_results({"page": d}, (ll,)) for d, ll in zip(docs, lls, strict=True)]
    items = {k: [r[k] for r in per_doc] for k in per_doc[0]}

    def ppl(xs):  # lm-eval's exp overflows past ~1e308 (e.g. one long word); report inf then
        try:
            return weighted_perplexity(xs)
        except OverflowError:
            return float("inf")

    return {"bits_per_byte": bits_per_byte(items["bits_per_byte"]),
            "byte_perplexity": ppl(items["byte_perplexity"]),
            "word_perplexity": ppl(items["word_perplexity"]),
            "words": sum(w for _, w in items["word_perplexity"]), "bytes": sum(b for _, b in items["bits_per_byte"]),
            "documents": len(docs)}


def crosscheck(run_dir: str | Path, hf_dir: str | Path, split: str = "test", batch_size: int = 4) -> dict:
    """normlab's per-document metrics of ``run_dir`` (normlab.eval.documents, as ``normlab eval --documents``)
    next to lm-eval on its export ``hf_dir``: the same documents, context and document-start token."""
    rec = read_json_object(Path(hf_dir) / "normlab_export.json", "export record")  # bounded; one line if damaged
    run = load_run(run_dir)
    data = run_data(run_dir, run.cfg)
    docs = split_documents(run_dir, run.cfg, data, split)
    prefix, context = int(rec["doc_start_token"]), run.cfg.model.context
    m = evaluate_documents(run.model, docs, data.tokenizer.encode, prefix, context=context, batch_size=16)
    theirs = harness_document_metrics(hf_dir, [d.decode("utf-8") for d in docs], prefix_token_id=prefix,
                                      max_length=context, batch_size=batch_size)
    keys = ("bits_per_byte", "byte_perplexity", "word_perplexity")  # lm-eval's names; normlab's bits/byte is bpb
    ours = {"bits_per_byte": m["bpb"], **{k: m[k] for k in ("byte_perplexity", "word_perplexity", "words", "bytes",
                                                            "documents")}}
    return {"normlab": ours, "lm_eval": theirs,
            "rel_diff": {k: abs(ours[k] - theirs[k]) / abs(theirs[k]) for k in keys}}

if __name__ == "__main__":  # python -m normlab.interop.harness RUN_DIR HF_DIR [SPLIT]
    import json
    import sys

    print(json.dumps(crosscheck(sys.argv[1], sys.argv[2], *(sys.argv[3:4] or ["test"]))))
