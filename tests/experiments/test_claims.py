"""``normlab claims``: t quantiles, verdict logic on synthetic results, the tiny budget end to end through the CLI.

The claims suite trains through the sweep runner (normlab.experiments.sweepdir): its output directory is a sweep
directory, old-layout runs are moved in and reused, ``--reuse`` copies another sweep's identical runs, Ctrl-C
stops it resumably with exit status 130 and measures nothing."""

from __future__ import annotations

import json
import math
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from normlab.experiments.claims.budgets import get_budget
from normlab.decide.verdicts import finite
from normlab.decide.verdicts import HELD, INCONCLUSIVE, NOT_HELD
from normlab.decide.vocab import CLAIM_VERDICTS, NOT_DECIDED_DNL  # noqa: F401
from normlab.decide.verdicts import claim_verdict as verdict
from normlab.experiments.claims.variants import variant_config
from normlab.experiments.store import Store
from normlab.stats.intervals import mean_ci, t_cdf
from normlab.stats.intervals import t_ppf as t_quantile
from tests.helpers import cli_env, run_inproc

torch.set_num_threads(1)


@pytest.mark.parametrize("df, q", [(1, 12.706), (2, 4.303), (3, 3.182), (4, 2.776), (9, 2.262), (29, 2.045),
                                   (1000, 1.962)])
def test_t_quantile_known_values(df, q):
    assert t_quantile(0.975, df) == pytest.approx(q, abs=1e-3)
    assert t_quantile(0.025, df) == pytest.approx(-q, abs=1e-3)
    assert t_cdf(t_quantile(0.9, df), df) == pytest.approx(0.9, abs=1e-9)


def test_t_quantile_other_levels():
    assert t_quantile(0.95, 4) == pytest.approx(2.132, abs=1e-3)
    assert t_quantile(0.995, 4) == pytest.approx(4.604, abs=1e-3)
    assert t_quantile(0.5, 3) == pytest.approx(0.0, abs=1e-9)


def test_mean_ci_matches_formula():
    xs = [1.0, 2.0, 4.0, 7.0]
    c = mean_ci(xs)
    m, (lo, hi), n = c.mean, (c.low, c.high), c.n
    sd = math.sqrt(sum((x - 3.5) ** 2 for x in xs) / 3)
    half = 3.182446305284263 * sd / 2
    assert (m, n) == (3.5, 4)
    assert lo == pytest.approx(3.5 - half, rel=1e-8) and hi == pytest.approx(3.5 + half, rel=1e-8)
    assert finite([None, float("nan"), 2.0]) == [2.0] and mean_ci([2.0]).half is None  # verdicts use finite values
    assert verdict([None, float("nan"), 2.0], "greater")["ci"] is None
    assert verdict([], "greater")["measured"] is None


@pytest.mark.parametrize("values, direction, expected", [
    ([1.0, 1.1, 0.9, 1.05], "greater", HELD),
    ([-1.0, -1.1, -0.9, -1.05], "greater", NOT_HELD),
    ([-1.0, 1.0, 0.5, -0.3], "greater", INCONCLUSIVE),
    ([-1.0, -1.1, -0.9, -1.05], "less", HELD),
    ([1.0, 1.1, 0.9, 1.05], "less", NOT_HELD),
    ([-1.0, 1.0, 0.5, -0.3], "less", INCONCLUSIVE),
])
def test_verdict_directions(values, direction, expected):
    v = verdict(values, direction)
    assert v["verdict"] == expected
    assert v["measured"] == pytest.approx(sum(values) / len(values))


def test_verdict_null_value_and_n1():
    assert verdict([0.01, 0.011, 0.012], "less", null=0.05)["verdict"] == HELD
    assert verdict([0.10, 0.11, 0.12], "less", null=0.05)["verdict"] == NOT_HELD
    one = verdict([5.0], "greater")
    assert one["verdict"] == INCONCLUSIVE and one["ci"] is None and one["n"] == 1
    assert verdict([5.0, None, float("nan")], "greater")["verdict"] == INCONCLUSIVE  # non-finite values dropped
    # two identical values: zero-width CI, still decided
    assert verdict([1.0, 1.0], "greater")["verdict"] == HELD


