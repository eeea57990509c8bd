"""CLI contract: --json outputs, and every bad input is one line on stderr, exit 2, no traceback, nothing written."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.helpers import assert_bad_input, run_inproc as normlab
from tests.helpers import normlab as normlab_subprocess
from tests.helpers import summary

SHORT = ["--set", "train.steps=6", "--set", "train.eval_every=3", "--set", "train.checkpoint_every=3"]


@pytest.fixture(scope="module")
def run(tmp_path_factory, cache):
    out = tmp_path_factory.mktemp("runs") / "tiny"
    normlab("train", "tiny", *SHORT, "--out", str(out), cache=cache, check=True)
    return out


def test_eval_json_keys_and_floor(run, cache):
    r = normlab("eval", str(run), "--json", "--max-tokens", "2000", cache=cache, check=True)
    m = json.loads(r.stdout)
    for k in ("loss", "bpb", "token_perplexity", "byte_perplexity", "entropy_floor_bpb", "gap_bpb"):
        assert isinstance(m[k], float), k
    # the synthetic corpus has no whitespace: one harness "word", so no word perplexity (issue 29 item 7)
    assert m["words"] == 1 and m["word_perplexity"] is None and "no whitespace" in m["word_perplexity_null"]
    assert m["gap_bpb"] == pytest.approx(m["bpb"] - m["entropy_floor_bpb"])
    assert m["tokens"] == 2000 and json.loads((run / "eval_val.json").read_text())["loss"] == m["loss"]
    strided = json.loads(normlab("eval", str(run), "--json", "--max-tokens", "2000", "--stride", "16",
                                 "--split", "test", cache=cache, check=True).stdout)
    assert strided["stride"] == 16 and strided["tokens"] == 2000


def test_train_json_summary(run, cache):
    s = summary(run)
    assert s["status"] == "completed" and s["step"] == 6 and (run / "model.safetensors").is_file()
    r = normlab("train", "--resume", str(run), "--json", cache=cache, check=True)  # already complete: no-op
    assert json.loads(r.stdout)["step"] == 6


def test_norms_json(cache):
    rows = json.loads(normlab("norms", "--json", cache=cache, check=True).stdout)["norms"]
    assert {"layernorm", "rmsnorm"} <= {r["name"] for r in rows}
    assert all(set(r) == {"name", "paper", "description"} for r in rows)


@pytest.mark.parametrize(
    "args, fragments",
    [
        (["--set", "model.widht=64"], ["did you mean 'model.width'"]),
        (["--set", "model.width=wide"], ["model.width must be int"]),
        (["--set", "model.norm=lyernorm"], ["did you mean 'layernorm'", "allowed:"]),
        (["--set", "model.placement=middle"], ["model.placement", "allowed:"]),
        (["--set", "model.width=65"], ["divisible by model.heads"]),
        (["--set", "data.source=/nonexistent/corpus.txt"], ["/nonexistent/corpus.txt"]),
        (["--set", "data.source=nosuchkind:abc"], ["nosuchkind"]),
        (["--set", "model.context=100000"], ["too short"]),
        (["--set", "train.steps=-1"], ["train.steps"]),
        (["--set", "train.eval_sample=middle"], ["train.eval_sample", "allowed: head, spread"]),
        (["--set", "model.embed_scale=sqrt"], ["model.embed_scale", "allowed: auto, fixed, learnable, none"]),
        (["--set", "model.embed_scale_init=-2"], ["model.embed_scale_init must be > 0"]),
    ],
)
def test_bad_train_input(tmp_path, cache, args, fragments):
    out = tmp_path / "out"
    assert_bad_input(normlab("train", "tiny", *args, "--out", str(out), cache=cache), *fragments)
    assert not out.exists()


def test_empty_corpus(tmp_path, cache):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    assert_bad_input(normlab("train", "tiny", "--set", f"data.source={empty}", "--out", str(tmp_path / "o"),
                             cache=cache), "empty")


def test_missing_config_and_unknown_preset(tmp_path, cache):
    assert_bad_input(normlab("train", str(tmp_path / "nope.yaml"), cache=cache), "presets:", "tiny")
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [1, 2\n")
    assert_bad_input(normlab("train", str(bad), cache=cache), "not valid YAML")


def test_not_a_run(tmp_path, cache):
    assert_bad_input(normlab("eval", str(tmp_path), cache=cache), "not a normlab run")
    assert_bad_input(normlab("eval", str(tmp_path / "missing"), cache=cache), "does not exist")
    assert_bad_input(normlab("train", "--resume", str(tmp_path), cache=cache), "not a normlab run")


def test_corrupted_model_file(run, tmp_path, cache):
    broken = tmp_path / "broken"
    shutil.copytree(run, broken)
    data = (broken / "model.safetensors").read_bytes()
    (broken / "model.safetensors").write_bytes(data[: len(data) // 2])  # truncated
    assert_bad_input(normlab("eval", str(broken), cache=cache), "truncated or corrupted")
    (broken / "model.safetensors").write_bytes(b"\x80\x04not a safetensors file")  # e.g. a pickle
    assert_bad_input(normlab("eval", str(broken), cache=cache), "truncated or corrupted")


def test_foreign_weights(run, tmp_path, cache):
    other = tmp_path / "other"
    normlab("train", "tiny", *SHORT, "--set", "model.width=32", "--out", str(other), cache=cache, check=True)
    mixed = tmp_path / "mixed"
    shutil.copytree(run, mixed)
    shutil.copy(other / "model.safetensors", mixed / "model.safetensors")
    assert_bad_input(normlab("eval", str(mixed), cache=cache), "shape")


def test_corrupted_checkpoint_on_resume(tmp_path, cache):
    out = tmp_path / "r"
    normlab("train", "tiny", *SHORT, "--out", str(out), cache=cache, check=True)
    (out / "model.safetensors").unlink()
    (out / "summary.json").unlink()
    last = sorted((out / "checkpoints").iterdir())[-1]
    (last / "optim.safetensors").write_bytes(b"garbage")
    before = (last / "state.json").read_text()
    assert_bad_input(normlab("train", "--resume", str(out), cache=cache), "truncated or corrupted")
    assert (last / "state.json").read_text() == before  # nothing overwritten


def test_resume_with_changed_config(run, cache):
    assert_bad_input(normlab("train", "--resume", str(run), "--set", "model.norm=rmsnorm", cache=cache),
                     "model.norm")
    assert_bad_input(normlab("train", "tiny", "--out", str(run), cache=cache), "already holds a run")


def test_eval_learned_positions_refuse_long_context(tmp_path, cache):
    out = tmp_path / "learned"
    normlab("train", "tiny", *SHORT, "--set", "model.positions=learned", "--out", str(out), cache=cache, check=True)
    assert_bad_input(normlab("eval", str(out), "--context", "128", cache=cache), "learned position")


def test_subprocess_exit_status_and_single_line(tmp_path, cache):
    """The real console entry point: exit 2 and one stderr line, no traceback."""
    assert_bad_input(normlab_subprocess("train", "tiny", "--set", "model.norm=nope", cache=cache), "allowed:")
    assert_bad_input(normlab_subprocess("eval", str(tmp_path), cache=cache), "not a normlab run")


def test_unknown_command_and_option(cache):
    assert_bad_input(normlab("frobnicate", cache=cache))
    assert_bad_input(normlab("eval", "x", "--split", "train", cache=cache), "invalid choice")


def test_eval_and_train_print_the_unigram_level_and_flag_a_run_that_did_not_learn(run, cache):
    """6 steps learn nothing: eval reports the corpus's unigram level (the training split's byte entropy, scipy)
    beside the loss and its perplexity, and flags the run by the one did-not-learn rule (normlab.stats.learning);
    train's summary line says the same."""
    import math

    import numpy as np
    from scipy.stats import entropy

    from normlab.rundir.readers import open_config, run_data

    d = run_data(run, open_config(run))
    h1 = entropy(np.bincount(np.asarray(d.train), minlength=256), base=2)  # bytes tokenizer: bits per byte
    m = json.loads(normlab("eval", str(run), "--json", "--max-tokens", "2000", cache=cache, check=True).stdout)
    assert m["unigram_bpb"] == pytest.approx(h1, rel=1e-9)
    assert m["unigram_byte_perplexity"] == pytest.approx(2 ** h1, rel=1e-9)
    assert m["did_not_learn"] is True and m["bpb"] >= h1 - 0.1
    text = normlab("eval", str(run), "--max-tokens", "2000", cache=cache, check=True).stdout
    assert "unigram_bpb" in text and "unigram_byte_perplexity" in text
    assert f"not below the corpus's unigram level {h1:.4f} minus 0.1" in text
    from normlab.commands.train import print_summary

    s = summary(run)
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        print_summary({**s, "run_dir": str(run)})
    assert f"unigram level {s['unigram_bpb']:.4f} bits/byte -- DID NOT LEARN" in buf.getvalue()
    assert math.isclose(s["unigram_bpb"], h1, rel_tol=1e-9)


@pytest.mark.parametrize("argv", [["train", "tiny", "--out", ""], ["compare", "--preset", "quick", "--out", ""],
                                  ["convert", "RUN", "--to", "folded", "--out", ""],
                                  ["advise", "--width", "64", "--write", ""]], ids=lambda a: a[0])
def test_an_empty_path_to_write_is_refused_before_anything_runs(tmp_path, cache, argv, monkeypatch):
    """``--out ""`` (an unset shell variable) would otherwise mean the default location, or the current directory:
    one line naming the flag, exit 2, nothing written."""
    monkeypatch.chdir(tmp_path)
    flag = "--write" if "--write" in argv else "--out"
    assert_bad_input(normlab(*argv, cache=cache), f"{flag} is empty")
    assert list(tmp_path.iterdir()) == []
