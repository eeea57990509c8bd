"""Size sweeps and scaling laws: fits recover known parameters, crossovers of known curves, SNR by hand, the size
axis expands as specified, and the report's scaling section renders from a stored tiny size sweep."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import yaml
from scipy.stats import ttest_ind

from normlab.config import config_from_dict
from normlab.errors import NormlabError
from normlab.experiments.sweep import parse_sweep
from normlab.experiments.sweep import dump_spec
from normlab.experiments.worker import record
from normlab.model.build import build_model
from normlab.report import scaling_fit as sf
from normlab.stats.intervals import welch
from tests.helpers import assert_bad_input, register_sweep
from tests.helpers import run_inproc as normlab


def _cells(law, ns, seeds, noise, rng, d=None):
    cells = {}
    for i, n in enumerate(ns):
        dd = None if d is None else d[i]
        clean = law(n, dd)
        cells[i] = sf.Cell(float(n), {s: float(clean * math.exp(rng.normal(0.0, noise))) for s in seeds},
                           None if dd is None else float(dd))
    return cells


def _fit(cells, replicates=200, with_d=False):
    draws = sf.seed_draws({k: sorted(c.losses) for k, c in cells.items()}, replicates, np.random.default_rng(1))
    return sf.fit_cells(cells, draws, with_d=with_d)


# -- fits ------------------------------------------------------------------------------------------------------
def test_fit_recovers_known_parameters_within_the_bootstrap_interval():
    true = sf.PowerLaw(E=1.7, A=40.0, alpha=0.34)
    ns = np.geomspace(1e4, 3e7, 6)
    rng = np.random.default_rng(0)
    cells = {}
    for i, n in enumerate(ns):  # 1% noise, mirrored in pairs of seeds: each size's mean lies on the law
        u = rng.normal(0.0, 0.01, 3)
        noise = np.concatenate([u, -u])
        cells[i] = sf.Cell(float(n), {s: float(true(n) * (1 + e)) for s, e in enumerate(noise)})
    fit = _fit(cells)
    assert fit.law.params() == pytest.approx(true.params(), rel=1e-3)
    for key in ("E", "A", "alpha"):
        lo, hi = fit.interval(key)
        assert lo <= getattr(true, key) <= hi, (key, lo, hi)
        assert hi - lo < 0.5 * getattr(true, key)  # informative, not a catch-all
    assert fit.n_points == 36 and fit.n_sizes == 6 and fit.issues() == []
    # a one-seed noisy draw still lands near the truth
    one = _fit(_cells(true, ns, range(1), 0.003, np.random.default_rng(7)), replicates=0)
    assert one.law.alpha == pytest.approx(0.34, abs=0.05) and one.law.E == pytest.approx(1.7, abs=0.1)


def test_fit_in_parameters_and_tokens():
    true = sf.PowerLaw(E=1.5, A=40.0, alpha=0.34, B=300.0, beta=0.28)
    ns, ds = np.meshgrid(np.geomspace(1e4, 3e6, 4), np.geomspace(1e6, 3e7, 3))
    ns, ds = ns.ravel(), ds.ravel()
    exact = sf.fit_law(ns, true(ns, ds), ds)
    assert exact.params() == pytest.approx(true.params(), rel=2e-3)
    fit = _fit(_cells(true, ns, range(2), 0.003, np.random.default_rng(2), d=ds), replicates=60, with_d=True)
    for key in ("alpha", "beta"):
        lo, hi = fit.interval(key)
        assert lo <= getattr(true, key) <= hi, (key, lo, hi)
    assert fit.issues() == []  # a well-posed L(N, D) is not flagged


def test_huber_is_quadratic_then_linear():
    r = np.array([0.0, 5e-4, -1e-3, 3e-3, -2e-2])
    d = 1e-3
    ref = [0.0, 0.5 * 5e-4**2, 0.5 * 1e-6, d * (3e-3 - d / 2), d * (2e-2 - d / 2)]
    assert sf.huber(r, d) == pytest.approx(ref, rel=1e-12)


# -- crossovers ------------------------------------------------------------------------------------------------
def test_crossover_of_two_known_curves():
    a = sf.PowerLaw(E=2.0, A=10.0, alpha=0.2)
    b = sf.PowerLaw(E=1.5, A=100.0, alpha=0.4)
    # 2 + 10 x = 1.5 + 100 x^2 with x = N^-0.2  ->  x = (10 + sqrt(300)) / 200
    x = (10 + math.sqrt(300)) / 200
    n_star = x ** -5
    roots = sf.crossings(sf.difference(a, b), 1e2, 1e8)
    assert len(roots) == 1 and roots[0] == pytest.approx(n_star, rel=1e-8)
    assert sf.crossings(sf.difference(a, sf.PowerLaw(E=2.1, A=10.0, alpha=0.2)), 1e2, 1e8) == []

    ns = np.geomspace(1e3, 1e6, 6)
    fa = _fit(_cells(a, ns, range(3), 0.002, np.random.default_rng(3)))
    fb = _fit(_cells(b, ns, range(3), 0.002, np.random.default_rng(4)))
    co = sf.crossover(fa, fb, 1e3, 1e6, 1e8)
    assert co.verdict == "crossover" and co.roots[0] == pytest.approx(n_star, rel=0.15)
    assert co.interval[0] <= n_star <= co.interval[1]
    assert "crossover within the fitted range" in co.text()
    # parallel curves (same exponent, E apart by far more than the noise): no crossover
    fc = _fit(_cells(sf.PowerLaw(E=2.3, A=10.0, alpha=0.2), ns, range(3), 0.002, np.random.default_rng(5)))
    far = sf.crossover(fa, fc, 1e3, 1e6, 1e8)
    assert far.verdict == "no crossover" and far.fraction == 0.0
    point, iv = sf.forecast(fa, fc, 1e6)  # at the largest fitted size: the difference of the two laws
    assert point == pytest.approx(-0.3, abs=0.01) and iv[0] <= point <= iv[1] and iv[1] - iv[0] < 0.05
    assert sf.forecast(fa, fc, 1e8)[0] == pytest.approx(-0.3, abs=0.05)


# -- degenerate fits: parameters at their bounds ----------------------------------------------------------------
def _pure_power_cells(E=0.0, A=8.0, alpha=0.074, ns=(1.2e4, 1e5, 3.3e5, 7.9e5, 2.7e6)):
    """Two seeds per size, mirrored +-0.5% around E + A N^-alpha: each size's mean lies exactly on the law."""
    return {i: sf.Cell(float(n), {0: (E + A * n ** -alpha) * 0.995, 1: (E + A * n ** -alpha) * 1.005})
            for i, n in enumerate(ns)}


