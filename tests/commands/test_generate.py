"""``normlab generate`` without ``--prompt`` starts from the beginning of a validation document of the run's own
corpus (the tiny preset's one-document Markov corpus: the start of its validation slice, computed here from the
split rule's fractions), checked against a greedy loop over the model's own forward (argmax of the last position's
logits)."""

from __future__ import annotations

import json

import torch

from tests.helpers import run_inproc
import pytest


def test_generate_defaults_to_the_start_of_a_validation_document(tmp_path, cache):
    import normlab
    from normlab.data import load_corpus

    run = tmp_path / "run"
    run_inproc("train", "tiny", "--set", "train.steps=4", "--set", "train.eval_every=4", "--set",
               "model.context=16", "--out", str(run), cache=cache, check=True)
    proc = run_inproc("generate", str(run), "--temperature", "0", "--max-new-tokens", "12", "--json",
                      cache=cache, check=True)
    r = json.loads(proc.stdout)
    cfg = normlab.load_run(run).cfg
    (text,) = load_corpus(cfg.data.source).docs  # one document: val is the slice before the test slice
    n = len(text)
    n_val, n_test = round(n * cfg.data.val_fraction), round(n * cfg.data.test_fraction)
    start = text[n - n_val - n_test:][:8]  # min(32, context 16 // 2) byte tokens
    assert r["prompt"] == start.decode() and r["prompt_tokens"] == 8
    assert r["prompt_source"] == {"split": "val", "document": 0, "documents": 1, "tokens": 8,
                                  "source": cfg.data.source}
    model = normlab.load_run(run).model
    ids = list(start)
    with torch.no_grad():
        for _ in range(12):
            logits = model(torch.tensor([ids[-16:]]))
            logits = logits if isinstance(logits, torch.Tensor) else logits[0]
            ids.append(int(logits[0, -1].argmax()))
    assert r["tokens"] == ids[8:]
    assert normlab.generate(run, max_new_tokens=12, temperature=0) == r["text"]
    streamed = run_inproc("generate", str(run), "--temperature", "0", "--max-new-tokens", "12", cache=cache,
                          check=True)
    assert streamed.stdout == start.decode() + r["text"] + "\n"
    assert "prompt: the first 8 tokens of validation document 0 of 1" in streamed.stderr


pytestmark = pytest.mark.usefixtures("one_thread")


def test_generate_streams_undecodable_prompt(run, cache):
    """``generate --prompt $'\\xff\\xfe'`` streams (the prompt shown with U+FFFD), no UnicodeEncodeError."""
    proc = run_inproc("generate", str(run), "--prompt", "\udcff\udcfe", "--max-new-tokens", "2", cache=cache)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("\ufffd\ufffd")