def test_verdict_equivalence_margin():
    assert verdict([0.01, -0.01, 0.0, 0.005], "within", margin=0.05)["verdict"] == HELD
    assert verdict([0.30, 0.31, 0.29], "within", margin=0.05)["verdict"] == NOT_HELD
    assert verdict([-0.30, -0.31, -0.29], "within", margin=0.05)["verdict"] == NOT_HELD
    assert verdict([0.0, 0.1, -0.05, 0.08], "within", margin=0.05)["verdict"] == INCONCLUSIVE


def test_verdict_exactness_tolerance():
    assert verdict([3e-7, 1e-6], "exact", tolerance=1e-4)["verdict"] == HELD
    assert verdict([3e-7], "exact", tolerance=1e-4)["verdict"] == HELD  # deterministic: one seed suffices
    bad = verdict([3e-7, 2e-4], "exact", tolerance=1e-4)
    assert bad["verdict"] == NOT_HELD and bad["measured"] == 2e-4
    assert verdict([3e-7, float("inf")], "exact", tolerance=1e-4)["verdict"] == NOT_HELD
    assert verdict([1e-4], "exact", tolerance=1e-4)["verdict"] == HELD  # boundary counts as within


KEYS = {"claim", "paper", "metric", "expected", "measured", "ci", "verdict"}


def test_claims_tiny_end_to_end(tmp_path):
    out = tmp_path / "claims"
    cache = tmp_path / "cache"
    p = run_inproc("claims", "--budget", "tiny", "--only", "powernorm-lm,exact-conversion", "--out", str(out),
                   "--json", cache=cache, check=True)
    rep = json.loads(p.stdout)
    saved = json.loads((out / "claims.json").read_text())
    assert saved["claims"] == rep["claims"] and saved["budget"] == "tiny"
    assert [c["name"] for c in rep["claims"]] == ["exact-conversion", "powernorm-lm"]
    for c in rep["claims"]:
        assert KEYS <= set(c)
        assert c["verdict"] in (*CLAIM_VERDICTS, NOT_DECIDED_DNL)
    exact, pn = rep["claims"]
    assert exact["verdict"] == HELD and exact["measured"] <= 1e-4
    assert len(pn["values"]) == rep["seeds"] == 2
    # the per-seed values are what the runs' own summary.json files say
    recomputed = []
    for runs in pn["runs"]:  # run directories relative to the claims directory: no machine path is stored
        assert not any(Path(r).is_absolute() for r in runs.values())
        s_pn = json.loads((out / runs["powernorm"] / "summary.json").read_text())
        s_ln = json.loads((out / runs["ln"] / "summary.json").read_text())
        assert s_pn["status"] == s_ln["status"] == "completed"
        recomputed.append(s_ln["val_bpb"] - s_pn["val_bpb"])
    assert pn["values"] == pytest.approx(recomputed, abs=1e-12)
    assert pn["measured"] == pytest.approx(sum(recomputed) / 2, abs=1e-12)
    c = mean_ci(recomputed)
    assert pn["ci"] == pytest.approx([c.low, c.high])
    assert pn["raw_verdict"] == verdict(recomputed, "greater")["verdict"]  # the unadjusted verdict, kept beside
    # the family is this one claim (exact-conversion has no test); 8 steps teach the tiny models nothing beyond byte
    # frequencies (the Markov source's 16 symbols: unigram entropy at most 4 bits/byte), so by the one did-not-learn
    # rule powernorm-lm is not observable and enters the family as p = 1
    assert exact["p"] is None and rep["family_size"] == 1 + ("tost" in pn)  # its test and its margin's TOST
    assert all(0 < d["unigram_bpb"] <= 4.0 for d in pn["details"])
    assert all(d["bpb_ln"] >= d["unigram_bpb"] - 0.1 for d in pn["details"])
    # and the tiny budget's 2 seeds are fewer than the decision layer's minimum (MIN_SEEDS = 3): no test either
    assert pn["verdict"] == NOT_DECIDED_DNL and pn["p_adj"] == 1.0 and pn["p"] is None
    # every model the claim trains is recorded for the guard (not only the ones its definition lists)
    assert all(set(d["learn_bpb"]) == {"ln", "powernorm"} for d in pn["details"])
    from normlab.experiments.claims.specs import CLAIMS, spec_hash

    assert pn["spec_hash"] == spec_hash(next(c for c in CLAIMS if c.name == "powernorm-lm"))
    assert pn["current_definition"] and len(pn["revised"]) == 2

    # resume: everything reused, same numbers; the human table names the verdicts
    p2 = run_inproc("claims", "--budget", "tiny", "--only", "powernorm-lm", "--out", str(out), cache=cache, check=True)
    text = " ".join(p2.stdout.split())
    assert "0 trained, 4 reused" in text and "budget tiny" in text
    assert "Definitions revised" in text and "2026-11-23, powernorm-lm: recipe:" in text
    rep2 = json.loads((out / "claims.json").read_text())  # --only updates its claim, keeps the others
    assert [c["name"] for c in rep2["claims"]] == ["exact-conversion", "powernorm-lm"]
    assert rep2["claims"][1]["values"] == pn["values"] and rep2["claims"][0] == exact

    # docs/claims.md from the saved file: every claim's row states the scale of its runs (the budget's shapes)
    from normlab.experiments.claims.docs import write_docs
    from normlab.experiments.claims import get_budget

    b = get_budget("tiny")
    tokens = b.steps * b.batch_size * b.context
    want = f"width {b.width}, {b.depth} blocks, {b.steps} steps, {tokens / 1e3:.3g}k tokens"
    assert rep2["claims"][1]["scale"] == want  # stored when measured: the page renders it without the runs
    import shutil

    shutil.rmtree(out / "runs")
    write_docs(rep2, tmp_path / "claims.md")
    rows = [r for r in (tmp_path / "claims.md").read_text().splitlines() if r.startswith("| 2 |")]
    assert len(rows) == 1 and "(`powernorm-lm`)" in rows[0]
    assert want in rows[0]


