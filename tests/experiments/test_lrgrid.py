"""LR sensitivity, paired differences, power, common random numbers, instability signals, and the report's
learning-rate section rendered from a stored tiny sweep (numbers checked against the store)."""

from __future__ import annotations

import json
import math
import sqlite3
from statistics import mean

import pytest

from normlab.stats.learning import DID_NOT_LEARN_MARGIN
import torch
import yaml

from normlab.experiments.lrgrid import lr_sensitivity, stable_lrs
from normlab.stats.intervals import paired_diff, welch_diff
from normlab.stats.planning import seeds_needed
from tests.helpers import assert_bad_input
from tests.helpers import run_inproc as normlab


# -- statistics against hand-computed values ---------------------------------------------------------------------
def test_lr_sensitivity_hand_example_with_a_diverged_point():
    # init 8.0; 3e-2 ended above init (capped to 8.0); 1e-1 diverged (None -> 8.0)
    grid = {1e-3: 4.0, 3e-3: 3.5, 1e-2: 3.8, 3e-2: 9.0, 1e-1: None}
    sens, best, best_lr = lr_sensitivity(grid, 8.0)
    # capped: 4.0 3.5 3.8 8.0 8.0; L* = 3.5; mean(0.5, 0, 0.3, 4.5, 4.5) = 9.8 / 5
    assert sens == pytest.approx(1.96) and best == 3.5 and best_lr == 3e-3
    assert stable_lrs(grid, best, 0.1) == [3e-3] and stable_lrs(grid, best, 0.35) == [3e-3, 1e-2]
    # every point diverged: all score L_init, sensitivity 0, the smallest lr is "best"
    assert lr_sensitivity({0.1: None, 1.0: None}, 8.0) == (0.0, 8.0, 0.1)


def test_paired_t_interval_closed_form():
    a, b = [1.0, 2.0, 4.0], [0.5, 1.0, 2.5]  # differences 0.5, 1.0, 1.5: mean 1, sd 0.5
    d = paired_diff(a, b)
    t975_2 = 4.302652729911275  # tabulated t_{0.975, 2}
    assert d.paired and d.n == 3 and d.df == 2 and d.mean == pytest.approx(1.0) and d.sd == pytest.approx(0.5)
    assert d.half == pytest.approx(t975_2 * 0.5 / math.sqrt(3), rel=1e-9)
    # df = 2: P(|T| > t) = 1 - t / sqrt(2 + t^2); t = 1 / (0.5 / sqrt 3) = sqrt 12
    assert d.p == pytest.approx(1 - math.sqrt(12 / 14), rel=1e-9)
    assert not d.resolved  # 1.0 < 1.242
    # Welch for unpaired samples: df between 4 and 5 -> half-width between t_{.975,5} and t_{.975,4} times se
    w = welch_diff([1.0, 2.0, 3.0], [2.0, 4.0, 6.0, 8.0])
    se = math.sqrt(1.0 / 3 + (20 / 3) / 4)
    assert not w.paired and w.mean == pytest.approx(-3.0) and 4 < w.df < 5
    assert 2.5706 * se < w.half < 2.7765 * se


def test_seeds_needed_against_tabulated_quantiles():
    # delta = sd = 1: n = 10 since (t_.975,9 + t_.8,9) / sqrt 10 = (2.262 + 0.883) / 3.162 = 0.995 <= 1
    # while n = 9 gives (2.306 + 0.889) / 3 = 1.065 > 1
    assert seeds_needed(1.0, 1.0) == 10 and seeds_needed(-1.0, 1.0) == 10
    assert seeds_needed(0.5, 1.0) > seeds_needed(1.0, 1.0)
    assert seeds_needed(0.0, 1.0) is None and seeds_needed(1e-6, 1.0) is None and seeds_needed(1.0, 0.0) == 2