def test_fit_at_the_E_bound_is_flagged_and_blocks_forecasts():
    # true E = 0: a pure power law, no flattening; the best fit must sit on the E >= 0 bound
    post = _fit(_pure_power_cells())
    assert post.law.E < 1e-3 * 3.0 and post.law.alpha == pytest.approx(0.074, rel=0.02)
    issues = post.issues()
    assert any("E >= 0 bound" in i for i in issues), issues
    # a well-posed law (clear flattening towards E = 2.9) is not flagged
    pre = _fit(_pure_power_cells(E=2.9, A=40.0, alpha=0.4))
    assert pre.issues() == [] and pre.law.E == pytest.approx(2.9, rel=0.01)
    # the fitted curves cross (the pure power law keeps falling), but no verdict may come from the bound
    co = sf.crossover(pre, post, 1.2e4, 2.7e6, 2.7e8, names=("Pre-LN", "Post-LN"))
    assert co.roots and co.verdict == "not resolvable"
    assert co.text().startswith("not resolvable: Post-LN's fit is degenerate: E is at the E >= 0 bound")
    # measured differences of opposite sign, each decisive, still show a crossover between those two sizes
    meas = [sf.Measured(1.2e4, -0.3, 8.0, 0.01, "s"), sf.Measured(1e5, -0.05, 0.4, 0.7, "m"),
            sf.Measured(2.7e6, +0.3, 9.0, 0.02, "l")]
    co = sf.crossover(pre, post, 1.2e4, 2.7e6, 2.7e8, names=("Pre-LN", "Post-LN"), measured=meas)
    assert co.verdict == "measured crossover"
    assert (
        co.text().startswith("measured crossover between N = 12k and 2.7M")
        and "not resolvable from the fits" in co.text()
    )


