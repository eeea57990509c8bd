"""normlab.commands.compare: the replication of a declared design runs on its own seed block."""

from __future__ import annotations

from normlab.commands.compare import replication_sweep
from normlab.experiments.sweep import REPLICATION_SEED_OFFSET, load_sweep, parse_sweep


def test_replication_runs_the_design_on_fresh_seeds():
    quick = load_sweep(preset="quick")
    rep = replication_sweep(quick, "english")
    assert {r.seed for r in rep.runs} == set(quick.spec["replicate_seeds"])
    assert not {r.seed for r in rep.runs} & {r.seed for r in quick.runs}
    assert {r.config["data"]["source"] for r in rep.runs} == {"english"} and rep.name == "quick-on-english"
    # the same design otherwise: variants, grid and question
    assert rep.spec["variants"] == quick.spec["variants"] and rep.lr_grid == quick.lr_grid
    assert rep.spec["primary"] == quick.spec["primary"] and rep.spec["family"] == quick.spec["family"]
    plain = parse_sweep({"name": "p", "base": "tiny", "seeds": [0, 1]}, source="s")
    assert sorted(r.seed for r in replication_sweep(plain, "english").runs) == [REPLICATION_SEED_OFFSET,
                                                                               REPLICATION_SEED_OFFSET + 1]
