"""normlab.experiments.sweepfile: a key spelled twice in one ``set:`` (dotted and nested) is refused in one line
naming it, not silently resolved to whichever spelling was read last."""

from __future__ import annotations

import pytest

from normlab.errors import NormlabError
from normlab.experiments.sweepfile import flatten
from tests.helpers import assert_bad_input, run_inproc


def test_flatten_keeps_one_spelling_of_each_key():
    assert flatten({"train.steps": 4, "model": {"norm": "rmsnorm"}}, "set") == {"train.steps": 4,
                                                                               "model.norm": "rmsnorm"}
    with pytest.raises(NormlabError, match=r"^set: 'train.steps' is given twice, as 'train.steps' and as "
                                           r"'train: \{steps: \.\.\.\}'; give each key once"):
        flatten({"train.steps": 4, "train": {"steps": 5}}, "set")
    with pytest.raises(NormlabError, match=r"^set: 'train.steps' is given twice, as 'train: \{steps: \.\.\.\}' "
                                           r"and as 'train.steps'"):
        flatten({"train": {"steps": 5}, "train.steps": 4}, "set")
    with pytest.raises(NormlabError, match=r"^v: 'model.norm_options' \(which holds 'model.norm_options.eps'\) is "
                                           r"given twice"):
        flatten({"model": {"norm_options": {"eps": 1e-5}}, "model.norm_options.eps": 1e-6}, "v")


def test_compare_refuses_a_key_set_dotted_and_nested(tmp_path):
    """The issue's sweep: ``set: {train.steps: 4, train: {steps: 5}}`` trained 5 steps; now exit 2, one line naming
    the key, no sweep directory made. The same in a variant's ``set:``."""
    for where, text in (("set", "set: {train.steps: 4, train: {steps: 5}}\nvariants:\n  - {name: a, set: {}}\n"),
                        ("variant 'a'", "variants:\n  - {name: a, set: {train: {steps: 5}, train.steps: 4}}\n")):
        f = tmp_path / "dup.yaml"
        f.write_text("name: dup\nbase: tiny\n" + text)
        out = tmp_path / "out"
        assert_bad_input(run_inproc("compare", str(f), "--out", str(out), cache=tmp_path / "c"),
                         where, "'train.steps' is given twice")
        assert not out.exists()
