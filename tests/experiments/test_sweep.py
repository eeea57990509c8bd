"""Sweep files (normlab.experiments.sweep, grid): the whole-sweep limits and what a user writes (issue 27).

The run count (variants x axes x sizes x seeds) is checked against ``MAX_RUNS`` before anything is expanded (a
1,000,000-run sweep used to expand for minutes); ``lr_grid`` accepts ``1e-3`` as YAML 1.1 reads it (a string),
so the sweep example in docs/compare.md parses as written.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from normlab.errors import NormlabError
from normlab.experiments.grid import MAX_POINTS, expand_grid
from normlab.experiments.sweep import MAX_NAME, MAX_RUNS, parse_sweep
from normlab.io import load_yaml

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _refused(raw: dict, *fragments: str) -> str:
    t = time.perf_counter()
    with pytest.raises(NormlabError) as e:
        parse_sweep(raw, source="s.yaml")
    assert time.perf_counter() - t < 5, "refused before expanding"
    msg = str(e.value)
    assert "\n" not in msg
    for f in fragments:
        assert f in msg, msg
    return msg


def test_a_million_runs_are_refused_before_expansion():
    axes = {f"model.{k}": list(range(1, 11)) for k in ("depth", "heads")}
    axes.update({"train.batch_size": list(range(1, 101)), "train.steps": list(range(1, 101))})
    msg = _refused({"base": "tiny", "axes": axes}, f"at most {MAX_RUNS:,} runs", "1,000,000 runs")
    assert "10 axis model.depth x 10 axis model.heads x 100 axis train.batch_size" in msg


def test_the_limit_multiplies_every_factor():
    # 2 variants x 50 lr points x 101 seeds = 10,100 > 10,000; one seed fewer is allowed (checked, not run)
    raw = {"base": "tiny", "variants": [{"name": "a", "set": {"model.depth": 1}},
                                        {"name": "b", "set": {"model.depth": 2}}],
           "lr_grid": {"min": 1e-4, "max": 1.0, "points": 50}, "seeds": list(range(101))}
    _refused(raw, "10,100 runs", "2 variants x 50 axis train.lr x 101 seeds")
    assert 2 * 50 * 100 <= MAX_RUNS


def test_200000_seeds_are_refused_at_once():
    _refused({"base": "tiny", "seeds": list(range(200_000))}, "200000 seeds", f"at most {MAX_RUNS} runs")


def test_grid_points_are_limited():
    with pytest.raises(NormlabError, match=rf"points must be an integer in \[1, {MAX_POINTS}\]"):
        expand_grid({"min": 1e-3, "max": 1e-1, "points": 10**9})
    with pytest.raises(NormlabError, match="at most 1000"):
        expand_grid([float(i + 1) for i in range(MAX_POINTS + 1)])


def test_a_huge_variant_name_is_refused():
    _refused({"base": "tiny", "variants": [{"name": "x" * 100_000, "set": {}}]}, "100000 characters",
             f"at most {MAX_NAME} printable characters")
    _refused({"base": "tiny", "variants": [{"name": "a\nb", "set": {}}]}, "printable")


@pytest.mark.parametrize("written", ["1e-3", "1E-3", " 1e-3", "+1e-3"])
def test_lr_grid_accepts_what_yaml_reads_as_text(written):
    raw = load_yaml(f"base: tiny\nlr_grid: {{min: {written}, max: 1e-1, points: 3}}\n")
    assert isinstance(raw["lr_grid"]["min"], str)  # YAML 1.1: no dot, so not a float
    assert parse_sweep(raw).lr_grid == [0.001, 0.01, 0.1]


@pytest.mark.parametrize("bad", ["abc", "1e", "nan", "-1e-3"])
def test_lr_grid_text_that_is_not_a_positive_number_is_still_refused(bad):
    with pytest.raises(NormlabError, match="lr_grid.min must be a number > 0"):
        expand_grid({"min": bad, "max": 1e-1, "points": 3})


def test_the_docs_sweep_example_parses_as_written():
    text = (DOCS / "compare.md").read_text()
    block = next(b for b in re.findall(r"```yaml\n(.*?)```", text, re.S) if "lr_grid:" in b)
    raw = load_yaml(block)
    assert raw["lr_grid"]["min"] == "1e-3"
    sweep = parse_sweep(raw)
    assert sweep.lr_grid == [0.001, 0.00316, 0.01, 0.0316, 0.1]
    # variants x lr x seeds (the sequential plan extends 2 to max_seeds 12)
    assert len(sweep.runs) == 3 * 5 * 12


@pytest.mark.parametrize("kind", ["dir", "fifo", "missing"])
def test_sweep_file_that_is_not_a_file_says_what_it_is(kind, tmp_path, cache):
    import os

    from tests.helpers import assert_bad_input, run_inproc

    p = tmp_path / "s.yaml"
    if kind == "dir":
        p.mkdir()
    elif kind == "fifo":
        os.mkfifo(p)
    expected = {"dir": "is a directory", "fifo": "is not a regular file", "missing": "not found"}[kind]
    proc = run_inproc("compare", str(p), "--out", str(tmp_path / "out"), cache=cache)
    assert_bad_input(proc, f"sweep file {p}", expected)
    assert not (tmp_path / "out").exists()


def test_declared_presets_and_the_claims_suite_use_disjoint_seed_blocks():
    """Confirmatory means fresh seeds: every shipped preset that declares a question names what informed its
    design (``designed_from``) and runs on a seed block that no other declared preset, no replication and no
    claims budget uses (the claims suite runs seeds 0..n-1, ``scale`` its own block 5000-5007, ``confirm`` its own
    block 6000-6004, ``followup`` 7000-7011, with a claim's own larger seed count where it has one); a replication
    gets its own block too, and so does the question ``normlab advise`` writes a sweep for."""
    from normlab.experiments.claims.budgets import BUDGETS
    from normlab.experiments.claims.specs import CLAIMS
    from normlab.experiments.sweep import SWEEP_DIR, SweepSpec, load_sweep, replication_seeds

    most = max(c.seeds or 0 for c in CLAIMS)
    blocks = {f"claims --budget {b.name}": set(b.seed_list(max(b.seeds, most))) for b in BUDGETS.values()}
    assert blocks["claims --budget scale"] >= set(range(5000, 5008))
    assert blocks["claims --budget confirm"] >= set(range(6000, 6005))
    declared = []
    for f in sorted(SWEEP_DIR.glob("*.yaml")):
        sweep = load_sweep(preset=f.stem)
        if not sweep.spec.get("primary"):
            continue  # exploratory presets decide nothing
        declared.append(f.stem)
        assert sweep.spec.get("designed_from"), f"{f.stem} declares a question but not what informed its design"
        blocks[f"preset {f.stem}"] = {r.seed for r in sweep.runs}
        blocks[f"preset {f.stem}, replication"] = set(replication_seeds(sweep.resolved))
    assert "quick" in declared
    from normlab.report.advise import SEED_RANGE  # the sweeps advise writes for its next question, and replications
    blocks["advise's next question"] = set(SEED_RANGE)
    blocks["advise's next question, replication"] = set(replication_seeds(SweepSpec(seeds=list(SEED_RANGE))))
    names = sorted(blocks)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            shared = blocks[a] & blocks[b]
            if a.startswith("claims") and b.startswith("claims") and "scale" not in a + b:
                continue  # the CPU budgets are one suite at different sizes; scale confirms on fresh seeds
            assert not shared, f"{a} and {b} share seeds {sorted(shared)}"


def test_replicate_seeds_must_be_a_fresh_block():
    spec = {"name": "r", "base": "tiny", "seeds": [0, 1], "replicate_seeds": [1, 2]}
    with pytest.raises(NormlabError, match="replicate_seeds .* share seeds"):
        parse_sweep(spec, source="s")
    with pytest.raises(NormlabError, match="designed_from must be"):
        parse_sweep({"name": "r", "base": "tiny", "designed_from": 3}, source="s")
    ok = parse_sweep({"name": "r", "base": "tiny", "seeds": [0, 1], "replicate_seeds": [5, 6]}, source="s")
    plain = parse_sweep({"name": "r", "base": "tiny", "seeds": [0, 1]}, source="s")
    assert ok.hash == plain.hash  # the replication's block is not part of the design's identity
    from normlab.experiments.sweep import REPLICATION_SEED_OFFSET, replication_seeds

    assert replication_seeds(ok.resolved) == [5, 6]
    assert replication_seeds(plain.resolved) == [REPLICATION_SEED_OFFSET, REPLICATION_SEED_OFFSET + 1]