def test_exponent_at_its_bound_and_zero_width_intervals_are_flagged():
    # loss that rises with N: the best law in the box is flat (A N^-alpha -> 0, E = the mean level)
    rising = _fit(_pure_power_cells(E=0.0, A=1.0, alpha=-0.05))
    assert rising.law.A * 1.2e4 ** -rising.law.alpha < 1e-3 * 1.5
    assert any("negligible at every trained size" in i for i in rising.issues()), rising.issues()
    flat = sf.FitResult(sf.PowerLaw(E=2.0, A=3.0, alpha=0.0), [], 10, 5, loss_min=4.9, n_min=1e4)
    assert flat.issues() == ["alpha is at its lower bound 0 (the loss does not fall with N in the fit)"]
    # a too-steep law (true alpha 4 > the box's 3): alpha at its upper bound
    steep = _fit(_pure_power_cells(E=2.0, A=1e16, alpha=4.0, ns=(1e3, 2e3, 4e3, 8e3)))
    assert steep.law.alpha >= sf.BOUNDS_EXP[1] - sf.EXP_TOL and any("upper bound 3" in i for i in steep.issues())
    # zero-width interval: every replicate at one value
    law = sf.PowerLaw(E=2.0, A=10.0, alpha=0.3)
    stuck = sf.FitResult(law, [law] * 20, 10, 5, loss_min=2.5, n_min=1e4)
    assert stuck.issues() == ["the bootstrap interval of E, A, alpha has zero width"]
    assert sf.FitResult(law, [sf.PowerLaw(2.0 + 0.01 * k, 10.0, 0.3) for k in range(20)], 10, 5,
                        loss_min=2.5, n_min=1e4).issues() == ["the bootstrap interval of A, alpha has zero width"]


def test_crossover_needs_decisive_measurements_on_both_sides():
    a = sf.PowerLaw(E=2.0, A=10.0, alpha=0.2)
    b = sf.PowerLaw(E=1.5, A=100.0, alpha=0.4)
    n_star = ((10 + math.sqrt(300)) / 200) ** -5
    ns = np.geomspace(1e3, 1e6, 6)
    fa = _fit(_cells(a, ns, range(3), 0.002, np.random.default_rng(3)))
    fb = _fit(_cells(b, ns, range(3), 0.002, np.random.default_rng(4)))
    diffs = [float(a(n) - b(n)) for n in ns]
    assert diffs[0] < 0 < diffs[-1] and ns[0] < n_star < ns[-1]
    decisive = [sf.Measured(float(n), d, 10.0, 1e-4) for n, d in zip(ns, diffs)]
    assert sf.crossover(fa, fb, 1e3, 1e6, 1e8, measured=decisive).verdict == "crossover"
    # the same fits, but every measured difference noise-dominated (p >= 0.05): not decisive
    noise = [sf.Measured(float(n), d, 0.9, 0.5) for n, d in zip(ns, diffs)]
    co = sf.crossover(fa, fb, 1e3, 1e6, 1e8, measured=noise)
    assert co.verdict == "not resolvable" and "significant at no size" in co.text()
    # decisive only on one side of the crossing: still not resolvable
    one_side = [sf.Measured(float(n), d, 10.0, 1e-4 if n < n_star else 0.5) for n, d in zip(ns, diffs)]
    assert sf.crossover(fa, fb, 1e3, 1e6, 1e8, measured=one_side).verdict == "not resolvable"
    # no crossing of the fits and no decisive difference: "no crossover", said to leave the ordering open
    fc = _fit(_cells(sf.PowerLaw(E=2.3, A=10.0, alpha=0.2), ns, range(3), 0.002, np.random.default_rng(5)))
    far = sf.crossover(fa, fc, 1e3, 1e6, 1e8, measured=[sf.Measured(1e3, -0.3, 0.5, 0.6)])
    assert far.verdict == "no crossover" and "which is better is not resolved" in far.text()