def test_a_tiny_nonzero_difference_needs_more_seeds_than_searched_not_no_difference():
    """One learning rate, 3 seeds: differences 0.101, -0.099, 0.001 (mean 0.001, sd 0.1) would need about
    ((1.96 + 0.84) · 0.1 / 0.001)^2 ≈ 78,000 seeds, beyond the 1,000 searched; the reading says "more than 1000
    seeds", not "no difference to resolve", which is kept for a difference of exactly 0."""
    from normlab.experiments.lrgrid import GridRun, analyze
    from normlab.report.lrsection import paired_cells
    from normlab.stats.intervals import t_ppf
    from normlab.stats.planning import SEEDS_NEEDED_MAX

    sd = 0.1
    assert (t_ppf(0.975, SEEDS_NEEDED_MAX - 1) + t_ppf(0.8, SEEDS_NEEDED_MAX - 1)) * sd / math.sqrt(
        SEEDS_NEEDED_MAX
    ) > 0.001

    def runs(name, finals):
        return [GridRun(name, 1e-3, s, "completed", f, 8.0, f"{name}-{s}") for s, f in enumerate(finals)]

    base = [4.0, 4.1, 3.9]
    question = {"declared": True, "primary": "final_loss", "baseline": "base", "family": ["other"], "alpha": 0.05,
                "correction": "holm", "paired": True}
    for other, reading in (([4.101, 4.001, 3.901],
                            f"undecided; more than {SEEDS_NEEDED_MAX} seeds to resolve (80% power)"),
                           (base, "undecided; no difference to resolve")):
        gr = analyze(runs("base", base) + runs("other", other), question=question)
        row, = gr.paired
        assert row.role == "primary" and row.seeds_needed is None
        assert row.diff.sd == pytest.approx(sd if other is not base else 0.0, abs=1e-9)
        assert paired_cells(gr)[1][0][-1] == reading


# -- common random numbers ---------------------------------------------------------------------------------------
def test_a_seed_gives_two_variants_the_same_batches_and_validation_windows(monkeypatch, tmp_path, cache):
    import normlab.eval.lm as lm
    import normlab.train.loop as loop
    from normlab.config import load_config

    seen: dict[str, dict[str, list]] = {}
    cur: dict[str, str] = {}
    real_batch, real_windows = loop.get_batch, lm.spread_windows

    def get_batch(tokens, b, c, gen, *rows):
        x, y = real_batch(tokens, b, c, gen, *rows)
        seen[cur["k"]]["batches"].append(x.clone())
        return x, y

    def spread_windows(n, c, m):
        w = real_windows(n, c, m)
        seen[cur["k"]]["windows"].append(w)
        return w

    monkeypatch.setattr(loop, "get_batch", get_batch)
    monkeypatch.setattr(lm, "spread_windows", spread_windows)
    monkeypatch.setenv("NORMLAB_CACHE_DIR", str(cache))
    sets = {"post": ["model.placement=post"], "qk": ["model.qk_norm=true", "model.norm=rmsnorm"]}
    for name, extra in [("post", 0), ("qk", 0), ("post", 1)]:
        cur["k"] = f"{name}{extra}"
        seen[cur["k"]] = {"batches": [], "windows": []}
        cfg = load_config("tiny", sets[name] + ["train.steps=6", "train.eval_every=3", "train.eval_batches=2",
                                                f"seed={extra}", "diag.every=0"])
        loop.train(cfg, tmp_path / cur["k"], quiet=True)
    a, b, other = seen["post0"], seen["qk0"], seen["post1"]
    assert len(a["batches"]) == 6 and all(torch.equal(x, y) for x, y in zip(a["batches"], b["batches"]))
    assert len(a["windows"]) == 3 and a["windows"] == b["windows"]  # init eval + 2 validations
    assert not torch.equal(a["batches"][0], other["batches"][0])  # another seed, another data order


