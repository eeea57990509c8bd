"""``normlab train --init-from`` (normlab.train.init_from): the source is checked before anything is written or
any rank starts (issue 27 item 7): non-finite weights, a missing source with ``--nproc``, and the tokenizer
(config.yaml must say what data.json records; an explicit other tokenizer is refused, not dropped)."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

from tests.helpers import assert_bad_input, run_inproc

pytestmark = pytest.mark.usefixtures("one_thread")

SOURCE = "synthetic:markov?order=1&alphabet=16&length=20000&concentration=0.1&seed=0"
SETS = ["--set", f"data.source={SOURCE}", "--set", "train.eval_every=2", "--set", "train.checkpoint_every=2",
        "--set", "diag.every=0", "--set", "model.depth=1", "--set", "train.eval_batches=1"]


def _train(out, cache, *extra):
    run_inproc("train", "tiny", *SETS, "--set", "train.steps=2", *extra, "--out", str(out), cache=cache,
               check=True)
    return out


@pytest.fixture(scope="module")
def source(tmp_path_factory, cache):
    return _train(tmp_path_factory.mktemp("src") / "run", cache)


def test_nan_weights_are_refused_before_a_run_directory_exists(source, tmp_path, cache):
    import torch
    from safetensors.torch import load_file, save_file

    bad = tmp_path / "nan"
    shutil.copytree(source, bad)
    t = load_file(str(bad / "model.safetensors"))
    name = sorted(t)[0]
    t[name].view(-1)[0] = float("nan")
    save_file(t, str(bad / "model.safetensors"))
    assert not bool(torch.isfinite(load_file(str(bad / "model.safetensors"))[name]).all())
    out = tmp_path / "ft"
    assert_bad_input(run_inproc("train", "tiny", *SETS, "--init-from", str(bad), "--out", str(out), cache=cache),
                     "--init-from", f"tensor '{name}'", "NaN or inf")
    assert not out.exists()


def test_nproc_with_a_missing_source_is_one_line_before_any_rank(tmp_path, cache):
    out = tmp_path / "ft"
    p = run_inproc("train", "tiny", *SETS, "--nproc", "2", "--init-from", str(tmp_path / "missing"), "--out",
                   str(out), cache=cache)
    assert_bad_input(p, "--init-from", "run directory does not exist")
    assert not out.exists()


def test_an_explicit_other_tokenizer_is_refused_not_dropped(source, tmp_path, cache):
    out = tmp_path / "ft"
    p = run_inproc("train", "tiny", *SETS, "--set", "data.tokenizer=bpe:300", "--init-from", str(source),
                   "--out", str(out), cache=cache)
    assert_bad_input(p, "data.tokenizer 'bpe:300' differs from the source run's tokenizer 'bytes'")
    assert not out.exists()


def test_config_yaml_names_the_tokenizer_data_json_records(tmp_path, cache):
    """A BPE source, a config that chooses no tokenizer: the new run's config.yaml and data.json agree."""
    src = _train(tmp_path / "bpe", cache, "--set", "data.tokenizer=bpe:300")
    out = _train(tmp_path / "ft", cache, "--init-from", str(src))
    cfg = yaml.safe_load((out / "config.yaml").read_text())
    data = json.loads((out / "data.json").read_text())
    assert cfg["data"]["tokenizer"] == str(src / "tokenizer.json")
    assert data["tokenizer"]["kind"] != "bytes"
    assert json.loads((src / "data.json").read_text())["tokenizer"]["sha256"] == data["tokenizer"]["sha256"]
