"""normlab.experiments.design: the sweep's declared question (one-line errors), the design written to the store
before the first run, and a change after results recorded (and not a change of the sweep's identity)."""

from __future__ import annotations

import pytest
import yaml

from normlab.errors import NormlabError
from normlab.experiments import sweepdir
from normlab.experiments.design import changed_after_results, design_changes, stored_design
from normlab.experiments.store import Store
from normlab.experiments.sweep import parse_sweep
from tests.helpers import assert_bad_input
from tests.helpers import run_inproc as normlab

BASE = {"name": "q", "base": "tiny", "seeds": [0, 1], "lr_grid": [0.001, 0.01],
        "variants": [{"name": "Pre-LN", "set": {"model.placement": "pre"}},
                     {"name": "Peri-LN", "set": {"model.placement": "peri"}},
                     {"name": "Post-LN", "set": {"model.placement": "post"}}]}


def test_defaults_and_declared_question():
    q = parse_sweep(BASE).question.as_dict()
    assert q == {"declared": False, "primary": "lr_sensitivity", "baseline": "Pre-LN", "family": ["Peri-LN", "Post-LN"],
                 "alpha": 0.05, "correction": "holm", "paired": True}
    s = parse_sweep({**BASE, "primary": "best_loss", "baseline": "Post-LN", "family": ["Peri-LN"], "alpha": 0.01,
                     "correction": "bh"})
    assert s.question.as_dict() == {"declared": True, "primary": "best_loss", "baseline": "Post-LN",
                                    "family": ["Peri-LN"], "alpha": 0.01, "correction": "bh", "paired": True}
    d = s.design()
    assert d["groups"] == ["Pre-LN", "Peri-LN", "Post-LN"] and d["seeds"] == [0, 1]
    assert d["learning_rates"] == [0.001, 0.01] and d["primary"] == "best_loss"
    one = {k: v for k, v in BASE.items() if k != "lr_grid"}
    assert parse_sweep(one).question.primary == "final_loss"


def test_question_keys_do_not_change_the_sweep_hash():
    """Changing the question after results must not orphan the sweep dir: it is recorded and flagged instead."""
    h = parse_sweep(BASE).hash
    assert parse_sweep({**BASE, "primary": "best_loss", "alpha": 0.01, "correction": "bh"}).hash == h
    assert parse_sweep({**BASE, "seeds": [0, 1, 2]}).hash != h  # the design itself is part of the identity


@pytest.mark.parametrize("extra, fragment", [
    ({"primary": "lr_sensitivty"}, "primary 'lr_sensitivty' is not a metric (did you mean 'lr_sensitivity'?)"),
    ({"primary": "final_loss"}, "primary: final_loss is for a sweep at one learning rate"),
    ({"baseline": "PreLN"}, "baseline 'PreLN' is not a variant"),
    ({"family": ["Pre-LN"]}, "family names the baseline 'Pre-LN'"),
    ({"family": ["Mix-LN"]}, "family member 'Mix-LN' is not a variant"),
    ({"family": ["Peri-LN", "Peri-LN"]}, "family lists a variant twice"),
    ({"family": "Peri-LN"}, "family must be a non-empty list"),
    ({"alpha": 0.9}, "alpha must be a number in (0, 0.5]"),
    ({"alpha": True}, "alpha must be a number in (0, 0.5]"),
    ({"correction": "bonferroni"}, "correction 'bonferroni' is not one of holm, bh"),
    ({"paired": "yes"}, "paired must be true"),
])
def test_bad_question_keys_are_one_line_errors(tmp_path, extra, fragment):
    with pytest.raises(NormlabError, match=None) as e:
        parse_sweep({**BASE, **extra})
    assert fragment in str(e.value) and "\n" not in str(e.value)
    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump({**BASE, **extra}))
    assert_bad_input(normlab("compare", str(f), "--out", str(tmp_path / "out"), cache=tmp_path / "c"), fragment)
    assert not (tmp_path / "out").exists()  # nothing half-written


def test_lr_sensitivity_needs_a_grid():
    one = {k: v for k, v in BASE.items() if k != "lr_grid"}
    with pytest.raises(NormlabError, match="primary: lr_sensitivity needs an lr_grid"):
        parse_sweep({**one, "primary": "lr_sensitivity"})


