"""normlab.norms.registry.build_norm: an option named like one of its own arguments (``self``, ``dim``, ``name``) is
the one-line "does not take option" error that any unknown option gets, never a TypeError from the call; a real
option still reaches the class (its value read back from the module)."""

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


def test_a_real_option_still_reaches_the_class():
    m = build_norm("dyt", 8, alpha_init=0.3)
    assert m.alpha.item() == pytest.approx(0.3)
