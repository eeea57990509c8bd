"""``normlab generate`` without ``--prompt`` samples from a newline (issue 29 item 8), checked against a greedy
loop over the model's own forward (argmax of the last position's logits)."""

from __future__ import annotations

import json

import torch

from tests.helpers import run_inproc
import pytest


def test_generate_defaults_to_a_newline_prompt(tmp_path, cache):
    import normlab

    run = tmp_path / "run"
    run_inproc("train", "tiny", "--set", "train.steps=4", "--set", "train.eval_every=4", "--set",
               "model.context=16", "--out", str(run), cache=cache, check=True)
    r = json.loads(run_inproc("generate", str(run), "--temperature", "0", "--max-new-tokens", "12", "--json",
                              cache=cache, check=True).stdout)
    assert r["prompt"] == "\n" and r["prompt_tokens"] == 1
    model = normlab.load_run(run).model
    ids = [10]
    with torch.no_grad():
        for _ in range(12):
            logits = model(torch.tensor([ids[-16:]]))
            logits = logits if isinstance(logits, torch.Tensor) else logits[0]
            ids.append(int(logits[0, -1].argmax()))
    assert r["tokens"] == ids[1:]
    assert normlab.generate(run, max_new_tokens=12, temperature=0) == r["text"]


pytestmark = pytest.mark.usefixtures("one_thread")


def test_generate_streams_undecodable_prompt(run, cache):
    """``generate --prompt $'\\xff\\xfe'`` streams (the prompt shown with U+FFFD), no UnicodeEncodeError."""
    proc = run_inproc("generate", str(run), "--prompt", "\udcff\udcfe", "--max-new-tokens", "2", cache=cache)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("\ufffd\ufffd")