# -- instability signals -----------------------------------------------------------------------------------------
def test_instability_signals_match_a_direct_computation():
    from normlab.config import load_config
    from normlab.diagnostics.training import TrainDiagnostics
    from normlab.model import build_model

    cfg = load_config("tiny", ["model.vocab_size=32", "diag.every=1"])
    torch.manual_seed(0)
    model = build_model(cfg.model)
    with torch.no_grad():  # large weights: logits far from 0 so the check is not trivial
        for blk in model.blocks:
            blk.attn.qkv.weight.mul_(8.0)
    captured = {}
    hooks = [blk.attn.register_forward_pre_hook(lambda m, inp, l=l: captured.__setitem__(l, inp[0].detach()))
             for l, blk in enumerate(model.blocks)]
    x = torch.randint(0, 32, (3, 20))
    diag = TrainDiagnostics(model, cfg.diag)
    diag.start_step(0)
    logits = model(x)
    logits.float().mean().backward()
    diag.after_backward(0, 1.0)
    rec = diag.collect()
    for h in hooks:
        h.remove()
    for l, blk in enumerate(model.blocks):
        attn = blk.attn
        q, k, _ = (t.detach() for t in attn.split_heads(captured[l]))
        if attn.rope is not None:
            q, k = attn.rope(q, k, 0)
        s = torch.einsum("bhid,bhjd->bhij", q, k) / math.sqrt(q.shape[-1])
        causal = torch.ones(20, 20, dtype=torch.bool).tril()
        assert rec[f"diag/attn_logit_max/{l}"] == pytest.approx(float(s[..., causal].max()), rel=1e-5)
    assert rec["diag/output_lse"] == pytest.approx(float(torch.logsumexp(logits.detach(), -1).mean()), rel=1e-5)
    assert all(getattr(b.attn, "logit_probe") is None for b in model.blocks)  # detached after the step


# -- the report section from a stored tiny sweep -----------------------------------------------------------------
@pytest.fixture(scope="module")
def grid_sweep(tmp_path_factory, cache):
    d = tmp_path_factory.mktemp("lrsweep")
    spec = {"name": "g", "base": "tiny", "baseline": "Pre-LN",
            "set": {"train.steps": 10, "train.eval_every": 10, "train.eval_batches": 2, "train.log_every": 5,
                    "train.checkpoint_every": 10, "train.warmup_steps": 2, "diag.every": 5},
            "lr_grid": [0.003, 0.03, 30.0], "seeds": [0, 1],
            "variants": [{"name": "Pre-LN", "set": {"model.placement": "pre"}},
                         {"name": "Pre-LN + QK-norm", "set": {"model.placement": "pre", "model.qk_norm": True}}]}
    (d / "s.yaml").write_text(yaml.safe_dump(spec))
    out = d / "out"
    r = normlab("compare", str(d / "s.yaml"), "--out", str(out), "--workers", "2", "--json", cache=cache)
    assert r.returncode == 0, r.stderr[-3000:]
    return out, json.loads(r.stdout)


def _expected_from_store(out):
    con = sqlite3.connect(out / "results.sqlite")
    rows = con.execute("SELECT run_id, axes_json, seed, status, val_bpb FROM runs").fetchall()
    init = dict(con.execute("SELECT run_id, value FROM curves WHERE key = 'init_val_bpb' AND step = 0").fetchall())
    con.close()
    per: dict[tuple[str, int], dict[float, float]] = {}
    scored: dict[tuple[str, int], dict[float, float]] = {}
    for rid, axes, seed, status, final in rows:
        axes = json.loads(axes)
        # a diverged run, and one that collapsed (did not learn: at or above the unigram level - 0.1), score L_init
        level = json.loads((out / "runs" / rid / "summary.json").read_text()).get("unigram_bpb")
        failed = status != "completed" or (level is not None and final >= level - DID_NOT_LEARN_MARGIN)
        v = init[rid] if failed else final
        scored.setdefault((axes["grid_group"], seed), {})[axes["train.lr"]] = min(v, init[rid])
        # the best final loss is the runs' own (a diverged run at L_init)
        per.setdefault((axes["grid_group"], seed), {})[axes["train.lr"]] = min(
            final if status == "completed" else init[rid], init[rid])
    sens = {k: mean(x - min(g.values()) for x in g.values()) for k, g in scored.items()}
    return per, sens