def _no_training(monkeypatch, seen):
    monkeypatch.setattr(sweepdir, "_prepare_data", lambda configs, log: None)

    def fake(executor, store, jobs, log, trained):  # what the first run would see in the store
        seen.append((stored_design(store.meta()), sum(r["status"] != "pending" for r in store.runs())))
        for rid in (r for job in jobs for r in job):
            store.update(rid, status="completed", val_bpb=4.0, step=1)
        return "completed"

    monkeypatch.setattr(sweepdir, "drive", fake)


def _one_pass(out, monkeypatch):
    """The BASE sweep with primary lr_sensitivity, one pass without training into ``out``: (sweep, its store)."""
    _no_training(monkeypatch, [])
    sweep = parse_sweep({**BASE, "primary": "lr_sensitivity"})
    sweepdir.run_sweep(sweep, out, inline=True, workers=1, log=lambda s: None)
    return sweep, Store(out / "results.sqlite")


def test_the_design_is_in_the_store_before_the_first_run_and_a_later_change_is_flagged(tmp_path, monkeypatch):
    seen: list = []
    _no_training(monkeypatch, seen)
    sweep = parse_sweep({**BASE, "primary": "lr_sensitivity", "family": ["Peri-LN"]})
    out = tmp_path / "sw"
    sweepdir.run_sweep(sweep, out, inline=True, workers=1, log=lambda s: None)
    (design, started), = seen
    assert started == 0 and design == sweep.design() and design["declared"] and design["family"] == ["Peri-LN"]
    store = Store(out / "results.sqlite")
    assert changed_after_results(store.meta(), store.runs()) is None
    assert "primary: lr_sensitivity" in (out / "sweep.yaml").read_text()
    # the same sweep again: nothing changes
    sweepdir.run_sweep(sweep, out, inline=True, workers=1, log=lambda s: None)
    assert design_changes(store.meta()) == []
    # the question changed after all 12 runs finished: allowed (same hash), recorded, and flagged
    logs: list[str] = []
    again = parse_sweep({**BASE, "primary": "best_loss"})
    sweepdir.run_sweep(again, out, inline=True, workers=1, log=logs.append)
    ch, = design_changes(store.meta())
    assert ch["finished_runs"] == 12 and set(ch["changed"]) == {"family", "primary"} and not ch["sequential"]
    assert ch["before"] == design and stored_design(store.meta())["primary"] == "best_loss"
    why = changed_after_results(store.meta(), store.runs())
    assert why == "the design changed after 12 run(s) had finished (family, primary changed)"
    assert any("design changed (family, primary)" in line for line in logs)
    assert "primary: best_loss" in (out / "sweep.yaml").read_text()


def test_a_store_from_before_designs_with_results_counts_as_declared_late(tmp_path, monkeypatch):
    sweep, store = _one_pass(tmp_path / "old", monkeypatch)
    out = tmp_path / "old"
    with store._write() as con:  # as a store written before designs were recorded
        con.execute("DELETE FROM meta WHERE key IN ('design', 'design_changes')")
    sweepdir.run_sweep(sweep, out, inline=True, workers=1, log=lambda s: None)
    assert "changed after 12 run(s)" in changed_after_results(store.meta(), store.runs())


def test_results_outside_the_stored_design_are_flagged(tmp_path, monkeypatch):
    _, store = _one_pass(tmp_path / "x", monkeypatch)
    rows = store.runs()
    rows[0]["seed"] = 7
    assert changed_after_results(store.meta(), rows) == "the store holds results outside the declared design (seed 7)"


def test_a_damaged_design_in_the_store_reads_as_none_through_the_bounded_reader():
    """The store's design and its change history go through the bounded JSON reader: nesting past 64 levels (json's
    own parser would end in a RecursionError) or an integer past 100 digits is a damaged value, read as none."""
    deep, long_int = "[" * 100_000 + "]" * 100_000, '{"seeds": ' + "9" * 5001 + "}"
    for bad in (deep, long_int, "{not json"):
        assert stored_design({"design": bad}) is None
        assert design_changes({"design_changes": bad}) == []
    assert stored_design({"design": '{"baseline": "a"}'}) == {"baseline": "a"}
