"""Config loading and validation: presets, overrides, one-line errors; each key declared once on its field (type,
default, help, range or choices, other tools' names), the tables derived from there; other tools' key names get
"did you mean" the normlab key, and enumerated values are matched up to case and separators (``RMSNorm`` ->
``rmsnorm``)."""

from __future__ import annotations

import dataclasses
import hashlib
import json

import pytest
import yaml

from normlab.config import (BOOKKEEPING_KEYS, CONFIG_DIR, KEY_ALIASES, KEYS, RANGES, RUNTIME_KEYS, _all_keys,
                            config_from_dict, derive_config, load_config, new_config, planned_config,
                            stored_config)
from normlab.errors import NormlabError
from normlab.validate import I, declared_keys, setting
from tests.helpers import assert_bad_input, run_inproc


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
        ({"model": {"placement": "middle"}}, "allowed: deepnorm, mix, output, peri, post, pre"),
        ({"model": {"width": 65, "heads": 4}}, "divisible"),
        ({"model": "big"}, "must be a mapping"),
        ({"train": {"steps": 0}}, "train.steps must be >= 1"),
        ({"train": {"lr": 10**400}}, "train.lr must be a finite number, got an integer of 401 digits"),
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
        assert str(e.value) == f"{what} {binary} is not UTF-8 text (byte 0xff at line 1); YAML files are read as UTF-8"
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


def test_each_section_validates_its_declared_ranges():
    """The range a field declares is what validation checks: each section's own ``validate()`` (a bare ModelConfig /
    TrainConfig ... too, not only a run config; ``seed`` by RunConfig's) refuses a value just outside any of them
    with the range's message, the same line a run config (``--set``) gives."""
    from normlab.config import RunConfig

    sections = {f.name: f.type for f in dataclasses.fields(RunConfig)}
    checked = 0
    for key, rng in RANGES.items():
        section, _, name = key.partition(".")
        if not name:  # seed: a run-level key
            section, name = "", key
        for bad in _outside(rng):
            msg = f"{key} must be {rng.text(bad)}, got {bad!r}"
            part = getattr(RunConfig(), section) if section else RunConfig()
            setattr(part, name, bad)
            with pytest.raises(NormlabError) as e:
                part.validate()
            assert str(e.value) == msg, sections[section]
            with pytest.raises(NormlabError) as e:
                config_from_dict({section: {name: bad}} if section else {name: bad})
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


def test_the_derived_tables_are_the_hand_written_ones_they_replace():
    """The ranges and other tools' names, now read from the fields' declarations, are exactly the two tables that
    held them before (``validate.RANGES``, 46 keys, and ``aliases.KEY_ALIASES``, 72 names), plus the residual-stream
    keys added since (ranges of ``model.streams``, ``sinkhorn_iters``, ``ngpt_alpha_init``; the aliases
    ``num_residual_streams``, ``hyper_connection_count``, ``expansion_rate``): their digest. A deliberate change of a
    range or an alias changes it here too."""
    blob = json.dumps({"ranges": {k: dataclasses.astuple(r) for k, r in RANGES.items()},
                       "aliases": {k: list(v) for k, v in KEY_ALIASES.items()}}, sort_keys=True)
    assert (len(RANGES), len(KEY_ALIASES)) == (49, 75)
    assert hashlib.sha256(blob.encode()).hexdigest()[:16] == "c274365d7cfb9034"
    assert KEY_ALIASES["intermediate_size"] == ("model.mlp_ratio", "normlab takes the ratio intermediate_size / width")
    # the key lists that were written by hand next to the banner and the config hash
    assert set(RUNTIME_KEYS) == {"device", "train.precision", "train.compile", "train.threads", "train.tf32",
                                 "train.stack", "train.deterministic"}  # deterministic: auto since issue 55
    assert set(BOOKKEEPING_KEYS) == {"train.track", "train.track_required", "train.log_every",
                                     "train.checkpoint_every", "train.keep_checkpoints", "train.eval_every",
                                     "train.eval_batches", "data.cache_dir"}
    assert {k: d.facts.identity for k, d in KEYS.items() if d.facts.identity != "kept"} == {
        "train.track": "dropped", "train.track_required": "dropped", "train.stack": "dropped",
        "train.deterministic": "dropped at default", "train.tf32": "dropped at default",
        "diag.probes": "dropped at default",
        # the residual-stream keys (docs/streams.md): every earlier run trained with their defaults
        **{f"model.{k}": "dropped at default" for k in ("residual", "streams", "hc_dynamic", "sinkhorn_iters",
                                                        "ngpt_alpha_init")}}


def test_identity_drops_the_declared_keys_as_the_hand_written_rule_did():
    """``identity_dict`` (the config hash's input) against the rule it replaces, written out here: ``train.track``,
    ``track_required`` and ``stack`` always out; ``deterministic`` out when ``True`` (and ``"auto"``, its default
    since issue 55, which hashes as ``True`` did), ``tf32`` when ``"auto"``, ``diag.probes`` when ``False``, the
    residual-stream keys at their defaults; for every combination of those keys' values."""
    import itertools

    def by_hand(cfg):
        d = cfg.to_dict()
        for k in ("track", "track_required", "stack"):
            d["train"].pop(k)
        if d["train"]["deterministic"] is True or d["train"]["deterministic"] == "auto":
            del d["train"]["deterministic"]
        if d["train"]["tf32"] == "auto":
            del d["train"]["tf32"]
        if d["diag"]["probes"] is False:
            del d["diag"]["probes"]
        for k, default in (("residual", "add"), ("streams", 4), ("hc_dynamic", True), ("sinkhorn_iters", 20),
                           ("ngpt_alpha_init", 0.05)):  # the residual-stream keys at their defaults
            if d["model"][k] == default:
                del d["model"][k]
        return d

    for det, tf32, probes, stack in itertools.product(["true", "false", "auto"], ["auto", "true", "false"],
                                                      ["true", "false"], ["auto", "on", "off"]):
        cfg = load_config("tiny", [f"train.deterministic={det}", f"train.tf32={tf32}", f"diag.probes={probes}",
                                   f"train.stack={stack}", "train.track=[]"])
        assert cfg.identity_dict() == by_hand(cfg)