def test_welch_p_against_the_closed_form():
    # equal variances and 2 seeds each: Welch's df = 2, where the t distribution's two-sided p = 1 - t/sqrt(2+t^2)
    a, b = [3.0, 3.2], [3.5, 3.7]
    t = 0.5 / math.sqrt(0.02 / 2 + 0.02 / 2)
    assert welch(a, b).p == pytest.approx(1 - t / math.sqrt(2 + t * t), rel=1e-9)
    assert welch([3.0], b) is None
    assert sf.Measured(1.0, 0.5, 5.0, 0.04).decisive and not sf.Measured(1.0, 0.5, 5.0, 0.06).decisive


# -- signal-to-noise -------------------------------------------------------------------------------------------
def test_snr_against_hand_computation():
    a, b = [3.0, 3.2], [3.5, 3.9]
    # means 3.1 and 3.7; sample variances 0.02 and 0.08; pooled sd sqrt(0.05)
    assert sf.seed_snr(a, b) == pytest.approx(0.6 / math.sqrt(0.05))
    # Heineman et al.: signal = |3.1 - 3.7| / 3.4; noise = mean of the runs' sd/mean (population sd)
    run1, run2 = [3.0, 3.1, 3.2], [3.6, 3.8]
    rel1 = math.sqrt(((0.1) ** 2 + 0 + (0.1) ** 2) / 3) / 3.1
    rel2 = 0.1 / 3.7
    assert sf.heineman_snr([3.1, 3.7], [run1, run2]) == pytest.approx((0.6 / 3.4) / ((rel1 + rel2) / 2))
    assert sf.seed_snr([3.0], b) is None and sf.heineman_snr([1.0, 2.0], [[1.0, 1.0]]) is None


# -- the size axis ---------------------------------------------------------------------------------------------
BASE = {"data": {"source": "synthetic:markov?order=1&alphabet=8&length=20000&seed=0"},
        "model": {"context": 16, "width": 32, "heads": 2, "depth": 1},
        "train": {"steps": 4, "batch_size": 2, "lr": 0.003, "warmup_steps": 2, "eval_every": 2, "eval_batches": 1,
                  "log_every": 1, "checkpoint_every": 4}}


def _non_embedding(config: dict) -> int:
    """Independent count: build the model for real on the CPU and sum every parameter but the embeddings."""
    torch.manual_seed(0)
    model = build_model(config_from_dict(config).model)
    return sum(p.numel() for n, p in model.named_parameters() if not n.startswith(("tok_emb", "pos_emb")))