def test_claims_unknown_name_is_one_line_error(tmp_path):
    p = run_inproc("claims", "--budget", "tiny", "--only", "dyt-vs-lm", "--out", str(tmp_path / "x"),
                   cache=tmp_path / "cache")
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "unknown claim 'dyt-vs-lm'" in lines[0] and "exact-conversion" in lines[0] and "linear-attention" in lines[0]
    assert not (tmp_path / "x").exists()


def test_claims_bad_budget_and_seeds(tmp_path):
    p = run_inproc("claims", "--budget", "huge", cache=tmp_path / "cache")
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1
    p = run_inproc("claims", "--budget", "tiny", "--seeds", "0", "--out", str(tmp_path / "y"), cache=tmp_path / "cache")
    assert p.returncode == 2 and "--seeds" in p.stderr


def fingerprinted(run_dir: Path, cfg: dict) -> None:
    """Give ``run_dir`` the config.yaml and fingerprint.json a training of ``cfg`` by the current code writes."""
    import copy

    from normlab.config import config_from_dict, dump_config
    from normlab.rundir.files import FINGERPRINT_FILE
    from normlab.rundir.fingerprint import current_fingerprint
    from normlab.io import write_json, write_text

    rc = config_from_dict(copy.deepcopy(cfg))
    run_dir.mkdir(parents=True, exist_ok=True)
    write_text(run_dir / "config.yaml", dump_config(rc))
    write_json(run_dir / FINGERPRINT_FILE, current_fingerprint(rc))


def test_old_layout_run_is_reused_only_when_spec_and_resolved_config_match(tmp_path):
    """A finished run of the old layout (``runs/<variant>/seed<k>`` with ``claims_spec.json``) is moved into the
    sweep only for the same spec; a changed library default (the resolved config differs), an old-format spec file
    or a missing fingerprint makes it train again."""
    from normlab.experiments.claims.budgets import get_budget
    from normlab.experiments.claims.execution import old_reuse_reason, spec_record
    from normlab.experiments.claims.variants import variant_config
    from normlab.io import write_json

    cfg = variant_config("ln", get_budget("tiny"), 0)
    write_json(tmp_path / "summary.json", {"status": "completed"})
    write_json(tmp_path / "claims_spec.json", spec_record(cfg))
    assert old_reuse_reason(tmp_path, cfg) is not None  # no fingerprint.json: trained before fingerprints
    fingerprinted(tmp_path, cfg)
    assert old_reuse_reason(tmp_path, cfg) is None
    assert old_reuse_reason(tmp_path, {**cfg, "seed": 1}) is not None
    rec = spec_record(cfg)
    rec["resolved"]["model"]["init_std"] = 0.01  # as if the default had been different when it trained
    write_json(tmp_path / "claims_spec.json", rec)
    assert old_reuse_reason(tmp_path, cfg) == "its spec or resolved config changed"
    write_json(tmp_path / "claims_spec.json", cfg)  # the earlier format: the spec alone
    assert old_reuse_reason(tmp_path, cfg) is not None
    write_json(tmp_path / "claims_spec.json", spec_record(cfg))
    for damaged in ([1, 2], {"status": 3}):  # a list was an AttributeError; a status of the wrong type is refused
        write_json(tmp_path / "summary.json", damaged)
        assert old_reuse_reason(tmp_path, cfg) == "unreadable claims_spec.json or summary.json"


