"""normlab.report.scaling_evidence: the stored scaling points against docs/scaling.md (the numbers ``normlab
scaling`` printed) and the closed-form parameter count, the packaged fits against that page's fit table and against
a rebuild, and when the fits reach a model (``reach``)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

from normlab.errors import NormlabError
from normlab.report import scaling_fit as sf
from normlab.report.scaling_evidence import build_scaling_evidence, cells, load_scaling_evidence, reach

DOCS = Path(__file__).resolve().parents[2] / "docs"
POINTS = DOCS / "scaling-2026-11-26.json"
SECTION = "## A real run of the `scaling` preset (72 of 72 runs)"


def _page() -> str:
    return (DOCS / "scaling.md").read_text().split(SECTION)[1]


def test_points_are_the_pages_per_seed_finals_with_closed_form_n_and_the_presets_tokens():
    pts = json.loads(POINTS.read_text())
    for s in pts["sizes"]:  # Pre-LN GPT, no biases, MLP ratio 4: 12 L d^2 + (2 L + 1) 2 d
        assert s["params"] == 12 * s["depth"] * s["width"] ** 2 + (2 * s["depth"] + 1) * 2 * s["width"]
        assert s["tokens"] == math.ceil(2 * s["params"] / (16 * 64)) * 16 * 64  # tokens_per_param: 2, 16 x 64
    table = _page().split("Per size, difference")[0]
    for name, row in pts["variants"].items():
        line = next(ln for ln in table.splitlines() if ln.startswith(f"| {name} |"))
        cells = [c.strip() for c in line.strip("|").split("|")][1:]
        for s, cell in zip(pts["sizes"], cells):
            r = row[s["size"]]
            m = re.fullmatch(r"([\d.]+) / ([\d.]+) \(\*\*([\d.]+)\*\*, lr ([\d.]+)\)", cell)
            s0, s1, mean, lr = map(float, m.groups())
            assert (r["seeds"]["0"], r["seeds"]["1"], r["lr"]) == (s0, s1, lr), (name, s["size"], cell)
            assert (s0 + s1) / 2 == pytest.approx(mean, abs=1e-4)  # the page's mean of the unrounded finals


def test_packaged_fits_match_the_pages_fit_table_and_the_rebuild():
    ev = load_scaling_evidence()
    fits = _page().split("**Fits**")[1].split("Verdicts")[0]
    for name, f in ev["fits"].items():
        m = re.search(rf"\| {re.escape(name)} \| [^|]+ \| ([\d.]+) \[([\d.]+), ([\d.]+)\] \| ([\d.]+) \[([\d.]+), "
                      rf"([\d.]+)\] \| ⚠ degenerate", fits)
        a, a_lo, a_hi, al, al_lo, al_hi = map(float, m.groups())
        # refitted from 4-decimal points: close to the printed fit, not identical (module docstring)
        assert f["params"]["A"] == pytest.approx(a, rel=0.02)
        assert f["ci95"]["A"] == pytest.approx([a_lo, a_hi], rel=0.02)
        assert f["params"]["alpha"] == pytest.approx(al, abs=0.002)
        assert f["ci95"]["alpha"] == pytest.approx([al_lo, al_hi], abs=0.002)
        assert f["degenerate"] and f["issues"][0].startswith("E is at the E >= 0 bound")
    assert (ev["n_min"], ev["n_max"], ev["tokens_per_param"]) == (49_728, 444_096, 2)
    rebuilt = build_scaling_evidence(json.loads(POINTS.read_text()), points_name=POINTS.name, replicates=12)
    for name, f in rebuilt["fits"].items():  # the point fit does not depend on the bootstrap
        got, want = f["params"], ev["fits"][name]["params"]
        tol = _stopping_tolerance(name, want)
        stale = ("normlab/evidence/scaling.json is stale: python -m normlab.report.scaling_evidence "
                 "docs/scaling-2026-11-26.json normlab/evidence/scaling.json")
        assert abs(math.log(got["A"] / want["A"])) <= tol["a"], (name, got, want, tol, stale)
        assert abs(got["alpha"] - want["alpha"]) <= tol["alpha"], (name, got, want, tol, stale)
        assert abs(got["E"] - want["E"]) <= tol["E"], (name, got, want, tol, stale)
    assert {k: v for k, v in rebuilt.items() if k not in ("fits", "replicates")} == \
        {k: v for k, v in ev.items() if k not in ("fits", "replicates")}


def _stopping_tolerance(name: str, params: dict) -> dict[str, float]:
    """How far two fits of one variant may lie apart when each is where L-BFGS-B stopped, on whatever CPU.

    Another x86-64 CPU changes only rounding (numpy's exp/log take another SIMD path, OpenBLAS's lstsq in the
    starting points another kernel: last-bit differences), but L-BFGS-B's iterates amplify those: it stops where
    an iteration lowers the objective by less than ``ftol = factr * eps = 1e7 * 2.2e-16`` of it (scipy's default),
    so its answer is a point of the level set ``f <= f* (1 + ftol)``, not the minimum (measured: a relative 1e-9
    change of the starting points moves A by ~1e-6 relative; the test once allowed 1e-6 and failed on a Xeon).
    Near the minimum ``f - f* = dx' H dx / 2``, so within that set a free parameter ``x_i`` moves by at most
    ``sqrt(2 ftol f (H^-1)_ii)``; two stopping points (packaged, rebuilt) lie at most twice that apart. The free
    parameters of these degenerate fits are ``a = log A`` and ``alpha`` (``H``: their 2x2 block, by central
    differences of the analytic gradient); ``e = log E`` is at the flat ``E >= 0`` bound, where the objective
    changes by ``E`` times ~1 and moves the fitted curve by ``dE / L``: it is allowed the curve's change that
    ``a`` is allowed, ``dE <= tol_a * L_min``. Nothing here depends on the CPU, only on the stopping rule."""
    c = cells(json.loads(POINTS.read_text()), name)
    ns, _, ys = sf._resample(c, {k: sorted(x.losses) for k, x in c.items()})
    delta = sf.huber_delta(c)
    feats, y = np.log(ns)[:, None], np.log(ys)
    x = np.array([math.log(params["E"]), math.log(params["A"]), params["alpha"]])
    h = np.empty((2, 2))
    for i in (1, 2):
        step = np.zeros(3)
        step[i] = 1e-6
        grad = [sf._objective(x + sign * step, feats, y, delta)[1] for sign in (1, -1)]
        h[i - 1] = (grad[0] - grad[1])[1:] / 2e-6
    inv = np.linalg.inv((h + h.T) / 2)
    f = sf._objective(x, feats, y, delta)[0]
    ftol = 1e7 * np.finfo(float).eps
    tol_a, tol_alpha = (2 * math.sqrt(2 * ftol * f * inv[i, i]) for i in (0, 1))
    return {"a": tol_a, "alpha": tol_alpha, "E": tol_a * min(ys)}


def _ev(degenerate: bool = False) -> dict:
    return {"n_min": 1_000, "n_max": 100_000, "horizon": 100.0, "tokens_per_param": 20,
            "fits": {"a": {"degenerate": degenerate, "issues": ["E is at the E >= 0 bound"] if degenerate else []}}}


@pytest.mark.parametrize("params, tokens, degenerate, want, why", [
    (5_000_000, 100_000_000, False, True, None),            # 50x the largest, 20 tokens per parameter
    (10_000_000, 200_000_000, False, True, None),           # exactly the 100x horizon
    (10_000_001, 200_000_020, False, False, "outside the fits' range"),
    (5_000_000, 25_000_000, False, False, "the fits are along 20 tokens per parameter, yours is 5"),
    (5_000_000, 100_000_000, True, False, "degenerate"),
    (500, 10_000, False, False, "outside the fits' range"),  # below the smallest fitted size
])
def test_reach_needs_a_sound_fit_the_horizon_and_the_same_tokens_per_parameter(params, tokens, degenerate, want,
                                                                                why):
    r = reach(params, tokens, _ev(degenerate))
    assert r["reaches_any"] is want and r["reaches"] == {"a": want}
    assert r["params_over_largest"] == params / 100_000 and r["tokens_per_param"] == tokens / params
    assert r["far"] is (not 0.1 <= params / 100_000 <= 10)  # 10x either way
    assert (why is None and not r["why_not"]) or any(why in w for w in r["why_not"])


def test_points_of_another_format_are_refused():
    with pytest.raises(NormlabError, match="not normlab scaling points"):
        build_scaling_evidence({"format": "x"}, points_name="p.json")
