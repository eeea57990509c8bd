"""Length extrapolation: per-position losses against a closed form, position buckets, skipping and refusing
factors, and ``normlab extrapolate`` end to end."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from normlab.errors import NormlabError
from normlab.eval.extrapolation import bucket_edges, extrapolate, parse_factors
from tests.helpers import assert_bad_input, run_inproc as normlab
from tests.eval.test_calibration import SHORT, tiny_run


pytestmark = pytest.mark.usefixtures("one_thread")


class PositionModel(torch.nn.Module):
    """``logit[0] = position in the window``, other logits 0 (vocab 4). On an all-zero token stream the loss at
    position j is ``log(1 + 3 e^-j)``: more context, lower loss, like a model that uses its window."""

    def __init__(self):
        super().__init__()
        self.lengths = []

    def forward(self, idx):
        B, T = idx.shape
        self.lengths.append(T)
        out = torch.zeros(B, T, 4)
        out[..., 0] = torch.arange(T, dtype=torch.float32)
        return out


def f(j):
    return math.log(1 + 3 * math.exp(-j))


def test_parse_factors():
    assert parse_factors("1,2, 4") == [1.0, 2.0, 4.0] and parse_factors("0.5") == [0.5]
    for bad, frag in [("1,-2", "> 0"), ("1,x", "'x'"), ("0", "> 0"), ("1,,2", "''"), ("nan", "> 0"), ("", "''")]:
        with pytest.raises(NormlabError, match=frag):
            parse_factors(bad)


def test_bucket_edges():
    assert bucket_edges(64) == [0, 1, 2, 4, 8, 16, 32, 64]
    assert bucket_edges(48) == [0, 1, 2, 4, 8, 16, 32, 48]
    assert bucket_edges(1) == [0, 1] and bucket_edges(2) == [0, 1, 2]


def test_losses_and_buckets_match_closed_form():
    tokens = np.zeros(40, dtype=np.uint16)  # 39 targets; largest context 8 -> the first 32 are scored by all
    model = PositionModel()
    rep = extrapolate(model, tokens, np.full(4, 2, dtype=np.int64), train_context=4, factors=[1, 2, 16],
                      batch_size=3)
    assert rep["tokens"] == 32 and rep["bytes"] == 64
    assert [s["factor"] for s in rep["skipped"]] == [16] and "exceeds" in rep["skipped"][0]["reason"]
    r1, r2 = rep["results"]
    assert (r1["factor"], r1["context"], r2["context"]) == (1, 4, 8)
    assert r1["loss"] == pytest.approx(np.mean([f(j) for j in range(4)]))
    assert r2["loss"] == pytest.approx(np.mean([f(j) for j in range(8)]))
    assert r2["bpb"] == pytest.approx(r2["loss"] * 32 / (64 * math.log(2)))
    assert r1["tokens"] == r2["tokens"] == 32 and r1["windows"] == 8 and r2["windows"] == 4
    b = {(x["start"], x["end"]): x for x in r2["buckets"]}
    assert list(b) == [(0, 1), (1, 2), (2, 4), (4, 8)]
    assert b[(2, 4)]["loss"] == pytest.approx((f(2) + f(3)) / 2) and b[(2, 4)]["tokens"] == 8
    assert b[(4, 8)]["beyond_train_context"] and not b[(2, 4)]["beyond_train_context"]
    assert set(model.lengths) == {4, 8}  # only full windows


def test_learned_positions_refused_and_memory_cap():
    tokens = np.zeros(100, dtype=np.uint16)
    with pytest.raises(NormlabError, match="learned position table"):
        extrapolate(PositionModel(), tokens, np.ones(4, np.int64), train_context=8, factors=[1, 2],
                    positions="learned")
    ok = extrapolate(PositionModel(), tokens, np.ones(4, np.int64), train_context=8, factors=[1, 0.5],
                     positions="learned")
    assert [r["context"] for r in ok["results"]] == [8, 4]
    rep = extrapolate(PositionModel(), tokens, np.ones(4, np.int64), train_context=8, factors=[1, 8],
                      memory_gb=1e-3)  # ~1 MiB: one window of 64 tokens (~2.4 MiB estimated) does not fit, of 8 does
    assert [r["context"] for r in rep["results"]] == [8] and "MiB" in rep["skipped"][0]["reason"]
    with pytest.raises(NormlabError, match="no factor can be evaluated"):
        extrapolate(PositionModel(), tokens, np.ones(4, np.int64), train_context=8, factors=[64])


def test_extrapolate_cli(tmp_path_factory):
    run, cache = tiny_run(tmp_path_factory)
    r = normlab("extrapolate", str(run), "--factors", "1,2,4,16", "--max-tokens", "600", "--json", cache=cache,
                check=True)
    m = json.loads(r.stdout)
    assert [x["factor"] for x in m["results"]] == [1, 2, 4] and [x["context"] for x in m["results"]] == [64, 128, 256]
    for x in m["results"]:
        assert {"factor", "context", "loss", "bpb", "buckets"} <= set(x) and math.isfinite(x["loss"])
        assert x["tokens"] == 512 and x["bpb"] == pytest.approx(x["loss"] / math.log(2))  # bytes: 1/token
    assert m["skipped"][0]["context"] == 1024 and "--max-tokens" in m["skipped"][0]["reason"]
    assert json.loads((run / "extrapolation.json").read_text())["results"] == m["results"]
    assert (run / "extrapolation.png").read_bytes()[:4] == b"\x89PNG"
    assert_bad_input(normlab("extrapolate", str(run), "--factors", "1,-2", cache=cache), "--factors")
    assert_bad_input(normlab("extrapolate", str(run), "--factors", "one", cache=cache), "--factors")
    assert_bad_input(normlab("extrapolate", str(run / "missing"), cache=cache), "does not exist")


def test_extrapolate_cli_learned_positions(tmp_path_factory):
    _, cache = tiny_run(tmp_path_factory)
    out = tmp_path_factory.mktemp("runs") / "learned"
    normlab("train", "tiny", *SHORT, "--set", "train.steps=2", "--set", "model.positions=learned", "--out", str(out),
            cache=cache, check=True)
    assert_bad_input(normlab("extrapolate", str(out), "--factors", "1,2", cache=cache), "learned position table")
    m = json.loads(normlab("extrapolate", str(out), "--factors", "1", "--max-tokens", "200", "--json", cache=cache,
                           check=True).stdout)
    assert m["results"][0]["context"] == 64 and m["positions"] == "learned"