def test_run_ids_hold_the_resolved_config_hash():
    """The claims sweep's run ids are ``<variant>-s<seed>[-lr<lr>]-<hash>`` of the config normlab resolves the
    spec to (what the sweep worker trains: resolving it again gives the same hash), so a changed spec or library
    default is a new run id, never a silently reused run."""
    from normlab.config import config_from_dict
    from normlab.experiments.claims.budgets import get_budget
    from normlab.experiments.claims.execution import claims_sweep, run_id
    from normlab.experiments.claims.variants import variant_config

    b = get_budget("tiny")
    sweep = claims_sweep(b, ["grid_pre", "ln"], 2)
    assert len(sweep.runs) == 2 * (1 + len(b.grid_lrs)) == len({r.run_id for r in sweep.runs})
    for r in sweep.runs:
        lr = r.axes.get("train.lr")
        rc = config_from_dict(variant_config(r.variant, b, r.seed, lr))
        assert r.config_hash == rc.hash() == config_from_dict(json.loads(json.dumps(r.config))).hash()
        assert r.run_id == run_id(r.variant, r.seed, lr, rc.hash()) and r.run_id.endswith(rc.hash()[:8])
    depths = [r.config["model"]["depth"] for r in sweep.runs]
    assert depths == sorted(depths, reverse=True)  # deep runs first
    changed = variant_config("ln", b, 0)
    changed["model"]["init_std"] = 0.01
    assert run_id("ln", 0, None, config_from_dict(changed).hash()) not in {r.run_id for r in sweep.runs}
    assert claims_sweep(b, ["ln"], 1).hash == sweep.hash  # --only / --seeds share one store


def test_lr_sweep_claims_tiny_end_to_end(tmp_path):
    """QK-norm LR sensitivity and the z-loss claim over the tiny grid (1e-3, 1e-2, 30): per-seed values recomputed
    from the runs' own summary.json / metrics.jsonl with the paper's formula (a diverged run scores L_init, and so
    does one that collapsed: did not learn, normlab.stats.learning)."""
    from normlab.experiments.claims.budgets import get_budget
    from normlab.stats.learning import DID_NOT_LEARN_MARGIN

    out = tmp_path / "claims"
    p = run_inproc("claims", "--budget", "tiny", "--only", "qk-lr-sensitivity,zloss-logit-divergence", "--out",
                   str(out), "--json", cache=tmp_path / "cache", check=True)
    rep = json.loads(p.stdout)
    qk, z = rep["claims"]
    lrs = get_budget("tiny").grid_lrs

    def sens(grid: dict[str, str]) -> float:  # one seed's runs of a grid variant: lr -> run directory
        assert sorted(grid) == sorted(f"{lr:g}" for lr in lrs)
        capped = []
        for lr in lrs:
            s = json.loads((out / grid[f"{lr:g}"] / "summary.json").read_text())
            failed = s["status"] != "completed" or s["val_bpb"] >= s["unigram_bpb"] - DID_NOT_LEARN_MARGIN
            v = s["init_val_bpb"] if failed else s["val_bpb"]  # a diverged or collapsed run scores L_init
            capped.append(min(v, s["init_val_bpb"]))
        return sum(c - min(capped) for c in capped) / len(capped)

    expected = [sens(r["grid_pre"]) - sens(r["grid_pre_qk"]) for r in qk["runs"]]
    assert qk["values"] == pytest.approx(expected, abs=1e-12) and len(expected) == 2
    # the guard: a grid model whose best run did not learn in some seed makes the claim "not decided"
    def best_learned(grid: dict[str, str]) -> bool:
        ss = [json.loads((out / d / "summary.json").read_text()) for d in grid.values()]
        done = [s["val_bpb"] for s in ss if s["status"] == "completed"]
        return bool(done) and min(done) < ss[0]["unigram_bpb"] - DID_NOT_LEARN_MARGIN

    learned = all(best_learned(g) for r in qk["runs"] for g in r.values())
    assert qk["verdict"] == (verdict(expected, "greater")["verdict"] if learned else NOT_DECIDED_DNL)

    def lse(grid: dict[str, str]) -> float:
        recs = [json.loads(l) for l in (out / grid[f"{max(lrs):g}"] / "metrics.jsonl").read_text().splitlines()]
        return [r["diag/output_lse"] for r in recs if "diag/output_lse" in r][-1]

    zexp = [abs(lse(r["grid_pre"])) - abs(lse(r["grid_pre_z"])) for r in z["runs"]]
    assert z["values"] == pytest.approx(zexp, abs=1e-12)


