"""normlab.experiments.claims.measure_registry: measures by name, as a claim definition names them."""

from __future__ import annotations

import inspect

import pytest

from normlab.errors import NormlabError
from normlab.experiments.claims.measure_registry import MEASURES, get_measure, register_measure
from normlab.experiments.claims.measures import measure
from normlab.experiments.claims.specs import CLAIMS


def test_every_claims_measure_is_registered_and_takes_its_args():
    assert set(MEASURES) == {c.measure for c in CLAIMS}  # no measure without a claim, none missing
    for c in CLAIMS:
        inspect.signature(get_measure(c.measure)).bind(None, {}, *c.args)  # TypeError on a wrong arity


def test_measure_calls_the_registered_function_with_the_claims_args(monkeypatch):
    seen = []
    monkeypatch.setitem(MEASURES, "probe_measure", lambda ctx, runs, *a: (seen.append((ctx, runs, a)) or 1.5, {}))
    claim = type("C", (), {"measure": "probe_measure", "args": ("x", 3)})()
    assert measure(claim, "ctx", {"v": "dir"}) == (1.5, {}) and seen == [("ctx", {"v": "dir"}, ("x", 3))]


def test_a_name_registered_twice_or_unknown_is_an_error(monkeypatch):
    monkeypatch.setattr("normlab.experiments.claims.measure_registry.MEASURES", dict(MEASURES))
    with pytest.raises(ValueError, match="registered twice"):
        register_measure("growth")(lambda ctx, runs: (None, {}))
    with pytest.raises(NormlabError, match="unknown measure 'growht'.*did you mean 'growth'"):
        get_measure("growht")
