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


def test_a_replication_source_that_cannot_be_read_is_refused_before_the_main_sweep_trains(tmp_path, cache):
    """``--replicate-on /dev/zero`` (a device), a missing path and an empty file: one line naming the source, exit 2,
    and the sweep directory holds no trained run (the main sweep never started)."""
    import yaml

    from tests.helpers import assert_bad_input, run_inproc

    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump({"name": "s", "base": "tiny", "seeds": [0], "set": {"train.steps": 2}}))
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    for source, fragment in (("/dev/zero", "not a regular file or directory"),
                             (str(tmp_path / "missing.txt"), "does not exist"), (str(empty), "is empty")):
        out = tmp_path / f"out-{len(fragment)}"
        r = run_inproc("compare", str(spec), "--replicate-on", source, "--out", str(out), "--workers", "1",
                       cache=cache)
        assert_bad_input(r, source, fragment)
        assert not (out / "results.sqlite").exists() and not list(out.glob("runs/*/summary.json"))


def test_printed_decisions_escape_control_characters(capsys):
    """compare's result lines (a replication's source is the user's string) keep control characters visible."""
    from normlab.commands.compare import print_decisions

    cmp = {"variant": "a", "baseline": "b", "metric": "val_bpb", "verdict": "replicated",
           "original": {"decision": "better"}, "replication": {"decision": "better"}}
    print_decisions({"replication": [{"source": "data\x1b[2J\nrm", "comparisons": [cmp]}]})
    assert capsys.readouterr().out.splitlines() == [
        "replication on data\\x1b[2J\\nrm:", "  a vs b (val_bpb): replicated (better / better)"]


def test_print_lr_prints_names_literally_not_as_rich_markup(monkeypatch, capsys):
    """Variant names and the baseline come from the sweep file: ``[bold]x[/bold]`` is printed as written."""
    from types import SimpleNamespace

    from normlab.commands.compare import print_lr
    from normlab.report import lrsection

    monkeypatch.setattr(lrsection, "ranking_cells", lambda grid: (["variant", "sens"], [["[bold]x[/bold]", "0.1"]]))
    monkeypatch.setattr(lrsection, "paired_cells", lambda grid: (["variant", "d"], [["[red]y", "0.2"]]))
    print_lr(SimpleNamespace(grid=SimpleNamespace(is_grid=True, paired=True, baseline="[i]base[/i]")))
    out = capsys.readouterr().out
    assert "[bold]x[/bold]" in out and "[red]y" in out and "[i]base[/i]" in out