def test_reuse_finds_a_finished_sweep_run_with_the_same_resolved_config(tmp_path):
    """``claims --reuse SWEEP_DIR``: a finished sweep run with exactly the claim run's resolved config is found; a
    run with another lr, or one still pending in a sweep nobody is running, is not (the caller trains it)."""
    from normlab.experiments.store import Store
    from normlab.experiments.claims.budgets import get_budget
    from normlab.experiments.claims.execution import _resolved_key, find_reusable
    from normlab.experiments.claims.variants import variant_config

    b = get_budget("quick")
    cfg = variant_config("grid_pre_qk", b, 1, b.grid_lrs[2])
    other = variant_config("grid_pre_qk", b, 1, b.grid_lrs[3])
    pending = variant_config("grid_pre", b, 0, b.grid_lrs[0])
    store = Store(tmp_path / "results.sqlite")
    store.create("s", "h")
    store.register([{"run_id": rid, "position": i, "variant": rid, "seed": c["seed"], "config_hash": "x", "axes": {},
                     "overrides": {}, "config": {**c, "train": {**c["train"], "threads": None}}}
                    for i, (rid, c) in enumerate([("a", cfg), ("b", pending)])])
    store.update("a", status="completed")
    assert find_reusable(tmp_path, cfg, wait_s=0) is None  # no fingerprint: the current code may not reproduce it
    fingerprinted(tmp_path / "runs" / "a", cfg)
    assert find_reusable(tmp_path, cfg, wait_s=0) == tmp_path / "runs" / "a"
    stored = {_resolved_key(r["config"]) for r in store.runs()}
    assert find_reusable(tmp_path, other, wait_s=0) is None and _resolved_key(other) not in stored
    assert _resolved_key(pending) in stored and find_reusable(tmp_path, pending, wait_s=0) is None


def test_every_claim_spec_names_a_known_measurement_and_known_variants():
    """The claims are data (specs.py): each names a measurement registered in measures.MEASURES that accepts its
    args, needs only variants that variants.py defines, uses a verdict direction stats.verdict knows, and every
    variant a measurement's args name is one the claim asks to be trained."""
    import inspect

    from normlab.experiments.claims.measures import MEASURES
    from normlab.experiments.claims.specs import CLAIM_NAMES, CLAIMS
    from normlab.decide.verdicts import DIRECTIONS
    from normlab.experiments.claims.variants import ALL_VARIANTS

    assert len(set(CLAIM_NAMES)) == len(CLAIM_NAMES)
    for c in CLAIMS:
        assert c.measure in MEASURES, c.name
        inspect.signature(MEASURES[c.measure]).bind(None, {}, *c.args)  # raises TypeError on a wrong arity
        assert c.direction in DIRECTIONS and c.variants and set(c.variants) <= set(ALL_VARIANTS), c.name
        assert {a for a in c.args if a in ALL_VARIANTS} <= set(c.variants), c.name
    assert set(MEASURES) == {c.measure for c in CLAIMS}  # no measurement left without a claim


# ---------------------------------------------------------------- the claims suite through the sweep runner
ARGS = ("claims", "--budget", "tiny", "--seeds", "1", "--only", "powernorm-lm", "--json")


