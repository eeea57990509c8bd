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


class _Ctx:
    """Summaries by run directory name (a completed, a diverged and a grid of two runs)."""

    SUMMARIES = {"a": {"status": "completed", "val_bpb": 3.5}, "d": {"status": "diverged", "val_bpb": None},
                 "g1": {"status": "completed", "val_bpb": 3.2}, "g2": {"status": "completed", "val_bpb": 2.9}}

    def summary(self, run_dir):
        return self.SUMMARIES[run_dir]


def test_measure_calls_the_registered_function_and_records_every_models_final_loss(monkeypatch):
    """The guard is not opt-in: every claim's details get each model's final loss (a grid model's best)."""
    seen = []
    monkeypatch.setitem(MEASURES, "probe_measure",
                        lambda ctx, runs, *a: (seen.append((runs, a)) or 1.5, {"unigram_bpb": 4.7}))
    claim = type("C", (), {"measure": "probe_measure", "args": ("x", 3)})()
    runs = {"v": "a", "w": "d", "grid": {0.1: "g1", 0.3: "g2"}}
    value, details = measure(claim, _Ctx(), runs)
    assert value == 1.5 and seen == [(runs, ("x", 3))]
    assert details == {"unigram_bpb": 4.7, "learn_bpb": {"v": 3.5, "w": None, "grid": 2.9}}


def test_a_name_registered_twice_or_unknown_is_an_error(monkeypatch):
    monkeypatch.setattr("normlab.experiments.claims.measure_registry.MEASURES", dict(MEASURES))
    with pytest.raises(ValueError, match="registered twice"):
        register_measure("growth")(lambda ctx, runs: (None, {}))
    with pytest.raises(NormlabError, match="unknown measure 'growht'.*did you mean 'growth'"):
        get_measure("growht")
