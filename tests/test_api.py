"""The Python API (normlab.api, docs/api.md): the documented example runs, and its numbers equal the CLI's."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import normlab
from tests.helpers import cli_env, run_inproc

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "normlab" / "examples" / "api.py"


def test_docs_api_shows_the_example_that_runs():
    doc = (ROOT / "docs" / "api.md").read_text()
    block = re.search(r"```python\n(.*?)```", doc, re.S).group(1)
    assert block == EXAMPLE.read_text()
    for name in normlab.__all__:  # every exported name is documented
        assert f"normlab.{name}" in doc or name.startswith("__") or name == "Run", name


@pytest.mark.slow
def test_example_script_matches_the_cli(tmp_path, cache):
    proc = subprocess.run([sys.executable, "-m", "normlab.examples.api", str(tmp_path / "ex"), "--steps", "8"],
                          cwd=tmp_path, env=cli_env(cache), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout)
    run = tmp_path / "ex" / "rms"
    s = json.loads((run / "summary.json").read_text())
    assert r["status"] == s["status"] == "completed" and r["val_bpb"] == s["val_bpb"] and r["params"] == s["params"]
    cli_eval = json.loads(
        run_inproc("eval", str(run), "--max-tokens", "2048", "--json", cache=cache, check=True).stdout
    )
    assert r["eval_bpb"] == cli_eval["bpb"] and r["eval_tokens"] == cli_eval["tokens"]
    cli_gen = json.loads(run_inproc("generate", str(run), "--prompt", "abc", "--max-new-tokens", "16",
                                    "--temperature", "0", "--json", cache=cache, check=True).stdout)
    assert r["generated"] == cli_gen["text"]
    assert r["sweep_counts"] == {"completed": 2}
    # 8 steps learn nothing: both runs end above the unigram level minus 0.1 (normlab.stats.learning), so the eval
    # flags it beside the unigram level and the sweep ranks neither
    assert r["unigram_bpb"] == cli_eval["unigram_bpb"] and r["did_not_learn"] is True
    assert r["eval_bpb"] >= r["unigram_bpb"] - 0.1
    assert r["ranking"] == [] and r["not_ranked"] == {"Pre-LN": "did not learn", "Pre-RMSNorm": "did not learn"}
    assert Path(r["report"]).is_file()


def test_make_config_and_build_model():
    import normlab.train.loop  # noqa: F401  (the submodule import must not shadow the API names)

    nested = normlab.make_config({"model": {"norm": "rmsnorm", "depth": 3}})
    dotted = normlab.make_config(None, {"model.norm": "rmsnorm", "model.depth": 3})
    assert nested.to_dict() == dotted.to_dict() and nested.model.depth == 3
    assert callable(normlab.train_run) and callable(normlab.make_config)
    a, b = normlab.build_model(nested), normlab.build_model(nested)
    sa, sb = a.state_dict(), b.state_dict()
    assert all((sa[k] == sb[k]).all() for k in sa)  # seeded like training
    with pytest.raises(normlab.NormlabError, match="did you mean"):
        normlab.make_config("tiny", {"model.widht": 64})


def test_evaluate_refuses_a_context_past_the_learned_positions_as_the_cli_does():
    """``normlab.evaluate`` checks the context with the commands' own check (``rundir.check_context``): the same
    one-line message, before any data is read."""
    from normlab.api import Run
    from normlab.run.rundir import check_context

    cfg = normlab.make_config("tiny", {"model.positions": "learned"})
    run = Run(Path("unused"), cfg, None, Path("unused"))
    with pytest.raises(normlab.NormlabError) as cli:
        check_context(cfg.model, 2 * cfg.model.context)
    with pytest.raises(normlab.NormlabError, match="learned position table") as api:
        normlab.evaluate(run, context=2 * cfg.model.context)
    assert str(api.value) == str(cli.value)