def test_claims_dir_is_a_sweep_dir_and_old_layout_runs_are_moved_in(tmp_path):
    """A first run writes a sweep directory (store rows completed, TensorBoard per run); the same runs put back in
    the layout before the sweep runner (runs/<variant>/seed<k> + claims_spec.json, no store) are moved into place and
    reused (0 trained), giving the same values."""
    from normlab.experiments.claims.execution import spec_record
    from normlab.io import write_json

    out, cache = tmp_path / "claims", tmp_path / "cache"
    rep = json.loads(run_inproc(*ARGS, "--out", str(out), cache=cache, check=True).stdout)
    assert rep["trained_runs"] == 2 and rep["reused_runs"] == 0
    rows = {r["run_id"]: r for r in Store(out / "results.sqlite").runs()}
    runs = rep["claims"][0]["runs"][0]
    assert sorted(rows) == sorted(Path(p).name for p in runs.values())
    assert all(r["status"] == "completed" and r["train_calls"] == 1 for r in rows.values())
    assert all(any((out / "tb" / rid).iterdir()) for rid in rows)
    assert yaml.safe_load((out / "sweep.yaml").read_text()) == {"name": "claims-tiny", "claims_budget": "tiny"}

    old = tmp_path / "old"  # the same runs in the old layout
    for variant, p in runs.items():
        dest = old / "runs" / variant / "seed0"
        shutil.copytree(out / p, dest)
        write_json(dest / "claims_spec.json", spec_record(variant_config(variant, get_budget("tiny"), 0)))
    again = run_inproc(*ARGS, "--out", str(old), cache=cache, check=True)
    rep2 = json.loads(again.stdout)
    assert rep2["trained_runs"] == 0 and rep2["reused_runs"] == 2, again.stderr
    assert rep2["claims"][0]["values"] == rep["claims"][0]["values"]
    assert "moved 2 finished run(s) of the old layout" in again.stderr
    assert not (old / "runs" / "powernorm").exists()
    moved = {r["run_id"]: r for r in Store(old / "results.sqlite").runs()}
    assert sorted(moved) == sorted(rows) and all(r["status"] == "completed" and r["train_calls"] == 0
                                                 for r in moved.values())
    assert [r["val_bpb"] for _, r in sorted(moved.items())] == [r["val_bpb"] for _, r in sorted(rows.items())]


def test_claims_refuse_another_sweeps_directory(tmp_path):
    from tests.helpers import assert_bad_input

    out, cache = tmp_path / "claims", tmp_path / "cache"
    out.mkdir()
    Store(out / "results.sqlite").create("demo", "0123456789abcdef")
    assert_bad_input(run_inproc(*ARGS, "--out", str(out), cache=cache), "holds sweep 'demo'")
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    assert_bad_input(run_inproc(*ARGS, "--out", str(other), cache=cache), "holds neither claims results nor a sweep")
    assert [p.name for p in other.iterdir()] == ["notes.txt"]


def test_claims_reuse_copies_a_sweeps_identical_run(tmp_path):
    """``--reuse SWEEP_DIR``: the run a compare sweep trained from exactly a claims run's resolved config is copied
    (same weights, not trained), the others are trained."""
    from tests.helpers import normlab

    cache = tmp_path / "cache"
    b = get_budget("tiny")
    lr = b.grid_lrs[0]
    base = variant_config("grid_pre", b, 0, lr)
    base.pop("seed")
    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump({"name": "one", "base": base, "seeds": [0]}))
    sweep_dir = tmp_path / "sweep"
    normlab("compare", str(f), "--out", str(sweep_dir), "--workers", "1", "--json", cache=cache, check=True)
    out = tmp_path / "claims"
    p = run_inproc("claims", "--budget", "tiny", "--seeds", "1", "--only", "zloss-logit-divergence", "--out",
                   str(out), "--reuse", str(sweep_dir), "--json", cache=cache, check=True)
    rep = json.loads(p.stdout)
    n = 2 * len(b.grid_lrs)
    assert rep["trained_runs"] == n - 1 and rep["reused_runs"] == 1, p.stderr
    assert "copied 1 of 1 run(s)" in p.stderr
    copied = out / rep["claims"][0]["runs"][0]["grid_pre"][f"{lr:g}"]
    src = sweep_dir / "runs" / Store(sweep_dir / "results.sqlite").runs()[0]["run_id"]
    assert (copied / "model.safetensors").read_bytes() == (src / "model.safetensors").read_bytes()
    assert Store(out / "results.sqlite").get(copied.name)["train_calls"] == 0
    # the store orders the runs as the whole sweep does, not as the part trained first (report order, positions)
    assert sorted(r["position"] for r in Store(out / "results.sqlite").runs()) == list(range(n))


