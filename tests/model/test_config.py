"""normlab.model.config.ModelConfig: ``model.norm_options`` may not set ``eps`` (build_norm gets ``eps=norm_eps``
beside the options; before, the duplicate keyword was a TypeError traceback); the CLI says so in one line, exit 2,
and writes nothing."""

from __future__ import annotations

import pytest

from normlab.config import config_from_dict
from normlab.errors import NormlabError
from tests.helpers import assert_bad_input, run_inproc


@pytest.mark.parametrize("key", ["eps", "eps@attn"])
def test_eps_in_norm_options_names_norm_eps(key):
    with pytest.raises(NormlabError) as e:
        config_from_dict({"model": {"norm_options": {key: 0.1}}})
    assert str(e.value) == (f"model.norm_options key '{key}': a norm's eps is model.norm_eps (one value for every "
                            "site); set that key instead")


@pytest.mark.parametrize("opt, fragment", [("eps=0.1", "model.norm_eps"), ("dim=3", "does not take option(s) dim"),
                                           ("self=1", "does not take option(s) self")])
def test_train_refuses_clashing_norm_options_in_one_line(tmp_path, opt, fragment):
    out = tmp_path / "run"
    proc = run_inproc("train", "tiny", "--set", f"model.norm_options.{opt}", "--set", "train.steps=2",
                      "--out", str(out), cache=tmp_path / "cache")
    assert_bad_input(proc, fragment)
    assert not out.exists()


def test_norm_eps_still_reaches_every_norm():
    cfg = config_from_dict({"model": {"norm_eps": 1e-3, "norm_options": {"affine@final": False}}})
    assert cfg.model.norm_kwargs("final") == {"affine": False} and cfg.model.norm_eps == 1e-3
