"""Evaluation metrics against closed forms (lm-evaluation-harness definitions).

``normlab eval --split all`` (issue 29 item 1): the whole file is scored, checked against a direct forward of the
model over the file's bytes (``F.cross_entropy`` over non-overlapping windows) and, in ``--documents`` mode,
against the same per-document sum."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from normlab.eval.lm import count_words, evaluate, windows
from tests.helpers import run_inproc

class FixedModel(torch.nn.Module):
    """Logits that depend only on the previous ``k`` tokens' count (a toy causal model with a known answer)."""

    def __init__(self, vocab: int, logits: torch.Tensor | None = None):
        super().__init__()
        self.vocab = vocab
        self.logits = logits if logits is not None else torch.zeros(vocab)

    def forward(self, idx):
        return self.logits.expand(*idx.shape, self.vocab).clone()


class CountingModel(torch.nn.Module):
    """Log-prob of the target depends on how much context the position has: logit[0] = position in window."""

    def forward(self, idx):
        B, T = idx.shape
        out = torch.zeros(B, T, 4)
        out[..., 0] = torch.arange(T, dtype=torch.float32)
        return out


@settings(max_examples=200, deadline=None)
@given(n=st.integers(2, 300), context=st.integers(1, 40), data=st.data())
def test_windows_score_every_target_once(n, context, data):
    stride = data.draw(st.integers(1, context))
    seen = []
    for b, e, k in windows(n, context, stride):
        assert 0 <= b < e <= n - 1 and e - b <= context and 1 <= k <= e - b
        seen += list(range(e - k + 1, e + 1))  # target positions scored (target index = input index + 1)
    assert seen == list(range(1, n))


def test_uniform_model_bits_per_byte_is_log2_vocab():
    tokens = np.frombuffer(b"hello world, this is a test of the metrics" * 5, dtype=np.uint8).astype(np.uint16)
    m = evaluate(FixedModel(256), tokens, np.ones(256, dtype=np.int64),
                 lambda ids: bytes(ids.astype(np.uint8).tolist()), context=16)
    assert m["loss"] == pytest.approx(math.log(256))
    assert m["bpb"] == pytest.approx(8.0)
    assert m["byte_perplexity"] == pytest.approx(256.0)
    assert m["token_perplexity"] == pytest.approx(256.0)
    assert m["tokens"] == len(tokens) - 1
    text = bytes(tokens[1:].astype(np.uint8).tolist())
    words = len(text.decode().split(" ")) if " " in text.decode() else 1
    assert m["words"] == count_words(text) == words
    assert m["word_perplexity"] == pytest.approx(math.exp(m["loss"] * m["tokens"] / m["words"]))


def test_multibyte_tokens_bits_per_byte():
    """With 2 bytes per token, bits/byte = nats/token / (2 ln 2)."""
    tokens = np.arange(50, dtype=np.uint16) % 8
    logits = torch.tensor([2.0, 0, 0, 0, 0, 0, 0, 1.0])
    m = evaluate(FixedModel(8, logits), tokens, np.full(8, 2), lambda ids: b"x" * (2 * len(ids)), context=7)
    logp = torch.log_softmax(logits, 0).double()
    expect = -sum(float(logp[t]) for t in tokens[1:]) / 49
    assert m["loss"] == pytest.approx(expect, rel=1e-9)
    assert m["bpb"] == pytest.approx(expect / (2 * math.log(2)), rel=1e-9)


def test_stride_gives_more_context():
    """Each target is scored once either way; with stride < context later targets see more context."""
    tokens = np.zeros(101, dtype=np.uint16)
    kw = dict(token_bytes=np.ones(4, dtype=np.int64), decode=lambda ids: b"a" * len(ids), context=10)
    plain = evaluate(CountingModel(), tokens, **kw)
    strided = evaluate(CountingModel(), tokens, stride=2, **kw)
    assert plain["tokens"] == strided["tokens"] == 100
    # loss of target at in-window position p: -log_softmax([p, 0, 0, 0])[0]
    def nll(p: float) -> float:
        return -(p - math.log(math.exp(p) + 3))

    assert plain["loss"] == pytest.approx(sum(nll(p) for p in range(10)) / 10, rel=1e-5)
    expect_strided = (sum(nll(p) for p in range(10)) + 45 * (nll(8) + nll(9))) / 100
    assert strided["loss"] == pytest.approx(expect_strided, rel=1e-5)
    assert strided["loss"] < plain["loss"]


