"""``normlab runs DIR`` on a folder of single runs (issue 29 item 4): each row checked against the run's own
``summary.json`` / ``metrics.jsonl`` and the config hash recomputed from ``config.yaml``."""

from __future__ import annotations

import json
import shutil

import yaml

from normlab.config import config_from_dict
from tests.helpers import run_inproc


def test_runs_lists_single_runs_under_a_folder(tmp_path, cache):
    root = tmp_path / "runs"
    fast = ["--set", "train.steps=2", "--set", "train.eval_every=2", "--set", "train.checkpoint_every=2",
            "--set", "model.context=16", "--set", "train.log_every=1"]
    run_inproc("train", "tiny", *fast, "--out", str(root / "a"), cache=cache, check=True)
    run_inproc("train", "tiny", *fast, "--set", "model.norm=rmsnorm", "--out", str(root / "group" / "b"),
               cache=cache, check=True)
    shutil.copytree(root / "a", root / "c")
    expected_c = json.loads((root / "c" / "summary.json").read_text())
    (root / "c" / "summary.json").unlink()  # as a run still training (or killed) looks
    (root / "sweep").mkdir()
    (root / "sweep" / "results.sqlite").write_bytes(b"")

    r = run_inproc("runs", str(root), "--format", "json", cache=cache, check=True)
    out = json.loads(r.stdout)
    assert out == json.loads(run_inproc("runs", str(root), "--json", cache=cache, check=True).stdout)
    rows = {row["path"]: row for row in out["runs"]}
    assert sorted(rows) == [str(root / "a"), str(root / "c"), str(root / "group" / "b")]
    assert out["sweeps"] == [str(root / "sweep")]
    for name in ("a", "group/b"):
        s = json.loads((root / name / "summary.json").read_text())
        row = rows[str(root / name)]
        assert (row["status"], row["step"], row["steps"], row["val_bpb"], row["config_hash"]) == (
            "completed", s["step"], s["steps"], s["val_bpb"], s["config_hash"])
    assert rows[str(root / "group" / "b")]["norm"] == "rmsnorm"
    c = rows[str(root / "c")]
    last = json.loads((root / "c" / "metrics.jsonl").read_text().splitlines()[-1])["step"]
    assert c["status"] == "unfinished" and c["step"] == last == 2 and c["val_bpb"] is None
    # one config hash everywhere: `normlab config` with the same arguments, the summary, and (without a summary)
    # the newest checkpoint agree; config.yaml holds the machine's resolved device / precision / compile instead of
    # `auto`, so its own hash is another one
    declared = json.loads(run_inproc("config", "tiny", *fast, "--json", cache=cache, check=True).stdout)["config_hash"]
    assert c["config_hash"] == expected_c["config_hash"] == rows[str(root / "a")]["config_hash"] == declared
    resolved = config_from_dict(yaml.safe_load((root / "c" / "config.yaml").read_text()))
    assert resolved.device != "auto" and resolved.hash() != declared

    table = run_inproc("runs", str(root), cache=cache, check=True).stdout
    assert "unfinished" in table and "completed" in table and f"normlab runs {root / 'sweep'}" in table


def test_run_folder_summary_runs_and_config_show_one_hash(tmp_path, cache, monkeypatch):
    """The default run folder ``runs/<config>-<hash8>`` and ``normlab runs`` show the hash ``normlab config`` prints."""
    monkeypatch.chdir(tmp_path)
    fast = ["--set", "train.steps=2", "--set", "train.eval_every=2", "--set", "model.context=16"]
    run_inproc("train", "tiny", *fast, cache=cache, check=True)
    (folder,) = (tmp_path / "runs").iterdir()
    declared = json.loads(run_inproc("config", "tiny", *fast, "--json", cache=cache, check=True).stdout)["config_hash"]
    assert folder.name == f"tiny-{declared[:8]}"
    assert json.loads((folder / "summary.json").read_text())["config_hash"] == declared
    (row,) = json.loads(run_inproc("runs", "runs", "--json", cache=cache, check=True).stdout)["runs"]
    assert row["config_hash"] == declared


def test_runs_on_a_folder_without_runs_is_one_line(tmp_path, cache):
    r = run_inproc("runs", str(tmp_path), cache=cache)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "holds no normlab runs" in r.stderr
