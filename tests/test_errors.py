"""normlab.errors: the one wording of refusals (unknown names and keys, with the closest allowed spelling)."""

from __future__ import annotations

import pytest

from normlab.errors import NormlabError, check_keys, clip, did_you_mean, unknown
from normlab.experiments.sweep import parse_sweep


def test_did_you_mean_folds_case_and_dashes_then_falls_back_to_close_spellings():
    assert did_you_mean("RMS-Norm", ["layernorm", "rmsnorm"]) == " (did you mean 'rmsnorm'?)"
    assert did_you_mean("layrnorm", ["layernorm", "rmsnorm"]) == " (did you mean 'layernorm'?)"
    assert did_you_mean("zzz", ["layernorm", "rmsnorm"]) == ""


def test_check_keys_names_the_first_unknown_key_and_what_is_allowed():
    check_keys({"a": 1, "b": 2}, ("a", "b", "c"), "here")  # all known: nothing raised
    with pytest.raises(NormlabError) as e:
        check_keys({"a": 1, "sed": 2, "zz": 3}, ("a", "seed"), "f.yaml: section")
    assert str(e.value) == "f.yaml: section: unknown key 'sed' (did you mean 'seed'?); allowed: a, seed"


def test_unknown_lists_allowed_names_sorted():
    assert str(unknown("norm", "rms", ["rmsnorm", "layernorm"])) == (
        "unknown norm 'rms' (did you mean 'rmsnorm'?); allowed: layernorm, rmsnorm")


@pytest.mark.parametrize("raw, message", [
    ({"name": "s", "base": "tiny", "seeds": [0], "variants": [{"name": "a", "set": {}, "sets": {}}]},
     ": variant 'a': unknown key 'sets' (did you mean 'set'?); allowed: name, set"),
    ({"name": "s", "seeds": [0], "variant": []}, "unknown key 'variant' (did you mean 'variants'?)"),
])
def test_sweep_files_refuse_unknown_keys_in_the_one_wording(raw, message):
    with pytest.raises(NormlabError) as e:
        parse_sweep(raw)
    assert message in str(e.value)


def test_clip_keeps_a_short_text_and_shortens_a_long_one_to_its_ends_and_length():
    assert clip("pystdlib") == "pystdlib"
    assert clip("a\x1bb") == "a\\x1bb"  # printable first
    long = "s" * 100 + "M" * 2800 + "e" * 100
    got = clip(long)
    assert got == "s" * 100 + "M" * 60 + "..." + "e" * 80 + " (3000 characters)"
    assert len(got) < 300 and clip("x" * 240) == "x" * 240
