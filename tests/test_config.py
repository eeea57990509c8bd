"""Config loading and validation: presets, overrides, one-line errors."""

from __future__ import annotations

import pytest

from normlab.config import CONFIG_DIR, config_from_dict, load_config
from normlab.errors import NormlabError


@pytest.mark.parametrize("preset", sorted(p.stem for p in CONFIG_DIR.glob("*.yaml")))
def test_shipped_presets_validate(preset):
    cfg = load_config(preset)
    assert cfg.model.width % cfg.model.heads == 0


def test_presets_exist():
    assert {"tiny", "small"} <= {p.stem for p in CONFIG_DIR.glob("*.yaml")}


def test_overrides_are_typed():
    cfg = load_config("tiny", ["model.norm=rmsnorm", "train.lr=1e-3", "model.depth=3", "seed=7"])
    assert (cfg.model.norm, cfg.train.lr, cfg.model.depth, cfg.seed) == ("rmsnorm", 1e-3, 3, 7)
    assert isinstance(cfg.train.lr, float)


@pytest.mark.parametrize(
    "data, fragment",
    [
        ({"model": {"widht": 64}}, "did you mean 'model.width'"),
        ({"model": {"width": "wide"}}, "model.width must be int"),
        ({"model": {"depth": 2.5}}, "model.depth must be int"),
        ({"train": {"lr": True}}, "train.lr must be float"),
        ({"model": {"norm": "batchnorn2"}}, "allowed: "),
        ({"model": {"placement": "middle"}}, "allowed: mix, output, peri, post, pre"),
        ({"model": {"width": 65, "heads": 4}}, "divisible"),
        ({"model": "big"}, "must be a mapping"),
        ({"train": {"steps": 0}}, "train.steps must be >= 1"),
    ],
)
def test_bad_config_one_line(data, fragment):
    with pytest.raises(NormlabError) as e:
        config_from_dict(data)
    assert fragment in str(e.value) and "\n" not in str(e.value)


def test_unknown_override_key():
    with pytest.raises(NormlabError, match="did you mean 'train.steps'"):
        load_config("tiny", ["train.step=5"])


def test_hash_changes_with_any_key():
    a = config_from_dict({})
    b = config_from_dict({"model": {"norm_eps": 1e-6}})
    assert a.hash() != b.hash() and a.hash() == config_from_dict({}).hash()


def test_config_and_sweep_files_share_one_yaml_reader(tmp_path):
    """A run config and a sweep file are read by ``normlab.io.read_yaml_file``: the same one-line failures, each
    naming what the file is (line numbers count from 1)."""
    from normlab.config import read_yaml
    from normlab.experiments.sweep import load_sweep

    bad, binary = tmp_path / "bad.yaml", tmp_path / "bin.yaml"
    bad.write_text("a: 1\nb: 2\nc: d: e\n")
    binary.write_bytes(b"a: \xff\xfe\n")
    for read, what in ((read_yaml, "config"), (load_sweep, "sweep file")):
        with pytest.raises(NormlabError) as e:
            read(bad)
        assert str(e.value) == f"{what} {bad} is not valid YAML at line 3"
        with pytest.raises(NormlabError) as e:
            read(binary)
        assert str(e.value) == f"cannot read {what} {binary}: UnicodeDecodeError"
    with pytest.raises(NormlabError) as e:
        read_yaml(tmp_path)
    assert str(e.value) == f"config {tmp_path} is a directory, not a regular file; normlab reads only regular files"


def _outside(rng) -> list:
    """Values just outside a ``normlab.validate.Range`` (each bound it has)."""
    cast = int if rng.integer else float
    out = []
    if rng.lo is not None:
        out.append(cast(rng.lo if rng.lo_open else rng.lo - 1))
    if rng.hi is not None:
        out.append(cast(rng.hi if rng.hi_open else rng.hi + 1))
    return out


def test_each_section_validates_its_ranges_from_the_one_table():
    """``normlab.validate.RANGES`` is the one declaration of the config's numeric ranges: each section's own
    ``validate()`` (a bare ModelConfig / TrainConfig ... too, not only a run config) refuses a value just outside
    any of them with the table's message, the same line a run config (``--set``) gives."""
    import dataclasses

    from normlab.config import RunConfig
    from normlab.validate import RANGES

    sections = {f.name: f.type for f in dataclasses.fields(RunConfig)}
    checked = 0
    for key, rng in RANGES.items():
        section, _, name = key.partition(".")
        if not name:  # seed: a run-level key
            continue
        for bad in _outside(rng):
            msg = f"{key} must be {rng.text(bad)}, got {bad!r}"
            part = getattr(RunConfig(), section)
            setattr(part, name, bad)
            with pytest.raises(NormlabError) as e:
                part.validate()
            assert str(e.value) == msg, sections[section]
            with pytest.raises(NormlabError) as e:
                config_from_dict({section: {name: bad}})
            assert str(e.value) == msg
            checked += 1
    assert checked > 40


def test_non_default_names_every_key_set_away_from_its_default():
    """``non_default`` (the training banner's "not default:" line) against the dataclasses' own defaults: nothing
    for the defaults, exactly the keys a user set otherwise (a mapping entry by entry), and neither the machine's
    runtime keys nor where a run logs."""
    from normlab.config import RunConfig, non_default

    assert non_default(RunConfig()) == []
    sets = {"train.clip": "adagc", "model.output": "stablemax", "optim.perp_grad": True, "model.norm": "dyt",
            "train.lr": 0.01, "seed": 3}
    from normlab.config import apply_overrides

    cfg = config_from_dict(apply_overrides({}, [f"{k}={str(v).lower() if isinstance(v, bool) else v}"
                                                for k, v in sets.items()]
                                           + ["train.log_every=7", "device=cpu", "train.precision=fp32",
                                              "model.norm_options.alpha_init=0.8"]))
    assert dict(non_default(cfg)) == {**sets, "model.norm_options.alpha_init": 0.8}
