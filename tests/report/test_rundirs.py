"""normlab.report.rundirs.collect on loose run directories: a config.yaml that parses but is not a valid run config
(a missing section, a key out of its type: a truncated or edited file) is one line naming the file, exit 2 from
``normlab report`` (it was a KeyError / TypeError traceback), through the one validated reader
(``rundir.readers.open_config``); a complete config is read as before (variant labels from the keys that
differ), variants named by their run directories, runs on different corpora refused."""

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


def test_variants_are_named_by_their_run_directories(tmp_path):
    """A variant is named by its runs: one run's directory name, or what its seeds' names share; the config keys
    that differ between variants are kept as its overrides; equal names get their parent folder."""
    a, b = full(), full()
    b["model"]["norm"] = "rmsnorm"
    got = collect([loose_run(tmp_path / "ln", a), loose_run(tmp_path / "rms", b)])
    assert [info.row["variant"] for info, _ in got] == ["ln", "rms"]
    assert [info.row["overrides"] for info, _ in got] == [{"model.norm": "layernorm"}, {"model.norm": "rmsnorm"}]
    seeds = []
    for seed in (0, 1):
        s = full()
        s["seed"] = seed
        s["model"]["norm"] = "rmsnorm"
        seeds.append(loose_run(tmp_path / f"peri-s{seed}", s))
    got = collect([tmp_path / "ln", *seeds])
    assert [info.row["variant"] for info, _ in got] == ["ln", "peri", "peri"]
    (tmp_path / "x").mkdir(), (tmp_path / "y").mkdir()
    got = collect([loose_run(tmp_path / "x" / "tiny", a), loose_run(tmp_path / "y" / "tiny", b)])
    assert [info.row["variant"] for info, _ in got] == ["x/tiny", "y/tiny"]


def test_runs_on_different_corpora_are_not_paired(tmp_path):
    """Bits/byte of a synthetic Markov run and a pystdlib run measure different text: ``normlab report`` on both is
    one line naming the corpora, exit 2, and writes nothing."""
    a, b = full(), load_config("small").to_dict()
    assert a["data"]["source"] != b["data"]["source"]
    runs = [loose_run(tmp_path / "tiny", a), loose_run(tmp_path / "peri", b)]
    proc = run_inproc("report", *map(str, runs), "--out", str(tmp_path / "rep"), cache=tmp_path / "cache")
    assert_bad_input(proc, "2 corpora", a["data"]["source"], b["data"]["source"], "cannot be paired")
    assert not (tmp_path / "rep").exists()


@pytest.mark.parametrize("edit, what", [
    (lambda c: c.pop("train"), "has no 'train' mapping"),
    (lambda c: c.update(model=7), "has no 'model' mapping"),
    (lambda c: c["train"].update(lr="abc"), "train.lr must be float, got str 'abc'"),
    (lambda c: c.update(seed="x\x1b[31m"), "seed must be int, got str 'x\\x1b[31m'"),
])
def test_an_incomplete_config_is_one_line_naming_the_file(tmp_path, edit, what):
    """Read through rundir.readers.open_config, the one validated reader of a run's config (what eval, resume
    and a sweep's worker read): a missing section or a key out of its type is one line naming the file."""
    cfg = full()
    edit(cfg)
    run = loose_run(tmp_path / "r", cfg)
    with pytest.raises(NormlabError) as e:
        collect([run])
    assert str(e.value).startswith(f"config {run / 'config.yaml'}") and what in str(e.value), str(e.value)
    proc = run_inproc("report", str(run), "--out", str(tmp_path / "rep"), cache=tmp_path / "cache")
    assert_bad_input(proc, f"config {run / 'config.yaml'}", what)
    assert not (tmp_path / "rep").exists()


def test_a_missing_key_reads_as_its_default_as_everywhere_else(tmp_path):
    """A run's config.yaml without one key (written before the key existed) is read with the key's default, as
    eval and resume read it: the report labels the run from the resolved config, never a KeyError."""
    cfg = full()
    cfg["train"].pop("lr")
    (info, _), = collect([loose_run(tmp_path / "r", cfg)])
    assert info.row["variant"] == "r"


def test_a_config_truncated_mid_file_is_one_line(tmp_path):
    text = yaml.safe_dump(full(), sort_keys=False)
    run = tmp_path / "r"
    loose_run(run, {})
    (run / "config.yaml").write_text(text[: text.index("\ntrain:")])  # ends inside the sections before train
    proc = run_inproc("report", str(run), "--out", str(tmp_path / "rep"), cache=tmp_path / "cache")
    assert_bad_input(proc, "config.yaml has no 'train' mapping")
