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
def test_example_script_matches_the_cli_learns_and_ranks(tmp_path, cache):
    """The example as a newcomer runs it (default steps): its numbers are the CLI's; every model it trains ends more
    than the margin below the unigram entropy of its training split (computed here from the bytes); the sweep ranks
    both variants by their mean final loss over seeds, with the Student-t interval and the Welch p against the best
    recomputed from the runs' own summary.json files."""
    import numpy as np
    from scipy import stats

    from normlab.rundir.readers import open_config, run_data

    proc = subprocess.run([sys.executable, "-m", "normlab.examples.api", str(tmp_path / "ex")],
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
    assert r["sweep_counts"] == {"completed": 4}
    # the unigram level by hand: the entropy of the training split's byte frequencies (a byte-level corpus)
    train = np.asarray(run_data(run, open_config(run)).train)
    unigram = float(stats.entropy(np.bincount(train, minlength=256), base=2))
    assert r["unigram_bpb"] == cli_eval["unigram_bpb"] == pytest.approx(unigram, rel=1e-9)
    # the model learned: its training-time and its evaluated loss are both below the unigram level minus 0.1
    assert s["val_bpb"] < unigram - 0.1 and r["eval_bpb"] < unigram - 0.1 and r["did_not_learn"] is False
    finals: dict[str, list[float]] = {}
    for f in sorted((tmp_path / "ex" / "sweep" / "runs").glob("*/summary.json")):
        sm = json.loads(f.read_text())
        assert sm["status"] == "completed" and sm["val_bpb"] < unigram - 0.1, (f, sm["val_bpb"])
        name = "Pre-RMSNorm" if f.parent.name.startswith("pre-rmsnorm") else "Pre-LN"
        finals.setdefault(name, []).append(sm["val_bpb"])
    assert sorted(len(v) for v in finals.values()) == [2, 2]
    # both variants ranked, in the order of their mean over the two seeds; interval and p recomputed with scipy
    order = sorted(finals, key=lambda k: np.mean(finals[k]))
    assert [x["variant"] for x in r["ranking"]] == order and [x["rank"] for x in r["ranking"]] == [1, 2]
    assert r["not_ranked"] == {}
    for x in r["ranking"]:
        v = np.asarray(finals[x["variant"]])
        assert x["val_bpb"] == pytest.approx(v.mean(), rel=1e-9)
        assert x["ci95"] == pytest.approx(stats.t.ppf(0.975, 1) * v.std(ddof=1) / np.sqrt(2), rel=1e-6)
    best, other = (np.asarray(finals[k]) for k in order)
    assert r["ranking"][0]["welch_p_vs_best"] is None
    assert r["ranking"][1]["welch_p_vs_best"] == pytest.approx(
        stats.ttest_ind(other, best, equal_var=False).pvalue, rel=1e-6)
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
    """``normlab.evaluate`` checks the context with the commands' own check (``readers.check_context``): the same
    one-line message, before any data is read."""
    from normlab.api import Run
    from normlab.rundir.readers import check_context

    cfg = normlab.make_config("tiny", {"model.positions": "learned"})
    run = Run(Path("unused"), cfg, None, Path("unused"))
    with pytest.raises(normlab.NormlabError) as cli:
        check_context(cfg.model, 2 * cfg.model.context)
    with pytest.raises(normlab.NormlabError, match="learned position table") as api:
        normlab.evaluate(run, context=2 * cfg.model.context)
    assert str(api.value) == str(cli.value)


API_REFUSALS = [  # (call, fragment of the one-line NormlabError): each was a TypeError/ValueError, or accepted
    (lambda run: normlab.make_config("tiny", {"model.norm": object()}), "model.norm: a value of type object"),
    (lambda run: normlab.make_config("tiny", {"seed": 10**5000}), "seed: an integer of about 5001 digits"),
    (lambda run: normlab.make_config({"train": {"lr": [object()]}}), "train.lr[0]: a value of type object"),
    (lambda run: normlab.build_model("tiny", seed=2**70), "seed must be <= 9223372036854775807"),
    (lambda run: normlab.build_model("tiny", seed=-1), "seed must be >= 0"),
    (lambda run: normlab.build_model("tiny", seed=1.5), "seed must be in [0, 9223372036854775807] (an integer)"),
    (lambda run: normlab.evaluate(run, batch_size=0), "batch_size must be >= 1"),
    (lambda run: normlab.evaluate(run, max_tokens=-1), "max_tokens must be >= 0"),
    (lambda run: normlab.evaluate(run, stride=1.5), "stride must be in [1, 1048576] (an integer), got 1.5"),
    (lambda run: normlab.evaluate(run, stride=0), "stride must be >= 1"),
    (lambda run: normlab.evaluate(run, split="train"), "split must be one of val, test, all, got 'train'"),
    (lambda run: normlab.generate(run, "x", temperature="1"), "--temperature must be a number, got str '1'"),
    (lambda run: normlab.generate(run, "x", max_new_tokens=10**9), "max_new_tokens must be <= 100000"),
    (lambda run: normlab.generate(run, "x", max_new_tokens=-1), "max_new_tokens must be >= 0"),
]


@pytest.mark.parametrize("call, fragment", API_REFUSALS, ids=[f for _, f in API_REFUSALS])
def test_the_api_refuses_what_the_cli_refuses_in_one_line(call, fragment):
    """Every argument is checked before a run is opened (the dummy run below is never read): one NormlabError."""
    from normlab.api import Run

    run = Run(Path("unused"), normlab.make_config("tiny"), None, Path("unused"))
    with pytest.raises(normlab.NormlabError) as e:
        call(run)
    assert fragment in str(e.value) and "\n" not in str(e.value), str(e.value)


@pytest.mark.parametrize("name, bad, good", [("batch_size", 0, 2**16), ("max_tokens", -1, 2**40),
                                             ("stride", 0, 2**20), ("max_new_tokens", 100_001, 100_000),
                                             ("seed", 2**63, 2**63 - 1), ("context", 2**20 + 1, 1)])
def test_the_cli_flags_and_the_api_share_one_table_of_bounds(name, bad, good):
    """The CLI's flag type (argparse) and the API's ``check_arg`` read the same ``ARG_BOUNDS`` entry: both refuse
    ``bad`` and accept ``good``."""
    import argparse

    from normlab.validate import ARG_BOUNDS, check_arg, flag_in

    parse = flag_in(ARG_BOUNDS[name])
    with pytest.raises(argparse.ArgumentTypeError):
        parse(str(bad))
    with pytest.raises(normlab.NormlabError, match=f"^{name} must be"):
        check_arg(name, bad)
    assert parse(str(good)) == good == check_arg(name, good)


def test_compare_runs_the_replication_a_sweep_declares_as_the_cli_does(tmp_path, cache, monkeypatch):
    """``normlab.compare`` of a sweep with ``replicate:``: the replication trains on its own seed block in
    ``replication/<source>``, is recorded in the original's store, and its verdicts come back beside the original's
    (the API skipped ``replicate:`` before); the same verdicts the report's replication block renders."""
    from normlab.decide.vocab import NO_CONCLUSION, REPLICATION_VERDICTS
    from normlab.experiments.sweep import REPLICATION_SEED_OFFSET

    monkeypatch.setenv("NORMLAB_CACHE_DIR", str(cache))
    sweep = {"name": "api-rep", "base": "tiny", "seeds": [0, 1], "baseline": "LN", "primary": "final_loss",
             "set": {"train.steps": 4, "train.eval_every": 4, "train.checkpoint_every": 4, "train.eval_batches": 2,
                     "data.source": "synthetic:markov?length=20000"},
             "replicate": "synthetic:markov?length=20000&seed=1",
             "variants": [{"name": "LN", "set": {"model.norm": "layernorm"}},
                          {"name": "RMS", "set": {"model.norm": "rmsnorm"}}]}
    res = normlab.compare(sweep, tmp_path / "out", workers=1)
    (rep,) = res["replications"]
    assert rep["status"] == "completed" and Path(rep["sweep_dir"]).parent == tmp_path / "out" / "replication"
    from normlab.experiments.store import Store

    seeds = sorted(r["seed"] for r in Store(Path(rep["sweep_dir"]) / "results.sqlite").runs())
    assert seeds == sorted([REPLICATION_SEED_OFFSET, REPLICATION_SEED_OFFSET + 1] * 2)
    (block,) = res["replication"]
    (row,) = block["comparisons"]
    assert block["source"] == sweep["replicate"] and row["variant"] == "RMS" and row["baseline"] == "LN"
    assert row["verdict"] in REPLICATION_VERDICTS or row["verdict"].startswith("not decided")
    # 4 steps learn nothing: the original decides nothing, so there is no conclusion to replicate
    assert row["original"]["decision"].startswith("not decided") and row["verdict"] == NO_CONCLUSION
