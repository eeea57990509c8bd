"""normlab.commands.compare: the replication of a declared design runs on its own seed block."""

from __future__ import annotations

import json

from normlab.experiments.replication import replication_sweep
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


def test_set_applies_to_every_run_and_enters_the_hash():
    """``compare --set`` is the same sweep as its file with the keys added to ``set:`` (same runs, same hash), every
    run's config carries the values, and nothing else of a run changes."""
    import yaml

    from normlab.commands.compare import with_overrides
    from normlab.experiments.sweep import preset_path

    quick = load_sweep(preset="quick")
    small = with_overrides(quick, ["train.steps=7", "model.width=32", "train.steps=9"])  # the last one wins
    raw = yaml.safe_load(preset_path("quick").read_text())
    raw["set"] = {**(raw.get("set") or {}), "train.steps": 9, "model.width": 32}
    written = parse_sweep(raw, here=preset_path("quick").parent, source="s")
    assert small.hash == written.hash != quick.hash
    assert [r.run_id for r in small.runs] == [r.run_id for r in quick.runs]
    for a, b in zip(quick.runs, small.runs):
        assert b.config["train"]["steps"] == 9 and b.config["model"]["width"] == 32
        a_cfg = {**a.config, "train": {**a.config["train"], "steps": 9}, "model": {**a.config["model"], "width": 32}}
        assert b.config == a_cfg and b.axes == a.axes and b.seed == a.seed


def test_set_refuses_keys_the_sweep_varies_and_unknown_keys():
    import pytest

    from normlab.commands.compare import with_overrides
    from normlab.errors import NormlabError

    quick = load_sweep(preset="quick")
    for item, fragment in (("train.lr=0.01", "lr_grid"), ("model.placement=pre", "varies it (variant"),
                           ("model.widht=32", "did you mean 'model.width'"), ("train.steps", "KEY=VALUE"),
                           ("seed=3", "seed")):
        with pytest.raises(NormlabError, match=fragment.replace("(", r"\(")):
            with_overrides(quick, [item])
    axis = parse_sweep({"name": "a", "base": "tiny", "seeds": [0], "axes": {"model.depth": [1, 2]}}, source="s")
    with pytest.raises(NormlabError, match="an axis"):
        with_overrides(axis, ["model.depth=3"])


def test_compare_set_trains_with_the_values_and_stores_them(tmp_path, cache):
    """End to end: the stored sweep.yaml holds the --set keys (re-running it is the same sweep), each run's
    config.yaml the values; a bad --set is one line and exit 2 before anything is written."""
    import yaml

    from normlab.experiments.sweep import load_sweep as load
    from tests.helpers import assert_bad_input, run_inproc

    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump({"name": "s", "base": "tiny", "seeds": [0], "set": {"train.steps": 50},
                                    "variants": [{"name": "a", "set": {"model.norm": "layernorm"}},
                                                 {"name": "b", "set": {"model.norm": "rmsnorm"}}]}))
    out = tmp_path / "out"
    r = run_inproc("compare", str(spec), "--set", "train.steps=2", "--set", "train.eval_every=2", "--out", str(out),
                   "--workers", "1", "--json", cache=cache)
    assert r.returncode == 0, r.stderr
    stored = load(out / "sweep.yaml")
    assert stored.spec["set"]["train.steps"] == 2 and stored.hash == json.loads(r.stdout)["sweep_hash"]
    for run in ("a-s0", "b-s0"):
        cfg = yaml.safe_load((out / "runs" / run / "config.yaml").read_text())
        assert cfg["train"]["steps"] == 2 and cfg["train"]["eval_every"] == 2
    bad = tmp_path / "bad"
    assert_bad_input(run_inproc("compare", str(spec), "--set", "model.norm=rmsnorm", "--out", str(bad), cache=cache),
                     "--set model.norm", "variant 'a'")
    assert not bad.exists()


# Installed as ``sitecustomize`` in the compare process and its workers: every safetensors write of
# normlab.rundir.tensors (checkpoints, the final weights) fails as a full disk makes safetensors fail.
_FULL_DISK_HOOK = """
import importlib.abc, importlib.util, sys


class _FullDisk(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "normlab.rundir.tensors":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            from safetensors import SafetensorError

            def save_file(tensors, path, metadata=None):
                raise SafetensorError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, '
                                      'message: "No space left on device" })')

            module.save_file = save_file

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _FullDisk())
"""


def test_a_full_disk_during_compare_is_the_documented_line_and_a_rerun_finishes(tmp_path, cache):
    """A run's checkpoint write fails with ENOSPC inside a sweep worker: compare ends with the one documented line
    (naming the directory being written, and compare's way out: free space, re-run), exit 2, no traceback and no
    report; with space again the same command trains the runs to the end."""
    import os
    import subprocess
    import sys

    import yaml

    from tests.helpers import cli_env

    spec = tmp_path / "s.yaml"
    spec.write_text(yaml.safe_dump({"name": "s", "base": "tiny", "seeds": [0, 1], "set": {"train.steps": 2}}))
    out = tmp_path / "out"
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(_FULL_DISK_HOOK)
    env = cli_env(cache)
    env["PYTHONPATH"] = os.pathsep.join(x for x in (str(hook), env.get("PYTHONPATH", "")) if x)
    cmd = [sys.executable, "-m", "normlab.cli", "compare", str(spec), "--out", str(out), "--workers", "1"]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    last = r.stderr.strip().splitlines()[-1]  # compare's progress lines come first; the error is the last line
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert last.startswith(f"error: {out / 'runs'}") and "No space left on device" in last, last
    assert "free some space on that file system, then re-run the same command" in last, last
    assert "failed: OSError" not in r.stderr and not (out / "report.html").exists()
    env["PYTHONPATH"] = os.environ.get("PYTHONPATH", "")
    r = subprocess.run([*cmd, "--json"], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout)["counts"] == {"completed": 2}