@pytest.mark.slow
def test_report_lr_section_numbers_match_the_store(grid_sweep, cache):
    out, res = grid_sweep
    assert sum(res["counts"].values()) == 12
    per, sens = _expected_from_store(out)
    lr = res["lr"]
    assert lr["is_grid"] and lr["baseline"] == "Pre-LN" and lr["learning_rates"] == [0.003, 0.03, 30.0]
    got = {v["variant"]: v for v in lr["variants"]}
    md = (out / "report.md").read_text()
    for name in ("Pre-LN", "Pre-LN + QK-norm"):
        per_seed = {s["seed"]: s["lr_sensitivity"] for s in got[name]["seeds"]}
        assert per_seed == pytest.approx({0: sens[(name, 0)], 1: sens[(name, 1)]}, abs=1e-12)
        m = mean([sens[(name, 0)], sens[(name, 1)]])
        half = 12.706204736174707 * abs(sens[(name, 0)] - sens[(name, 1)]) / math.sqrt(2) / math.sqrt(2)
        assert got[name]["lr_sensitivity"]["mean"] == pytest.approx(m)
        assert got[name]["lr_sensitivity"]["ci95"] == pytest.approx(half, rel=1e-6)
        # 10 steps learn only the unigram distribution (best loss within DID_NOT_LEARN_MARGIN of it): not ranked
        worst = max(min(per[(name, s)].values()) for s in (0, 1))
        assert got[name]["learned"] is False and got[name]["rank"] is None
        assert f"| – | {name} | did not learn (best {worst:.3f}, unigram " in md
        best = [min(per[(name, s)].values()) for s in (0, 1)]
        assert got[name]["best_val_bpb"]["mean"] == pytest.approx(mean(best))
    pair = next(p for p in lr["paired"] if p["metric"] == "LR sensitivity")
    diffs = [sens[("Pre-LN + QK-norm", s)] - sens[("Pre-LN", s)] for s in (0, 1)]
    assert pair["paired"] and pair["n"] == 2 and pair["diff"] == pytest.approx(mean(diffs))
    # every run recorded its training split's unigram floor (summary.json unigram_bpb), the report's "did not learn"
    from normlab.data import prepare_data

    floor = prepare_data(yaml.safe_load((out / "sweep.yaml").read_text())["base"]["data"]["source"], "bytes",
                         cache_dir=cache).unigram_bpb
    assert all(v["unigram_bpb"] == pytest.approx(floor, rel=1e-12) for v in lr["variants"])
    # no declared question: every comparison is exploratory
    assert {p["role"] for p in lr["paired"]} == {"exploratory"} and lr["question"]["declared"] is False
    # the seed is the unit of replication: no comparison over (seed, lr) cells
    assert {p["metric"] for p in lr["paired"]} == {"LR sensitivity", "best loss"}
    assert not any("(seed, lr)" in s for s in res["summary"]), res["summary"]
    # report order: summary, then the learning-rate section before the per-cell table
    assert md.index("## Learning-rate sweep") < md.index("## Paired differences vs Pre-LN") < md.index(
        "## Every variant × learning rate")
    # the summary ranks nothing (no variant learned), so neither does the per-cell table: no #1, no highlighted row
    assert any("nothing is ranked" in s for s in res["summary"])
    cells = md.split("## Every variant × learning rate", 1)[1].split("\n## ", 1)[0]
    rows = [ln for ln in cells.splitlines() if ln.startswith("| ") and "variant" not in ln and "---" not in ln]
    assert len(rows) == 6 and all(ln.startswith("| – |") for ln in rows), rows
    assert "<tr class='best'>" not in (out / "report.html").read_text()
    assert (out / "report_lr_loss.png").stat().st_size > 10_000 and (out / "report_signal_attn.png").is_file()
    assert any("learning rates (0.003 to 30)" in s for s in res["summary"])


