"""normlab.experiments.sweepspec: a sweep's stored spec read back typed. The reference is the serialised form
itself: every attribute equals the key ``sweep.yaml`` holds (read with plain ``yaml.safe_load``), a parsed sweep's
``resolved`` equals what its stored file reads back to, and the hash is the serialised form's."""

from __future__ import annotations

import pytest
import yaml

from normlab.experiments.sweep import SWEEP_DIR, dump_spec, load_sweep, parse_sweep
from normlab.experiments.sweepspec import SweepSpec, stored_sweep

TWO = [{"name": "A", "set": {"model.placement": "pre"}}, {"name": "B", "set": {"model.placement": "post"}}]
EVERY_KEY = {"name": "all", "description": "every key", "base": "tiny", "set": {"train": {"steps": 6}},
             "variants": TWO, "seeds": [3, 4], "lr_grid": [1e-3, 1e-2],
             "baseline": "B", "primary": "best_loss", "family": ["A"], "alpha": 0.01, "correction": "holm",
             "paired": True, "sequential": {"max_seeds": 6}, "replicate": "english", "replicate_seeds": [50, 51],
             "designed_from": "seeds 0-2 of runs/x"}
SIZED = {"name": "sized", "base": "tiny", "set": {"train.steps": 4}, "variants": TWO, "seeds": [0],
         "sizes": [[32, 1], [64, 2]], "tokens_per_param": 2.0, "lr_transfer": {"base_width": 32, "exponent": 1.0},
         "margin": 0.01}


def _sweeps():
    yield from ((f"preset {p.stem}", load_sweep(preset=p.stem)) for p in sorted(SWEEP_DIR.glob("*.yaml")))
    yield "every key", parse_sweep(EVERY_KEY)
    yield "sizes", parse_sweep(SIZED)


def test_every_attribute_is_the_key_sweep_yaml_holds():
    for what, sweep in _sweeps():
        d = yaml.safe_load(dump_spec(sweep))  # the file as written, read without normlab
        s = SweepSpec.from_mapping(d)
        assert s == sweep.resolved, what
        plan = d.get("sequential")
        expect = {"name": d["name"], "description": d["description"], "base": d["base"], "overrides": d["set"],
                  "axes": d["axes"], "variants": tuple((v["name"], v["set"]) for v in d.get("variants", [])),
                  "seeds": d["seeds"], "lr_grid": d.get("lr_grid"), "tokens_per_param": d.get("tokens_per_param"),
                  "lr_transfer": d.get("lr_transfer"), "baseline": d.get("baseline"), "primary": d.get("primary"),
                  "family": tuple(d["family"]) if "family" in d else None, "alpha": d.get("alpha", 0.05),
                  "correction": d.get("correction"), "paired": d.get("paired", True), "margin": d.get("margin"),
                  "looks": plan["looks"] if plan else None, "replicate": d.get("replicate"),
                  "replicate_seeds": d.get("replicate_seeds"), "designed_from": d.get("designed_from")}
        assert {k: getattr(s, k) for k in expect} == expect, what
        assert parse_sweep(d).hash == sweep.hash, what  # the stored form is the hashed one


def test_every_key_is_read():
    s = parse_sweep(EVERY_KEY).resolved
    assert (s.seeds, s.looks, s.baseline, s.replicate, s.replicate_seeds) == (
        [3, 4, 5, 6, 7, 8], [2, 4, 6], "B", "english", [50, 51])  # the plan extends the seeds to its cap
    assert s.overrides == {"train.steps": 6} and s.variants == (("A", TWO[0]["set"]), ("B", TWO[1]["set"]))
    assert (s.primary, s.family, s.alpha, s.lr_grid) == ("best_loss", ("A",), 0.01, [1e-3, 1e-2])
    z = parse_sweep(SIZED).resolved
    assert (z.tokens_per_param, z.lr_transfer, z.margin) == (2.0, {"base_width": 32, "exponent": 1.0}, 0.01)


def test_stored_sweep_reads_the_file_or_says_none(tmp_path):
    sweep = parse_sweep(EVERY_KEY)
    assert stored_sweep(tmp_path) is None  # no sweep.yaml
    (tmp_path / "sweep.yaml").write_text(dump_spec(sweep))
    assert stored_sweep(tmp_path) == sweep.resolved
    (tmp_path / "sweep.yaml").write_text("- a list\n")
    assert stored_sweep(tmp_path) is None
    (tmp_path / "sweep.yaml").write_text("base: [unclosed\n")
    assert stored_sweep(tmp_path) is None


@pytest.mark.parametrize("raw", [None, [], "seeds: [1]", {"seeds": "0,1", "sequential": {"max_seeds": 4},
                                                            "variants": [{"set": {}}], "base": "tiny"}])
def test_a_malformed_spec_reads_as_the_defaults(raw):
    s = SweepSpec.from_mapping(raw)
    assert (s.seeds, s.looks, s.variants, s.base, s.alpha, s.paired) == ([], None, (), {}, 0.05, True)