@pytest.mark.parametrize("inherited", [signal.SIG_DFL, signal.SIG_IGN], ids=["sigint-default", "sigint-ignored"])
def test_claims_ctrl_c_stops_resumably_and_measures_nothing(tmp_path, inherited):
    """SIGINT while the runs train: exit 130, a JSON status on stdout, no claims.json; the same command resumes.
    Also when the process starts with SIGINT ignored (as under a background shell, e.g. CI) and whether the signal
    lands during a run's training or between runs (the in-process runner installs its own handler)."""
    out, cache = tmp_path / "claims", tmp_path / "cache"
    proc = subprocess.Popen([sys.executable, "-m", "normlab.cli", *ARGS, "--out", str(out)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=cli_env(cache),
                            preexec_fn=lambda: signal.signal(signal.SIGINT, inherited))
    deadline = time.time() + 300  # a loaded machine can take a while to start the first worker
    while time.time() < deadline and proc.poll() is None and not list((out / "logs").glob("*.log")):
        time.sleep(0.05)
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr[-2000:]
    assert json.loads(stdout)["status"] == "interrupted" and "Re-run the same command" in json.loads(stdout)["error"]
    assert not (out / "claims.json").exists()
    rows = Store(out / "results.sqlite").runs()
    assert any(r["status"] != "completed" for r in rows) or len(rows) < 2
    again = run_inproc(*ARGS, "--out", str(out), cache=cache, check=True)
    rep = json.loads(again.stdout)
    assert rep["claims"][0]["n"] == 1 and (out / "claims.json").is_file()
    assert all(r["status"] == "completed" for r in Store(out / "results.sqlite").runs())


def test_the_scale_budget_runs_its_claims_at_the_documented_shape_on_its_own_seeds():
    """``--budget scale``: the claims not decided at width 64, every run (shallow, deep and grid) at 12 blocks of
    width 256, 4 heads, context 256, 2,000 steps of batch 16 on pystdlib, asking for ``device: cuda``, on seeds
    5000-5007 (docs/compare.md, Seed blocks); the CPU budgets' claims.json ``budget_spec`` keeps its fields."""
    from normlab.config import config_from_dict
    from normlab.experiments.claims.execution import claims_sweep
    from normlab.experiments.claims.specs import select

    b = get_budget("scale")
    claims = select(",".join(b.claims))
    assert {c.name for c in claims} >= {"cod-growth", "peri-variance-magnitude", "dyt-vs-ln", "stablemax-collapse"}
    sweep = claims_sweep(b, sorted({v for c in claims for v in c.variants}), b.seeds)
    assert {r.seed for r in sweep.runs} == set(range(5000, 5008))
    assert any(r.axes.get("train.lr") for r in sweep.runs) and any("train.lr" not in r.axes for r in sweep.runs)
    for r in sweep.runs:
        cfg = config_from_dict(dict(r.config))
        m, t = cfg.model, cfg.train
        assert (cfg.device, m.depth, m.width, m.heads, m.context) == ("cuda", 12, 256, 4, 256), r.run_id
        assert (t.steps, t.batch_size, cfg.data.source) == (2000, 16, "pystdlib"), r.run_id
    assert "device" not in get_budget("full").to_dict() and "seed_base" not in get_budget("tiny").to_dict()
    assert get_budget("scale").to_dict()["seed_base"] == 5000


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without a CUDA device")
def test_the_scale_budget_without_cuda_refuses_in_one_line_with_its_estimated_time(tmp_path, cache):
    from tests.helpers import assert_bad_input

    out = tmp_path / "out"
    proc = run_inproc("claims", "--budget", "scale", "--out", str(out), cache=cache)
    assert_bad_input(proc, "sweep 'claims-scale' asks for device: cuda", "no CUDA device", "would take at least",
                     "training FLOPs")
    assert not out.exists()