@pytest.mark.slow
def test_report_on_run_directories(grid_sweep, tmp_path, cache):
    out, _ = grid_sweep
    runs = sorted((out / "runs").iterdir())
    # a single run: its own page with every logged step
    one = tmp_path / "one"
    import shutil

    shutil.copytree(runs[0], one)
    r = normlab("report", str(one), "--json", cache=cache)
    assert r.returncode == 0, r.stderr
    md = (one / "report.md").read_text()
    assert "## Run" in md and (one / "report_run.png").is_file()
    # loose copies of a whole sweep's runs: grouped by config differences into the same grid, each variant named by
    # what its runs' directory names share
    loose = tmp_path / "loose"
    paths = []
    for p in runs:
        shutil.copytree(p, loose / p.name)
        paths.append(str(loose / p.name))
    r = normlab("report", *paths, "--out", str(tmp_path / "rep"), "--json", cache=cache)
    assert r.returncode == 0, r.stderr
    lr = json.loads(r.stdout)["lr"]
    names = sorted(v["variant"] for v in lr["variants"])
    assert names == ["pre-ln", "pre-ln-qk-norm"] and lr["learning_rates"] == [0.003, 0.03, 30.0]
    _, sens = _expected_from_store(out)
    by = {v["variant"]: v for v in lr["variants"]}
    assert by["pre-ln-qk-norm"]["lr_sensitivity"]["mean"] == pytest.approx(
        mean([sens[("Pre-LN + QK-norm", 0)], sens[("Pre-LN + QK-norm", 1)]]))
    assert_bad_input(normlab("report", str(tmp_path / "nope"), cache=cache), "does not exist")
    (tmp_path / "empty").mkdir()
    assert_bad_input(normlab("report", str(tmp_path / "empty"), cache=cache), "neither a normlab run directory")
    assert_bad_input(normlab("report", *paths[:2], "--baseline", "X", "--out", str(tmp_path / "r2"), cache=cache),
                     "--baseline 'X' is not a variant")


def test_eval_mode_gap_flags_batch_statistic_norms_only():
    """Closed form: train 2.0 nats/token at val 4.5 bits/byte per 3.0 nats/token -> train 3.0 bits/byte, gap 1.5."""
    from normlab.train.init_eval import EVAL_GAP_BPB, eval_mode_gap

    g = eval_mode_gap("batchnorm", 2.0, 3.0, 4.5)
    assert g is not None and g["train_bpb"] == pytest.approx(3.0) and g["gap_bpb"] == pytest.approx(1.5)
    assert "batchnorm scores 4.50 bits/byte in eval mode" in g["message"] and "3.00 bits/byte" in g["message"]
    assert eval_mode_gap("powernorm", 2.0, 3.0, 4.5) is not None
    assert eval_mode_gap("layernorm", 2.0, 3.0, 4.5) is None  # running statistics only exist for batch norms
    # at the threshold (gap == EVAL_GAP_BPB; val_loss == val_bpb so train_bpb == train_loss) nothing is flagged
    at = 2.0 + EVAL_GAP_BPB
    assert eval_mode_gap("batchnorm", 2.0, at, at) is None
    assert eval_mode_gap("batchnorm", 2.0, at + 1e-6, at + 1e-6) is not None
    assert eval_mode_gap("batchnorm", None, 3.0, 4.5) is None


