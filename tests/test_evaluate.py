"""``normlab eval --split all`` (issue 29 item 1): the whole file is scored, checked against a direct forward of the
model over the file's bytes (``F.cross_entropy`` over non-overlapping windows) and, in ``--documents`` mode,
against the same per-document sum."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tests.helpers import run_inproc


@pytest.fixture(scope="module")
def trained(tmp_path_factory, cache):
    out = tmp_path_factory.mktemp("ev") / "run"
    run_inproc("train", "tiny", "--set", "train.steps=4", "--set", "train.eval_every=4", "--set",
               "train.checkpoint_every=4", "--set", "model.context=16", "--set", "diag.every=0", "--out", str(out),
               cache=cache, check=True)
    return out


def _direct_bpb(run_dir, data: bytes, context: int) -> float:
    """Sum of next-byte NLL over non-overlapping windows of ``context + 1`` bytes (one shared token between
    windows, so every byte after the first is a target once), divided by the scored bytes."""
    import normlab

    model = normlab.load_run(run_dir).model
    ids = torch.tensor(np.frombuffer(data, dtype=np.uint8).astype(np.int64))
    nll, n = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(ids) - 1, context):
            x, y = ids[i:i + context], ids[i + 1:i + context + 1]
            x = x[: len(y)]
            logits = model(x[None])
            logits = logits[0] if isinstance(logits, torch.Tensor) else logits[0][0]
            nll += F.cross_entropy(logits.double(), y, reduction="sum").item()
            n += len(y)
    return nll / (n * math.log(2)), n


def test_split_all_scores_the_whole_file(trained, cache, tmp_path):
    text = bytes(np.random.default_rng(0).integers(97, 101, size=1500, dtype=np.uint8))  # one document, 1500 B
    f = tmp_path / "file.txt"
    f.write_bytes(text)
    val = json.loads(run_inproc("eval", str(trained), "--data", str(f), "--json", cache=cache, check=True).stdout)
    whole = json.loads(run_inproc("eval", str(trained), "--data", str(f), "--split", "all", "--json",
                                  cache=cache, check=True).stdout)
    assert val["split"] == "val" and val["split_bytes"] == 75  # 5% slice
    assert whole["split"] == "all" and whole["split_bytes"] == len(text)
    bpb, scored = _direct_bpb(trained, text, 16)
    assert whole["tokens"] == scored == len(text) - 1
    assert whole["bpb"] == pytest.approx(bpb, rel=1e-5)


def test_split_all_with_documents(trained, cache, tmp_path):
    f = tmp_path / "file.txt"
    f.write_bytes(b"abcabd\nabcabc\n" * 40)
    r = json.loads(run_inproc("eval", str(trained), "--data", str(f), "--split", "all", "--documents", "--json",
                              cache=cache, check=True).stdout)
    assert r["split"] == "all" and r["bytes"] == r["split_bytes"] == len(f.read_bytes()) and r["documents"] == 1
    # harness rolling log-likelihood of one document from the newline token = direct forward over "\n" + doc
    bpb, _ = _direct_bpb(trained, b"\n" + f.read_bytes(), 16)
    assert r["bpb"] == pytest.approx(bpb, rel=1e-5)


def test_other_commands_refuse_split_all(trained, cache):
    r = run_inproc("calibrate", str(trained), "--split", "all", cache=cache)
    assert r.returncode == 2 and "invalid choice: 'all'" in r.stderr


def test_api_evaluate_split_all_equals_the_cli(trained, cache, tmp_path, monkeypatch):
    import normlab

    f = tmp_path / "file.txt"
    f.write_bytes(b"the quick brown fox jumps over the lazy dog\n" * 30)
    monkeypatch.setenv("NORMLAB_CACHE_DIR", str(cache))
    api = normlab.evaluate(trained, split="all", data=str(f))
    cli = json.loads(run_inproc("eval", str(trained), "--data", str(f), "--split", "all", "--json", cache=cache,
                                check=True).stdout)
    assert api["bpb"] == cli["bpb"] and api["split_bytes"] == cli["split_bytes"] == len(f.read_bytes())
    assert api["word_perplexity"] == pytest.approx(math.exp(api["loss"] * api["tokens"] / api["words"]))