def test_a_key_declared_without_its_facts_is_refused():
    """A key's facts are written once, on its field: ``setting`` refuses a key without a one-line help, and the
    table (``declared_keys``, what normlab.config builds at import) a plain field, a numeric key with neither a
    range nor an owner, and an alias declared twice or equal to a key's own name."""
    with pytest.raises(TypeError, match="one-line help"):
        setting(1)
    with pytest.raises(TypeError, match="one-line help"):
        setting(1, "two\nlines", range=I(0))
    with pytest.raises(TypeError, match="identity must be one of"):
        setting(1, "a count", range=I(0), identity="sometimes")

    def section(**fields):
        return dataclasses.make_dataclass("Scratch", [(n, tp, f) for n, (tp, f) in fields.items()])

    ok = section(n=(int, setting(1, "a count", range=I(0), aliases=("num",))), name=(str, setting("a", "a name")))
    table = declared_keys(ok)
    assert list(table) == ["n", "name"] and table["n"].default == 1 and table["n"].facts.range == I(0)
    for bad, fragment in [
        (section(n=(int, dataclasses.field(default=1))), "config key n is declared without its facts"),
        (section(n=(int, setting(1, "a count"))), "numeric config key n declares no range"),
        (section(x=(float | None, setting(None, "a scale"))), "numeric config key x declares no range"),
        (section(n=(int, setting(1, "a", range=I(0), aliases=("k",))), m=(int, setting(1, "b", range=I(0),
                                                                                      aliases=("k",)))), "'k'"),
        (section(n=(int, setting(1, "a", range=I(0), aliases=("m",))), m=(int, setting(1, "b", range=I(0)))), "'m'"),
    ]:
        with pytest.raises(TypeError, match=fragment):
            declared_keys(bad)


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


def test_a_config_path_that_is_not_a_regular_file_is_named_so(tmp_path):
    """A FIFO or a directory given as the config is refused as such, never opened (a FIFO would block), and not
    reported as a missing file."""
    import os

    from normlab.config import resolve_config_path

    fifo, folder = tmp_path / "c.yaml", tmp_path / "d.yaml"
    os.mkfifo(fifo)
    folder.mkdir()
    for p in (fifo, folder):
        with pytest.raises(NormlabError, match=r"is not a regular file \(a directory, FIFO or device\)"):
            resolve_config_path(str(p))
    with pytest.raises(NormlabError, match="is neither a file nor a preset"):
        resolve_config_path(str(tmp_path / "missing.yaml"))


# ------------------------------------------------------------------------ building, completing, reading back
def test_a_new_runs_config_is_completed_by_the_norm_defaults_and_a_planned_one_is_not():
    """new_config / load_config fill PowerNorm's warmup from train.warmup_steps (what config.yaml records); a
    sweep's planned config keeps the sweep file's keys, so its hash is the one earlier sweeps stored; the input
    mapping is not changed."""
    data = {"model": {"norm": "powernorm"}, "train": {"warmup_steps": 7}}
    new = new_config(data, ["train.steps=30"])
    assert new.model.norm_options == {"warmup": 7} and new.train.steps == 30
    assert data == {"model": {"norm": "powernorm"}, "train": {"warmup_steps": 7}}
    planned = planned_config(data)
    assert planned.model.norm_options == {} and planned.hash() == config_from_dict(data).hash() != new.hash()
    assert new_config({"model": {"norm": "powernorm", "norm_options": {"warmup": 3}}}).model.norm_options == {
        "warmup": 3}  # a value the user set is kept
    assert load_config("tiny", ["model.norm=powernorm"]).model.norm_options == {"warmup": 10}  # tiny: warmup 10


def test_a_stored_config_reads_back_as_written_and_names_where_it_is_bad():
    cfg = new_config({"model": {"norm": "powernorm"}})
    back = stored_config(cfg.to_dict(), "sweep run r1")
    assert back.to_dict() == cfg.to_dict() and back.hash() == cfg.hash()
    raw = config_from_dict({"model": {"norm": "powernorm"}}).to_dict()  # written before completion
    assert stored_config(raw, "sweep run r1").model.norm_options == {}  # not completed again
    raw["train"]["lr"] = -1.0
    with pytest.raises(NormlabError, match=r"^sweep run r1: .*train\.lr"):
        stored_config(raw, "sweep run r1")


def test_a_derived_config_changes_its_keys_only_and_completes_nothing():
    base = config_from_dict({"model": {"norm": "layernorm", "width": 32, "heads": 2}, "seed": 3})
    new = derive_config(base, {"model.norm": "powernorm", "model.norm_options": {}}, ["train.lr=0.01"])
    expected = base.to_dict()
    expected["model"]["norm"], expected["train"]["lr"] = "powernorm", 0.01
    assert new.to_dict() == expected  # no warmup added: a derived config is completed when it trains
    assert base.model.norm == "layernorm"  # the source is not changed
    with pytest.raises(NormlabError, match="unknown config key 'model.widht'.*model.width"):
        derive_config(base, {"model.widht": 8})
    with pytest.raises(NormlabError, match="heads"):
        derive_config(base, {"model.heads": 5})  # validated: 32 is not divisible by 5