def test_best_lr_is_a_grid_point_with_the_seeds_spread():
    """Two seeds whose best learning rates are 1e-3 and 1e-1 used to print their geometric mean,
    0.01 (no grid point) ×/÷ a factor of ~2e6. Now: the grid point minimising the seed-mean capped loss (numpy
    argmin over the hand table) and the seeds' own best points."""
    import numpy as np

    from normlab.experiments.lrgrid import GridRun, group_grid
    from normlab.report.lrsection import _best_lr, rows_json

    lrs = [1e-3, 1e-2, 1e-1]
    table = {0: [3.0, 3.3, 3.6], 1: [3.9, 3.5, 3.4]}  # seed 0 best at 1e-3, seed 1 at 1e-1
    runs = [GridRun("v", lr, s, "completed", table[s][i], 8.0, f"r{s}{i}") for s in table for i, lr in enumerate(lrs)]
    g = group_grid("v", runs)
    means = np.mean([table[0], table[1]], axis=0)  # 3.45, 3.4, 3.5
    assert g.best_grid_lr() == lrs[int(np.argmin(means))] == 1e-2
    assert g.seed_best_lrs() == [1e-3, 1e-1]
    assert _best_lr(g) == "0.01 (seeds: 0.001–0.1)" and "×/÷" not in _best_lr(g)
    same = group_grid("w", [GridRun("w", lr, s, "completed", table[0][i], 8.0, f"q{s}{i}")
                            for s in (0, 1, 2) for i, lr in enumerate(lrs)])
    assert _best_lr(same) == "0.001 (all 3 seeds)"
    assert _best_lr(group_grid("x", [])) == "–"

    from types import SimpleNamespace

    grid = SimpleNamespace(baseline="v", lrs=lrs, is_grid=True, groups=[g], paired=[], question=None,
                           exploratory=None)  # what rows_json reads
    row = rows_json(grid)["variants"][0]
    assert row["best_lr"] == 1e-2 and row["best_lr_per_seed"] == [1e-3, 1e-1]


@pytest.mark.slow
def test_report_computes_the_unigram_floor_for_runs_trained_before_it_was_recorded(grid_sweep, tmp_path, cache):
    """A stored sweep whose summary.json files have no unigram_bpb: the report computes it from each run's own
    cached training split (normlab.rundir.readers.run_data), so the did-not-learn guard works on old sweeps."""
    import shutil

    from normlab.data import prepare_data

    out, _ = grid_sweep
    old = tmp_path / "old"
    shutil.copytree(out, old)
    for p in (old / "runs").glob("*/summary.json"):
        sm = json.loads(p.read_text())
        sm.pop("unigram_bpb")
        p.write_text(json.dumps(sm))
    r = normlab("report", str(old), "--json", cache=cache)
    assert r.returncode == 0, r.stderr
    lr = json.loads(r.stdout)["lr"]
    floor = prepare_data(yaml.safe_load((out / "sweep.yaml").read_text())["base"]["data"]["source"], "bytes",
                         cache_dir=cache).unigram_bpb
    assert all(v["unigram_bpb"] == pytest.approx(floor, rel=1e-12) and v["learned"] is False for v in lr["variants"])


def test_signal_series_carries_the_composite_gain_of_stream_runs():
    """The stream variants' ``diag/hc_gain_*`` reach the report's signals (lrplots reads signal_series / SIGNALS);
    a run without streams has none."""
    from normlab.experiments.lrgrid import SIGNALS, signal_series

    curves = {"diag/hc_gain_fwd": [(20, 1.0), (40, 2.5)], "diag/hc_gain_bwd": [(20, 1.0), (40, 1.7)],
              "diag/output_lse": [(20, 0.1)]}
    got = signal_series(curves)
    assert got["hc_gain_fwd"] == [(20, 1.0), (40, 2.5)] and got["hc_gain_bwd"] == [(20, 1.0), (40, 1.7)]
    assert "hc_gain_fwd" in SIGNALS and "hc_gain_bwd" in SIGNALS
    assert "hc_gain_fwd" not in signal_series({"diag/output_lse": [(20, 0.1)]})