def test_spread_windows_sample_the_whole_split_evenly():
    from normlab.eval.lm import spread_windows, windows

    w = spread_windows(1001, 10, 40)  # 4 windows of 10 targets over 1000 targets
    assert [b for b, _, _ in w] == [0, 330, 660, 990] and all(e - b == 10 and k == 10 for b, e, k in w)
    assert w[-1][1] == 1000  # the last window's targets end at the split's last token
    assert spread_windows(41, 10, 40) == windows(41, 10, 10)  # split no longer than the sample: all of it


def test_spread_score_equals_per_window_reference():
    """The spread score is the sum of each window's own cross-entropy (an independent per-window forward)."""
    import numpy as np
    import torch.nn.functional as F

    from normlab.eval.lm import score_tokens, spread_windows
    from normlab.model import ModelConfig, build_model

    torch.manual_seed(0)
    m = build_model(ModelConfig(vocab_size=20, context=8, width=16, depth=1, heads=2)).eval()
    toks = np.random.default_rng(0).integers(0, 20, 500).astype(np.uint16)
    total, scored = score_tokens(m, toks, context=8, batch_size=3, max_tokens=24, spread=True)
    ref = 0.0
    for b, e, _ in spread_windows(500, 8, 24):
        x = torch.from_numpy(toks[b:e].astype(np.int64))[None]
        y = torch.from_numpy(toks[b + 1:e + 1].astype(np.int64))
        with torch.no_grad():
            ref += float(F.cross_entropy(m(x)[0].double(), y, reduction="sum"))
    assert len(scored) == 24 and abs(total - ref) < 1e-6


def test_word_perplexity_is_null_with_a_reason_when_degenerate():
    """Closed forms: exp(NLL / words) when words >= 2 and NLL/word <= 700; otherwise null and a reason (a text with
    no whitespace is one harness word, whose perplexity exp(total NLL) was printed as 1.01e304 = exp(700))."""
    from normlab.eval.lm import lm_metrics

    m = lm_metrics(30.0, 20, 40, 6)
    assert m["word_perplexity"] == pytest.approx(math.exp(5.0)) and "word_perplexity_null" not in m
    one = lm_metrics(5000.0, 2000, 2000, 1)
    assert one["word_perplexity"] is None and "1 whitespace-separated word in 2000 bytes" in one["word_perplexity_null"]
    many = lm_metrics(7010.0, 2000, 2000, 10)  # 701 nats per word: exp overflows what float64 shows meaningfully
    assert many["word_perplexity"] is None and many["bpb"] == pytest.approx(7010 / (2000 * math.log(2)))
    assert lm_metrics(7000.0, 2000, 2000, 10)["word_perplexity"] == pytest.approx(math.exp(700.0))


# ---------------------------------------------------------------- normlab eval --split all
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


@pytest.mark.parametrize("size", [3, 12, 40])
def test_a_file_shorter_than_a_window_is_scored(trained, cache, tmp_path, size):
    """A file of a few bytes (its val split far below one context window of 17 tokens) is scored whole, in both
    modes, as lm-eval scores a short document: the same numbers as a direct forward over the file."""
    text = b"abcabdabcabcaabbccdd\nabcabdabcabcaabbccdd"[:size]
    f = tmp_path / "short.txt"
    f.write_bytes(text)
    whole = json.loads(run_inproc("eval", str(trained), "--data", str(f), "--split", "all", "--json",
                                  cache=cache, check=True).stdout)
    bpb, scored = _direct_bpb(trained, text, 16)
    assert whole["tokens"] == scored == size - 1 and whole["bpb"] == pytest.approx(bpb, rel=1e-5)
    docs = json.loads(run_inproc("eval", str(trained), "--data", str(f), "--split", "all", "--documents", "--json",
                                 cache=cache, check=True).stdout)
    bpb, scored = _direct_bpb(trained, b"\n" + text, 16)
    assert docs["tokens"] == scored == size
    if size <= 16:  # one window from the newline token; longer, the harness's last window re-reads earlier tokens
        assert docs["bpb"] == pytest.approx(bpb, rel=1e-5)


