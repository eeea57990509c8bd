"""Other tools' key names get "did you mean" the normlab key (normlab.aliases), and enumerated values are matched up
to case and separators (``RMSNorm`` -> ``rmsnorm``)."""

from __future__ import annotations

import pytest
import yaml

from normlab.aliases import KEY_ALIASES
from normlab.config import _all_keys
from tests.helpers import assert_bad_input, run_inproc

ISSUE = {"n_layer": "model.depth", "n_embd": "model.width", "n_head": "model.heads", "block_size": "model.context",
         "learning_rate": "train.lr", "hidden_size": "model.width", "num_hidden_layers": "model.depth"}


def test_every_alias_names_a_real_key():
    keys = set(_all_keys())
    assert {t for t, _ in KEY_ALIASES.values()} <= keys
    assert not set(KEY_ALIASES) & {k.rsplit(".", 1)[-1] for k in keys}  # an alias never shadows a real name
    assert {k: KEY_ALIASES[k][0] for k in ISSUE} == ISSUE


@pytest.mark.parametrize("key", ["n_layer", "model.n_embd", "model.n_head", "block_size", "train.learning_rate",
                                 "model.hidden_size", "num_hidden_layers"])
def test_set_alias_suggests_normlab_key(key, tmp_path):
    proc = run_inproc("train", "tiny", "--set", f"{key}=4", "--out", str(tmp_path / "r"), cache=tmp_path)
    assert_bad_input(proc, f"unknown config key '{key}'", f"did you mean '{ISSUE[key.rsplit('.', 1)[-1]]}'")
    assert not (tmp_path / "r").exists()


def test_yaml_and_sweep_aliases(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"model": {"n_layer": 2}}))
    assert_bad_input(run_inproc("train", str(cfg), cache=tmp_path), "model.n_layer", "did you mean 'model.depth'")
    sw = tmp_path / "s.yaml"
    sw.write_text(yaml.safe_dump({"base": "tiny", "axes": {"model.intermediate_size": [128]}}))
    assert_bad_input(run_inproc("compare", str(sw), "--out", str(tmp_path / "o"), cache=tmp_path),
                     "did you mean 'model.mlp_ratio'", "ratio")


@pytest.mark.parametrize(
    "value, want", [("RMSNorm", "rmsnorm"), ("LayerNorm", "layernorm"), ("Layer_Norm", "layernorm")]
)
def test_norm_names_in_other_spellings(value, want, tmp_path):
    assert_bad_input(run_inproc("train", "tiny", "--set", f"model.norm={value}", cache=tmp_path),
                     f"did you mean '{want}'")