def test_size_grid_expands_with_tokens_per_param():
    sweep = parse_sweep({
        "name": "sz", "base": BASE, "size_grid": {"widths": [32, 64, 96], "aspect": 32, "head_dim": 16},
        "tokens_per_param": 0.5, "seeds": [0, 1],
        "variants": [{"name": "Pre", "set": {"model.placement": "pre"}},
                     {"name": "Post", "set": {"model.placement": "post"}}]})
    assert len(sweep.runs) == 3 * 2 * 2
    shapes = [(r.config["model"]["width"], r.config["model"]["depth"], r.config["model"]["heads"]) for r in sweep.runs]
    assert shapes[0] == (96, 3, 6) and set(shapes) == {(32, 1, 2), (64, 2, 4), (96, 3, 6)}  # largest first
    for r in sweep.runs:
        m = r.config["model"]
        ref = {**BASE, "model": {**BASE["model"], "width": m["width"], "depth": m["depth"], "heads": m["heads"]}}
        n = _non_embedding(ref)  # N from the base config at this size, no variant
        steps = math.ceil(0.5 * n / (2 * 16))
        assert r.config["train"]["steps"] == steps, (m, n)
        assert r.config["train"]["eval_every"] == max(1, round(2 * steps / 4))
        assert r.axes["size"] == f"w{m['width']}-d{m['depth']}" and r.variant.startswith(r.axes["variant"])
        assert r.config["train"]["lr"] == 0.003
    assert parse_sweep(yaml.safe_load(dump_spec(sweep))).hash == sweep.hash  # the stored spec round-trips


def test_sizes_list_and_lr_transfer():
    sweep = parse_sweep({"base": BASE, "sizes": [[32, 1], {"width": 48, "depth": 2, "heads": 3}, [64, 2]],
                         "lr_transfer": {"base_width": 32, "exponent": 1.0}})
    got = {(r.config["model"]["width"], r.config["model"]["depth"]): r.config for r in sweep.runs}
    assert set(got) == {(32, 1), (48, 2), (64, 2)}
    assert got[(48, 2)]["model"]["heads"] == 3 and got[(64, 2)]["model"]["heads"] == 4
    assert got[(64, 2)]["train"]["lr"] == pytest.approx(0.003 * 32 / 64)
    assert all(c["train"]["steps"] == 4 for c in got.values())  # tokens fixed without tokens_per_param


@pytest.mark.parametrize("extra, fragment", [
    ({"sizes": [[32, 1]], "size_grid": {"widths": [32], "aspect": 32}}, "either 'sizes' or 'size_grid'"),
    ({"tokens_per_param": 20}, "needs a size axis"),
    ({"size_grid": {"widths": [40], "aspect": 32}}, "not a multiple of head_dim"),
    ({"sizes": [[32, 1]], "variants": [{"name": "w", "set": {"model.width": 64}}]}, "given by the size axis"),
    ({"sizes": [[32, 1], [32, 1]]}, "same (width, depth)"),
    ({"size_grid": {"widths": [32]}}, "aspect"),
    ({"sizes": [[32, 1]], "lr_transfer": {"exponent": 1}}, "base_width"),
])
def test_bad_size_axis(tmp_path, extra, fragment):
    with pytest.raises(NormlabError, match=None) as e:
        parse_sweep({"base": BASE, **extra})
    assert fragment in str(e.value)
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump({"base": BASE, **extra}))
    assert_bad_input(normlab("compare", str(f), "--out", str(tmp_path / "o"), cache=tmp_path / "c"), fragment)
    assert not (tmp_path / "o").exists()


# -- a stored tiny size sweep and its report section -----------------------------------------------------------
LAWS = {"Pre": sf.PowerLaw(E=2.0, A=10.0, alpha=0.2), "Post": sf.PowerLaw(E=1.5, A=100.0, alpha=0.4)}


def make_size_sweep(d):
    """A tiny size sweep (4 sizes x 2 variants x 2 seeds) stored without training: finals from known laws."""
    sweep = parse_sweep({"name": "tiny-sizes", "base": BASE, "seeds": [0, 1],
                         "sizes": [[16, 1], [32, 1], [48, 2], [64, 3]],
                         "variants": [{"name": "Pre", "set": {"model.placement": "pre"}},
                                      {"name": "Post", "set": {"model.placement": "post"}}]})
    store = register_sweep(d, sweep)
    finals = {}
    for r in sweep.runs:
        n = _non_embedding(r.config)
        final = float(LAWS[r.axes["variant"]](n)) * (1.0 + (0.004 if r.seed else -0.004))
        finals[r.run_id] = (r.axes["variant"], r.axes["size"], r.seed, final, n)
        run_dir = d / "runs" / r.run_id
        run_dir.mkdir(parents=True)
        curve = [final + 0.01 * k for k in (4, 3, 2, 1, 0)]  # the last 5 validation evaluations
        recs = [{"step": s + 1, "loss": 2.0, "val_bpb": v} for s, v in enumerate(curve)]
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in recs))
        summary = {"status": "completed", "step": 5, "steps": 5, "val_bpb": final, "best_val_bpb": final,
                   "params": n + 1000, "tokens_per_s": 1000.0, "elapsed_s": 1.0}
        record(store, d, r.run_id, summary, peak_mem_mb=1.0)
    return finals