def test_a_two_byte_file_is_scored_and_a_one_byte_file_refused(trained, cache, tmp_path):
    """A file of 2 bytes, too short for train/val/test splits, is scored whole: ``--split all`` is the model's
    cross-entropy of the second byte after the first, ``-ln p(b1 | b0) / ln 2`` bits over 1 byte, from a direct
    forward; ``--documents`` adds the first byte after the newline token. One byte: refused in one line."""
    import normlab

    f = tmp_path / "two.txt"
    f.write_bytes(b"ac")
    whole = json.loads(run_inproc("eval", str(trained), "--data", str(f), "--split", "all", "--json",
                                  cache=cache, check=True).stdout)
    model = normlab.load_run(trained).model

    def nll(inputs: bytes, targets: bytes) -> float:  # summed next-byte cross-entropy (nats) of one forward
        with torch.no_grad():
            out = model(torch.tensor([list(inputs)]))
        logits = (out if isinstance(out, torch.Tensor) else out[0]).float()[0]  # [len(inputs), vocab]
        return F.cross_entropy(logits, torch.tensor(list(targets)), reduction="sum").double().item()

    one = nll(b"a", b"c")  # the file's only prediction: its second byte after its first, nothing before
    assert whole["tokens"] == whole["bytes"] == 1 and whole["split_bytes"] == 2
    assert whole["loss"] == pytest.approx(one, rel=1e-6)
    assert whole["bpb"] == pytest.approx(one / math.log(2), rel=1e-6)
    docs = json.loads(run_inproc("eval", str(trained), "--data", str(f), "--split", "all", "--documents", "--json",
                                 cache=cache, check=True).stdout)
    assert docs["tokens"] == docs["bytes"] == 2
    assert docs["bpb"] == pytest.approx(nll(b"\na", b"ac") / (2 * math.log(2)), rel=1e-6)
    f.write_bytes(b"a")
    for mode in ((), ("--documents",)):
        r = run_inproc("eval", str(trained), "--data", str(f), "--split", "all", *mode, cache=cache)
        assert r.returncode == 2 and r.stderr.strip().count("\n") == 0
        assert "has 1 token (1 byte); at least 2 tokens are needed to score it" in r.stderr


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


def test_score_tokens_reads_the_device_once_and_keeps_cpu_numbers():
    """Evaluation sums every window's NLL on the model's device and reads them in one transfer (the training loop's
    periodic evaluation waits for the device once), adding them on the host in window order: the same float as a
    read per window. ``precision="bf16"`` autocasts on CUDA only: on a CPU the numbers are the fp32 ones."""
    import numpy as np

    from normlab.eval.lm import score_tokens, window_nll, windows
    from normlab.model import ModelConfig, build_model
    from tests.helpers import HostReads

    torch.manual_seed(0)
    m = build_model(ModelConfig(vocab_size=20, context=8, width=16, depth=1, heads=2)).eval()
    toks = np.random.default_rng(1).integers(0, 20, 300).astype(np.uint16)
    with HostReads() as r:
        total, scored = score_tokens(m, toks, context=8, batch_size=4)
    assert [w for w in r.reads[-1] if "lm.py" in w] == ["tolist lm.py:score_tokens"]
    ref = 0.0
    with torch.no_grad():
        for nll, _ in window_nll(m, toks, windows(300, 8, 8), 4):
            ref += float(nll.sum())  # a read per window, as before
    assert total == ref and len(scored) == 299
    b_total, b_scored = score_tokens(m, toks, context=8, batch_size=4, precision="bf16")
    assert b_total == total and np.array_equal(b_scored, scored)
