"""normlab.decide.plan: the sequential plan and the declared question are resolved in the sweep spec before
anything runs; the plan's seeds are in the design (and its hash) from the start."""

from __future__ import annotations

import pytest
import yaml

from normlab.errors import NormlabError
from normlab.decide.plan import fractions
from normlab.decide.question import stored_question
from normlab.experiments.sweep import dump_spec, parse_sweep

FAST = {"train.steps": 6}
TWO = [{"name": "A", "set": {"model.placement": "pre"}}, {"name": "B", "set": {"model.placement": "post"}}]


def sweep(**kw):
    return parse_sweep({"name": "p", "base": "tiny", "set": FAST, "variants": TWO, **kw})


def test_max_seeds_resolves_to_looks_and_extends_the_seeds():
    s = sweep(seeds=[0, 1, 2], sequential={"max_seeds": 10})
    assert s.spec["sequential"] == {"looks": [3, 6, 9, 10]}
    assert s.spec["seeds"] == list(range(10))
    assert len(s.runs) == 2 * 10 and s.resolved.looks == [3, 6, 9, 10]
    assert fractions([3, 6, 9, 10]) == [0.3, 0.6, 0.9, 1.0]
    s2 = sweep(seeds=[5, 7], sequential={"max_seeds": 6, "round": 1})
    assert s2.spec["sequential"]["looks"] == [2, 3, 4, 5, 6] and s2.spec["seeds"] == [5, 7, 8, 9, 10, 11]


def test_the_plan_is_part_of_the_hash_and_survives_the_stored_spec():
    a = sweep(seeds=[0, 1, 2], sequential={"max_seeds": 9})
    b = sweep(seeds=[0, 1, 2], sequential={"looks": [3, 6, 9]})
    stored = parse_sweep(yaml.safe_load(dump_spec(a)))
    assert a.hash == b.hash == stored.hash and stored.spec["seeds"] == a.spec["seeds"]
    assert a.hash != sweep(seeds=[0, 1, 2], sequential={"max_seeds": 12}).hash  # another cap: another design
    assert a.hash != sweep(seeds=list(range(9))).hash  # a fixed design with the same seeds is another design
    # a replication source adds a second sweep dir and changes no run of this one
    assert sweep(seeds=[0, 1], replicate="english").hash == sweep(seeds=[0, 1]).hash


@pytest.mark.parametrize("plan,msg", [
    ({"max_seed": 4}, "did you mean 'max_seeds'"),
    ({"looks": [3, 6], "max_seeds": 6}, "not both"),
    ({"looks": [4, 4]}, "increase strictly"),
    ({"looks": [1, 4]}, "integer >= 2"),
    ({"max_seeds": 1}, "integer >= 2"),
    ({"round": 2}, "max_seeds is required"),
    ({"max_seeds": 200, "round": 1}, "at most 20"),
    ([], "must be a mapping"),
])
def test_bad_plans_are_one_line_errors(plan, msg):
    with pytest.raises(NormlabError, match=msg):
        sweep(seeds=[0, 1], sequential=plan)


def test_the_first_round_needs_two_seeds_and_question_keys_are_checked():
    with pytest.raises(NormlabError, match="at least 2 seeds"):
        sweep(seeds=[0], sequential={"max_seeds": 4})
    with pytest.raises(NormlabError, match="did you mean 'best_loss'"):
        sweep(primary="best_los")
    with pytest.raises(NormlabError, match="needs an lr_grid"):
        sweep(primary="lr_sensitivity")
    with pytest.raises(NormlabError, match=r"alpha must be a number in \(0, 0.5\]"):
        sweep(alpha=0.7)
    with pytest.raises(NormlabError, match="replicate must be a data source"):
        sweep(replicate=3)


def test_stored_question_defaults():
    q = stored_question(sweep(seeds=[0, 1]).resolved, ["A", "B"])
    assert (q.primary, q.baseline, q.family, q.alpha) == ("final_loss", "A", ("B",), 0.05)
    s = sweep(seeds=[0, 1], baseline="B", alpha=0.01, primary="best_loss")
    q = stored_question(s.resolved, ["A", "B"])
    assert (q.primary, q.baseline, q.family, q.alpha) == ("best_loss", "B", ("A",), 0.01)
    grid = parse_sweep({"name": "g", "base": "tiny", "set": FAST, "variants": TWO, "lr_grid": [1e-3, 1e-2]})
    assert stored_question(grid.resolved, ["A", "B"]).primary == "lr_sensitivity"


def test_planned_rounds_tell_seeds_added_by_the_plan_from_a_design_change():
    from normlab.decide.plan import planned_rounds

    s = sweep(seeds=[0, 1, 2], sequential={"max_seeds": 9})
    assert planned_rounds(s.resolved, {0, 1, 2}) and planned_rounds(s.resolved, set(range(6)))
    assert not planned_rounds(s.resolved, {0, 1, 2, 3})  # not a look of the plan
    assert not planned_rounds(sweep(seeds=[0, 1, 2]).resolved, {0, 1, 2})  # no plan
