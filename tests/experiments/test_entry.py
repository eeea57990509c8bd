"""normlab.experiments.run (entry.py): once without a sequential plan, in rounds with one, for every caller."""

from __future__ import annotations


import pytest

import normlab.experiments as experiments
import normlab.experiments.entry as entry
from normlab.errors import NormlabError
from normlab.experiments.sweepdir import SweepOutcome
from normlab.experiments.sequential import SequentialOutcome
from normlab.experiments.sweep import parse_sweep

BASE = {"name": "e", "base": "tiny", "seeds": [0, 1],
        "variants": [{"name": "Pre-LN"}, {"name": "Peri-LN", "set": {"model.placement": "peri"}}]}


def test_the_package_exposes_the_entry():
    assert experiments.run is entry.run


@pytest.mark.parametrize("executor, runner_executor, inline", [("local", "local", False), ("inline", "local", True),
                                                               ("ray", "ray", False)])
def test_without_a_plan_the_sweep_runs_once(tmp_path, monkeypatch, executor, runner_executor, inline):
    calls = []

    def once(sweep, out, **kw):
        calls.append((out, kw))
        return SweepOutcome(out, "completed")

    monkeypatch.setattr(entry, "run_sweep", once)
    monkeypatch.setattr(entry, "run_until_decided", lambda *a, **kw: pytest.fail("no plan: no rounds"))
    out = entry.run(parse_sweep(BASE), tmp_path, executor=executor, workers=1, threads=1)
    (where, kw), = calls
    assert where == tmp_path and out.until_decided is None
    assert kw == {"workers": 1, "threads": 1, "address": None, "stack": None, "log": None,
                  "executor": runner_executor, "inline": inline}


def test_with_a_plan_it_runs_in_rounds_and_says_why_it_stopped(tmp_path, monkeypatch):
    sweep = parse_sweep({**BASE, "sequential": {"max_seeds": 6}})
    seen = {}

    def rounds(s, out, *, budget_s, **kw):
        seen.update(budget_s=budget_s, kw=kw)
        last = SweepOutcome(out, "interrupted", trained=["x"])
        return SequentialOutcome(last, looks=[{"decided": False}], stopped="interrupted", seeds_spent=4,
                                 trained=["w", "x"])

    monkeypatch.setattr(entry, "run_until_decided", rounds)
    out = entry.run(sweep, tmp_path, budget_s=60.0)
    assert seen["budget_s"] == 60.0 and seen["kw"]["executor"] == "local"
    assert out.status == "interrupted" and out.trained == ["w", "x"]
    assert out.until_decided == {"stopped": "interrupted", "seeds_spent": 4, "looks": 1}


def test_an_unknown_executor_is_one_line_naming_the_allowed_ones(tmp_path):
    with pytest.raises(NormlabError) as e:
        entry.run(parse_sweep(BASE), tmp_path, executor="slurm")
    assert str(e.value) == "executor must be one of inline, local, ray, got 'slurm'"