def test_scaling_section_renders_from_a_stored_tiny_sweep(tmp_path):
    d = tmp_path / "sizes"
    finals = make_size_sweep(d)
    proc = normlab("scaling", str(d), "--json", cache=tmp_path / "c")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["lr_rule"].startswith("fixed") and out["tokens_rule"].startswith("fixed")
    by_name = {v["variant"]: v for v in out["variants"]}
    assert set(by_name) == {"Pre", "Post"}
    for name, v in by_name.items():
        assert [p["params"] for p in v["points"]] == sorted(p["params"] for p in v["points"])
        for p in v["points"]:
            stored = [f for vn, size, s, f, n in finals.values() if vn == name and size == p["size"]]
            assert p["mean"] == pytest.approx(sum(stored) / 2) and p["params"] == next(
                n for vn, size, s, f, n in finals.values() if vn == name and size == p["size"])
        # +-0.4% around the law at every size: the fit recovers the exponent closely
        assert v["fit"]["params"]["alpha"] == pytest.approx(LAWS[name].alpha, rel=0.1)
    cmp = out["comparisons"][0]
    assert {cmp["a"], cmp["b"]} == {"Pre", "Post"}
    sign = 1 if cmp["a"] == "Pre" else -1
    last = cmp["observed"][-1]
    pre = [f for vn, size, s, f, n in finals.values() if vn == "Pre" and size == last["size"]]
    post = [f for vn, size, s, f, n in finals.values() if vn == "Post" and size == last["size"]]
    assert last["diff"] == pytest.approx(sign * (sum(pre) / 2 - sum(post) / 2))
    assert last["seed_snr"] == pytest.approx(sf.seed_snr(pre, post))
    assert [f["factor"] for f in cmp["forecast"]] == [10, 100]
    assert cmp["crossover"]["verdict"] in ("crossover", "forecast crossover", "measured crossover", "no crossover",
                                           "not resolvable")
    assert all(v["fit"]["issues"] == [] and not v["fit"]["degenerate"] for v in out["variants"])
    assert all(f["resolvable"] for f in cmp["forecast"])
    for o in cmp["observed"]:  # the stored seeds are +-0.4% around the laws: Welch's p from them
        pre = [f for vn, size, s, f, n in finals.values() if vn == "Pre" and size == o["size"]]
        post = [f for vn, size, s, f, n in finals.values() if vn == "Post" and size == o["size"]]
        assert o["welch_p"] == pytest.approx(ttest_ind(pre, post, equal_var=False).pvalue, rel=1e-9) and o[
            "decisive"
        ] == (o["welch_p"] < 0.05)

    rep = normlab("report", str(d), "--json", cache=tmp_path / "c")
    assert rep.returncode == 0, rep.stderr
    md = (d / "report.md").read_text()
    html = (d / "report.html").read_text()
    assert "## Scaling" in md and "### Forecasts and crossovers" in md
    assert "![loss vs parameters](report_scaling.png)" in md
    assert "<h2>Scaling</h2>" in html and "data:image/png;base64," in html
    assert (d / "report_scaling.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"{last['diff']:+.4f}" in md


def test_scaling_bad_input(tmp_path):
    assert_bad_input(normlab("scaling", str(tmp_path / "none"), cache=tmp_path / "c"), "does not exist")
    from tests.test_report import make_sweep

    (tmp_path / "flat").mkdir()
    make_sweep(tmp_path / "flat", extras=False)
    assert_bad_input(normlab("scaling", str(tmp_path / "flat"), cache=tmp_path / "c"), "not a size sweep")


# -- the crossover rule under the family's correction (issue 26) --------------------------------------------------
# docs/scaling.md's stored per-seed finals (seed 0, seed 1) of the fixed-aspect preset run, per size
STORED = {
    "Pre-LN": [(3.7721, 3.7095), (3.3478, 3.3178), (3.1245, 3.2153), (3.0903, 3.0342), (3.0622, 3.1300)],
    "Peri-LN": [(3.6600, 3.6986), (3.3914, 3.3960), (3.1830, 3.1914), (3.0898, 3.0583), (3.0966, 2.9804)],
    "Post-LN": [(3.9684, 4.0007), (3.6187, 3.5996), (3.3203, 3.2599), (3.0071, 3.0395), (2.7302, 2.7563)],
}
STORED_N = (12_480, 98_944, 333_120, 788_736, 2_659_200)


def test_a_sign_change_significant_only_before_holm_is_not_a_crossover():
    from normlab.stats.multiplicity import holm

    pairs = [("Pre-LN", "Peri-LN"), ("Pre-LN", "Post-LN"), ("Peri-LN", "Post-LN")]
    raw = {pr: [welch(list(STORED[pr[0]][i]), list(STORED[pr[1]][i])).p for i in range(5)] for pr in pairs}
    flat = [p for pr in pairs for p in raw[pr]]
    adj = holm(flat)
    q = {pr: adj[5 * k:5 * k + 5] for k, pr in enumerate(pairs)}
    # the page's p-values reproduce; under Holm over the sweep's 15 tests none stays below 0.05
    assert [raw[pairs[1]][i] for i in (0, 1, 4)] == pytest.approx([0.041, 0.0079, 0.037], abs=1e-3)  # 4-digit finals
    assert min(adj) == pytest.approx(0.11, abs=0.005) and min(adj) > 0.05
    diffs = [sum(STORED["Pre-LN"][i]) / 2 - sum(STORED["Post-LN"][i]) / 2 for i in range(5)]
    fa, fb = _fit(_pure_power_cells(E=2.9, A=40.0, alpha=0.4)), _fit(_pure_power_cells())  # Post-LN: E at the bound
    unadjusted = [sf.Measured(float(n), d, 5.0, p, f"s{i}") for i, (n, d, p) in
                  enumerate(zip(STORED_N, diffs, raw[pairs[1]]))]
    adjusted = [sf.Measured(float(n), d, 5.0, p, f"s{i}", a, "holm") for i, (n, d, p, a) in
                enumerate(zip(STORED_N, diffs, raw[pairs[1]], q[pairs[1]]))]
    before = sf.crossover(fa, fb, 1.2e4, 2.7e6, 2.7e8, names=("Pre-LN", "Post-LN"), measured=unadjusted)
    after = sf.crossover(fa, fb, 1.2e4, 2.7e6, 2.7e8, names=("Pre-LN", "Post-LN"), measured=adjusted)
    assert before.verdict == "measured crossover"   # what the page printed
    assert after.verdict == "not resolvable" and not any(m.decisive for m in adjusted)
    assert "holm 0.11" in adjusted[1].text()
    # a flip that survives the correction is still stated
    strong = [sf.Measured(float(n), d, 9.0, 1e-4, f"s{i}", 1e-3, "holm") for i, (n, d) in
              enumerate(zip(STORED_N, [-0.3, -0.3, 0.0, 0.3, 0.3]))]
    assert sf.crossover(fa, fb, 1.2e4, 2.7e6, 2.7e8, measured=strong).verdict == "measured crossover"


def test_the_stored_sweep_reports_adjusted_p_and_names_its_confounds(tmp_path):
    from normlab.report.analysis import load
    from normlab.report.scaling import analyse, to_json
    from normlab.stats.multiplicity import holm

    d = tmp_path / "sizes"
    make_size_sweep(d)   # depth 1-3 with width, one lr, a fixed token budget
    out = to_json(analyse(load(d), replicates=20))
    assert out["correction"] == "holm"
    assert [c["kind"] for c in out["confounds"]] == ["depth_with_width", "one_lr", "low_tokens_per_param",
                                                     "tokens_per_param_varies"]
    obs = [o for c in out["comparisons"] for o in c["observed"]]
    assert [o["p_adj"] for o in obs] == pytest.approx(holm([o["welch_p"] for o in obs]))
    assert all(o["decisive"] == (o["p_adj"] < 0.05) for o in obs)
    cmp = out["comparisons"][0]
    assert cmp["confounds"] == [c["kind"] for c in out["confounds"]]
    if cmp["crossover"]["verdict"] != "not resolvable":
        assert "confounded with size: depth varies with width" in cmp["crossover"]["text"]
    assert any(s.startswith("Design confounds (named next to every crossover and forecast): depth varies")
               for s in out["summary"])


def test_a_fixed_depth_best_of_grid_sweep_names_only_its_token_ratio(tmp_path):
    """The redesigned design through the whole analysis: fixed depth, an lr_grid (the worse rate stored 0.3 higher,
    so best-of-grid must pick the other), tokens_per_param: only the stated low ratio is a confound."""
    from normlab.report.analysis import load
    from normlab.report.scaling import analyse, to_json

    d = tmp_path / "fixed"
    sweep = parse_sweep({"name": "fixed-depth", "base": BASE, "seeds": [0, 1], "lr_grid": [0.001, 0.01],
                         "sizes": [[16, 2], [32, 2], [48, 2], [64, 2]], "tokens_per_param": 0.5,
                         "variants": [{"name": "Pre", "set": {"model.placement": "pre"}},
                                      {"name": "Post", "set": {"model.placement": "post"}}]})
    store = register_sweep(d, sweep)
    for r in sweep.runs:
        n = _non_embedding(r.config)
        name = r.axes["variant"]
        final = float(LAWS[name](n)) * (1.0 + (0.004 if r.seed else -0.004))
        final += 0.3 if r.config["train"]["lr"] == (0.01 if name == "Pre" else 0.001) else 0.0
        run_dir = d / "runs" / r.run_id
        run_dir.mkdir(parents=True)
        (run_dir / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 2.0, "val_bpb": final}) + "\n")
        record(store, d, r.run_id, {"status": "completed", "step": 1, "steps": 1, "val_bpb": final,
                                    "best_val_bpb": final, "params": n, "tokens_per_s": 1.0, "elapsed_s": 1.0},
               peak_mem_mb=1.0)
    out = to_json(analyse(load(d), replicates=20))
    assert out["lr_rule"].startswith("best-of-grid")
    assert [c["kind"] for c in out["confounds"]] == ["low_tokens_per_param"]
    lrs = {v["variant"]: {p["lr"] for p in v["points"]} for v in out["variants"]}
    assert lrs == {"Pre": {0.001}, "Post": {0.01}}
    assert all(p["lrs_tried"] == 2 for v in out["variants"] for p in v["points"])
    # tokens_per_param gives one token budget per size (D = r N): L(N) is fitted along that rule, not refused
    # (a refusal left the redesigned preset with no fit, forecast or crossover at all)
    for v in out["variants"]:
        assert v["fit_error"] is None and v["fit"] is not None
        ns = np.array([p["params"] for p in v["points"]], dtype=float)
        law = LAWS[v["variant"]]
        fitted = v["fit"]["params"]
        pred = fitted["E"] + fitted["A"] * ns ** -fitted["alpha"]
        assert np.allclose(pred, law.E + law.A * ns ** -law.alpha, rtol=0.01)  # the generating law, +-0.4% noise
