"""normlab.report.rundirs.collect on loose run directories: a config.yaml that parses but lacks what the report reads
(the ``model`` / ``train`` mappings, a numeric ``train.lr``, an integer ``seed``: a truncated or edited file) is one
line naming the file and the missing piece, exit 2 from ``normlab report`` (it was a KeyError / TypeError
traceback); a complete config is read as before (variant labels from the keys that differ)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from normlab.config import load_config
from normlab.errors import NormlabError
from normlab.report.rundirs import collect
from tests.helpers import assert_bad_input, run_inproc


def loose_run(d: Path, cfg: dict) -> Path:
    """A run directory as the report reads it: config.yaml, summary.json, an empty metrics.jsonl (no training)."""
    d.mkdir()
    (d / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    (d / "summary.json").write_text(json.dumps({"status": "completed", "step": 2, "steps": 2, "val_bpb": 3.0}))
    (d / "metrics.jsonl").write_text("")
    return d


def full() -> dict:
    return load_config("tiny").to_dict()


def test_complete_configs_are_labelled_by_what_differs(tmp_path):
    a, b = full(), full()
    b["model"]["norm"] = "rmsnorm"
    got = collect([loose_run(tmp_path / "a", a), loose_run(tmp_path / "b", b)])
    assert [info.row["variant"] for info, _ in got] == ["norm=layernorm", "norm=rmsnorm"]


@pytest.mark.parametrize("edit, what", [
    (lambda c: c.pop("train"), "no 'train' mapping"),
    (lambda c: c.update(model=7), "no 'model' mapping"),
    (lambda c: c["train"].pop("lr"), "train.lr is None, not a number"),
    (lambda c: c["train"].update(lr="abc"), "train.lr is 'abc', not a number"),
    (lambda c: c.update(seed="x\x1b[31m"), "seed is 'x\\x1b[31m', not an integer"),
])
def test_an_incomplete_config_is_one_line_naming_the_file(tmp_path, edit, what):
    cfg = full()
    edit(cfg)
    run = loose_run(tmp_path / "r", cfg)
    with pytest.raises(NormlabError) as e:
        collect([run])
    assert str(e.value).startswith(f"{run / 'config.yaml'}: {what}; not a complete normlab run config")
    proc = run_inproc("report", str(run), "--out", str(tmp_path / "rep"), cache=tmp_path / "cache")
    assert_bad_input(proc, f"{run / 'config.yaml'}: {what}")
    assert not (tmp_path / "rep").exists()


def test_a_config_truncated_mid_file_is_one_line(tmp_path):
    text = yaml.safe_dump(full(), sort_keys=False)
    run = tmp_path / "r"
    loose_run(run, {})
    (run / "config.yaml").write_text(text[: text.index("\ntrain:")])  # ends inside the sections before train
    proc = run_inproc("report", str(run), "--out", str(tmp_path / "rep"), cache=tmp_path / "cache")
    assert_bad_input(proc, "config.yaml: no 'train' mapping")
