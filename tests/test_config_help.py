"""``normlab config``: every key described from its declaration, and each listed range or choice list is what
validation itself accepts and refuses (the reference: ``config_from_dict``'s own errors)."""

from __future__ import annotations

import json

import pytest
import yaml

from normlab.config import KEYS, RunConfig, _all_keys, apply_overrides, config_from_dict, load_config
from normlab.config_help import describe_keys
from normlab.errors import NormlabError
from normlab.config import apply_norm_defaults
from tests.helpers import run_inproc

ROWS = {r["key"]: r for r in describe_keys()}


def _refusal(key: str, value) -> str:
    with pytest.raises(NormlabError) as e:
        config_from_dict(apply_overrides({}, [f"{key}={value}"]))
    return str(e.value)


def _leaves(obj, prefix=""):
    """Every leaf key of a config object, walked on the instance (not on the declarations)."""
    for name, value in vars(obj).items():
        if hasattr(value, "__dataclass_fields__"):
            yield from _leaves(value, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}", value


def test_every_key_has_a_one_line_description():
    """Every key of a default RunConfig is a row, in config order, with its default and a one-line description read
    from its own declaration."""
    leaves = dict(_leaves(RunConfig()))
    assert list(ROWS) == list(leaves) == _all_keys()
    for key, value in leaves.items():
        help_text = KEYS[key].facts.help
        assert help_text and "\n" not in help_text and ROWS[key]["description"] == help_text
        assert ROWS[key]["default"] == value


@pytest.mark.parametrize("key", [k for k, r in ROWS.items() if "range" in r])
def test_listed_ranges_are_what_validation_refuses(key):
    r = ROWS[key]["range"]
    outside = []
    if r["lo"] is not None:
        outside.append(r["lo"] if r["lo_open"] else (r["lo"] - 1 if r["integer"] else r["lo"] - 1e-3))
    if r["hi"] is not None and r["hi"] < 1e12:
        outside.append(r["hi"] if r["hi_open"] else (r["hi"] + 1 if r["integer"] else r["hi"] + 1e-3))
    assert outside
    for v in outside:
        msg = _refusal(key, int(v) if r["integer"] else v)
        assert key in msg and ROWS[key]["allowed"].removesuffix(" or null").split(" (")[0] in msg, msg


@pytest.mark.parametrize("key", [k for k, r in ROWS.items() if "choices" in r])
def test_listed_choices_are_what_validation_lists(key):
    msg = _refusal(key, "zzz-not-a-choice")
    if "true" in ROWS[key]["choices"]:  # auto / true / false: one sentence, not a list of names
        assert ROWS[key]["choices"] == ["auto", "true", "false"]
        assert msg == f"{key} must be auto, true or false, got 'zzz-not-a-choice'"
        for ok in ROWS[key]["choices"]:
            config_from_dict(apply_overrides({}, [f"{key}={ok}"]))
        return
    assert "allowed: " in msg, msg
    allowed = msg.split("allowed: ")[1].split(";")[0].split(", ")
    assert sorted(allowed) == sorted(ROWS[key]["choices"]), msg


def test_config_command_json_is_the_resolved_config(cache, tmp_path):
    out = json.loads(run_inproc("config", "tiny", "--set", "model.norm=unified", "--set", "train.lr=0.01",
                                "--json", cache=cache, check=True).stdout)
    cfg = load_config("tiny", ["model.norm=unified", "train.lr=0.01"])
    apply_norm_defaults(cfg)  # what train records in config.yaml (unified's statistics warm-up)
    assert out["config"] == json.loads(json.dumps(cfg.to_dict())) and out["config_hash"] == cfg.hash()
    keys = {r["key"]: r for r in out["keys"]}
    assert list(keys) == _all_keys()
    assert keys["train.lr"]["value"] == 0.01 and keys["train.lr"]["default"] == 0.003 == 3e-3
    assert keys["model.norm"]["value"] == "unified" and "rmsnorm" in keys["model.norm"]["choices"]
    assert keys["train.lr"]["description"] == KEYS["train.lr"].facts.help

    run = tmp_path / "run"
    run_inproc("train", "tiny", "--set", "train.steps=1", "--set", "model.context=16", "--out", str(run),
               cache=cache, check=True)
    saved = json.loads(run_inproc("config", str(run), "--json", cache=cache, check=True).stdout)
    assert saved["config"] == yaml.safe_load((run / "config.yaml").read_text())
    bad = run_inproc("config", "tiny", "--set", "train.lr=-1", cache=cache)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "train.lr must be > 0" in bad.stderr
    text = run_inproc("config", "tiny", cache=cache, check=True).stdout
    assert "model.norm" in text and "layernorm" in text


def test_train_track_is_a_list_and_changes_no_hash():
    """``train.track`` parses as a list (one name is a list of one), and leaves the config hash and the run
    fingerprint's config as they were without the key (runs from before it keep their hashes)."""
    base = load_config("tiny")
    both = load_config("tiny", ["train.track=[tensorboard, wandb]"])
    one = load_config("tiny", ["train.track=mlflow"])
    assert both.train.track == ["tensorboard", "wandb"] and one.train.track == ["mlflow"]
    required = load_config("tiny", ["train.track=mlflow", "train.track_required=true"])
    assert base.train.track == ["tensorboard"] and base.hash() == both.hash() == one.hash() == required.hash()
    assert required.train.track_required is True and base.train.track_required is False
    d = base.to_dict()
    del d["train"]["track"], d["train"]["deterministic"]  # deterministic at its default: tests/train/test_precision.py
    del d["train"]["track_required"]  # whether a tracker server may be missing: changes no number
    del d["train"]["stack"], d["train"]["tf32"]  # scheduling; tf32 at its default (tests/train/test_precision.py)
    del d["diag"]["probes"]  # at its default (false): measured after training, changes no number
    for k in ("residual", "streams", "hc_dynamic", "sinkhorn_iters", "ngpt_alpha_init"):
        del d["model"][k]  # the residual-stream keys at their defaults: runs from before them keep their hashes
    import hashlib

    assert base.hash() == hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]
    with pytest.raises(NormlabError, match="train.track lists a tracker twice"):
        load_config("tiny", ["train.track=[wandb, wandb]"])
