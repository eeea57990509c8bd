"""The export record stores absolute paths (issue 29 item 8): an export made with relative paths from one directory
loads, through the ``pretrained=`` path it records, in transformers from another directory."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers import cli_env, run_inproc


def test_export_record_paths_work_from_another_directory(tmp_path, cache, monkeypatch):
    transformers = pytest.importorskip("transformers")
    env = cli_env(cache)
    work = tmp_path / "work"
    work.mkdir()
    subprocess.run([sys.executable, "-m", "normlab", "train", "tiny", "--set", "train.steps=2", "--set",
                    "train.eval_every=2", "--set", "model.context=16", "--out", "run"], cwd=work, env=env,
                   check=True, capture_output=True)
    p = subprocess.run([sys.executable, "-m", "normlab", "export", "run", "--to", "hf", "--out", "hf"], cwd=work,
                       env=env, check=True, capture_output=True, text=True)
    from normlab.interop.export import EXPORT_STAGES

    assert not [ln for ln in p.stderr.splitlines() if ln.startswith("export [")]  # piped: no stage lines
    # on a terminal, progress as it goes: each stage on stderr, in order
    monkeypatch.setattr("normlab.commands.stages.stages_visible", lambda: True)
    q = run_inproc("export", str(work / "run"), "--to", "hf", "--out", str(tmp_path / "hf2"), cache=cache,
                   check=True)
    stages = [ln for ln in q.stderr.splitlines() if ln.startswith("export [")]
    assert [ln.split("] ", 1)[1].rsplit(" (", 1)[0] for ln in stages] == list(EXPORT_STAGES), q.stderr
    assert all(ln.startswith(f"export [{i}/{len(EXPORT_STAGES)}]") for i, ln in enumerate(stages, 1))
    rec = json.loads((work / "hf" / "normlab_export.json").read_text())
    assert rec["source"] == str((work / "run").resolve())
    args = dict(kv.split("=", 1) for kv in rec["lm_eval_model_args"].split(","))
    assert args["pretrained"] == str((work / "hf").resolve())
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    code = ("import sys, transformers; m = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1]); "
            "print(type(m).__name__)")
    out = subprocess.run([sys.executable, "-c", code, args["pretrained"]], cwd=elsewhere, env=env, check=True,
                         capture_output=True, text=True).stdout.strip()
    assert out == rec["hf_class"] and transformers.__version__

