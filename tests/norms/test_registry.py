"""normlab.norms.registry.build_norm: an option named like one of its own arguments (``self``, ``dim``, ``name``) is
the one-line "does not take option" error that any unknown option gets, never a TypeError from the call; a real
option still reaches the class (its value read back from the module). An option the class declares ``bool`` takes
true/false only (``affine: maybe`` or ``1`` was truthy and trained with a gain); ``bool | None`` also takes null."""

from __future__ import annotations

import pytest

from normlab.errors import NormlabError
from normlab.norms import build_norm


@pytest.mark.parametrize("norm", ["layernorm", "dyt"])
@pytest.mark.parametrize("key", ["self", "dim", "name"])
def test_an_argument_name_as_option_is_one_line(norm, key):
    with pytest.raises(NormlabError) as e:
        build_norm(norm, 8, **{key: 3})
    msg = str(e.value)
    assert f"does not take option(s) {key};" in msg and "allowed: eps, affine, bias" in msg and "\n" not in msg
    assert "self" not in msg.partition("allowed:")[2] and "dim" not in msg.partition("allowed:")[2]


def test_a_misspelt_option_names_the_closest_one():
    with pytest.raises(NormlabError, match=r"does not take option\(s\) alpah_init \(did you mean 'alpha_init'\?\); "
                       "allowed: eps, affine, bias, alpha_init$"):
        build_norm("dyt", 8, alpah_init=0.8)


def test_a_real_option_still_reaches_the_class():
    m = build_norm("dyt", 8, alpha_init=0.3)
    assert m.alpha.item() == pytest.approx(0.3)


@pytest.mark.parametrize("value", ["maybe", 1, 0.0, "false"])
def test_a_bool_option_takes_true_or_false_only(value):
    with pytest.raises(NormlabError) as e:
        build_norm("layernorm", 8, affine=value)
    assert str(e.value) == f"norm 'layernorm' option affine must be true or false, got {value!r}"


def test_bool_options_still_reach_the_class():
    assert build_norm("layernorm", 8, affine=False).weight is None
    assert build_norm("layernorm", 8, affine=True, bias=False).bias is None
    m = build_norm("fixedscale", 8, bias=None)  # bool | None: None is the class's own default
    assert m.state_dict().keys() == build_norm("fixedscale", 8).state_dict().keys()
