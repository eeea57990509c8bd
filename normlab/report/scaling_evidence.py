"""The scaling fits ``normlab advise`` reads, packaged: ``L(N) = E + A N^-alpha`` per variant, refitted from a stored
size sweep's per-seed final losses, with where the points came from.

``normlab/evidence/scaling.json`` ships inside the package (an installed wheel has no docs/), generated from the
points docs/ holds (``docs/scaling-*.json``, format ``normlab-scaling-points-v1``: per variant and size, the final
validation bits/byte of each seed at its best learning rate, N and tokens) by::

    python -m normlab.report.scaling_evidence docs/scaling-2026-11-26.json normlab/evidence/scaling.json

The fit is ``normlab scaling``'s own (``normlab.report.scaling_fit.fit_cells``: Hoffmann et al. 2022, "Training
Compute-Optimal Large Language Models", App. D.2 -- Huber loss of log-loss residuals, L-BFGS -- with a percentile
bootstrap over seeds, 400 replicates, draws from ``numpy.random.default_rng(0)`` as ``normlab scaling`` draws
them). Refitted from the points' 4 decimals, the parameters come out close to what ``normlab scaling`` printed
for that sweep, not identical (``tests/report/test_scaling_evidence.py`` checks them against docs/scaling.md's fit table
within 2% in A and 0.002 in alpha, and the rebuild within what the optimiser's stopping rule leaves open). A fit is
usable beyond its trained sizes only when it is not degenerate (``fit_issues``), and only up to ``HORIZON`` x its
largest size (the forecast range of docs/scaling.md).
"""

from __future__ import annotations

import json
import sys
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from normlab.errors import NormlabError
from normlab.io import loads_json, read_json
from normlab.report import scaling_fit as sf

FORMAT = "normlab-scaling-evidence-v1"
POINTS_FORMAT = "normlab-scaling-points-v1"
REPLICATES = 400  # as normlab.report.scaling.REPLICATES
HORIZON = 100.0  # forecasts reach 100x the largest trained size (normlab.report.scaling.FACTORS)
KEEP = ("command", "date", "corpus", "metric", "question", "tokens_per_param", "context", "batch_size", "lr_rule",
        "source")


def cells(points: dict[str, Any], variant: str) -> dict[str, sf.Cell]:
    """One variant's ``{size: Cell(N, {seed: final loss})}`` from a points document."""
    sizes = {s["size"]: s for s in points["sizes"]}
    return {k: sf.Cell(float(sizes[k]["params"]), {int(seed): float(v) for seed, v in row["seeds"].items()},
                       float(sizes[k]["tokens"]))
            for k, row in points["variants"][variant].items()}


def build_scaling_evidence(points: dict[str, Any], *, points_name: str, replicates: int = REPLICATES
                           ) -> dict[str, Any]:
    """Per variant of ``points``: the ``L(N)`` fit, its 95% bootstrap intervals, whether it is degenerate (and
    why), and the fitted range of N and tokens; with the points' provenance."""
    if points.get("format") != POINTS_FORMAT:
        raise NormlabError(f"{points_name}: not normlab scaling points (format {points.get('format')!r}, "
                           f"expected {POINTS_FORMAT!r})")
    seeds = {s["size"]: sorted({int(k) for row in points["variants"].values() for k in row[s["size"]]["seeds"]})
             for s in points["sizes"]}
    draws = sf.seed_draws(seeds, replicates, np.random.default_rng(0))
    fits = {}
    for name in points["variants"]:
        fit = sf.fit_cells(cells(points, name), draws)
        fits[name] = {"params": fit.law.params(), "ci95": {k: fit.interval(k) for k in fit.law.params()},
                      "degenerate": bool(fit.issues()), "issues": fit.issues(), "huber_delta": fit.delta,
                      "n_sizes": fit.n_sizes}
    ns = [s["params"] for s in points["sizes"]]
    toks = [s["tokens"] for s in points["sizes"]]
    return {"format": FORMAT, "points": points_name, **{k: points.get(k) for k in KEEP},
            "n_min": min(ns), "n_max": max(ns), "tokens_min": min(toks), "tokens_max": max(toks),
            "horizon": HORIZON, "replicates": replicates, "fits": fits}


def load_scaling_evidence() -> dict[str, Any]:
    """The packaged scaling fits (``normlab/evidence/scaling.json``)."""
    data = loads_json(resources.files("normlab").joinpath("evidence", "scaling.json").read_text(encoding="utf-8"),
                      "normlab/evidence/scaling.json")  # the bounded reader (depth, digits)
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise NormlabError("normlab/evidence/scaling.json is not normlab scaling evidence; reinstall normlab")
    return data


def reach(target_params: int, target_tokens: int, ev: dict[str, Any]) -> dict[str, Any]:
    """Whether the packaged fits reach a model of ``target_params`` non-embedding parameters trained on
    ``target_tokens`` tokens: a fit reaches it when it is not degenerate, the model is within ``horizon`` x the
    largest fitted N (and not below the smallest), and its tokens per parameter are within 2x of the ratio the fit
    was measured along (an ``L(N)`` fit at ``D = r N`` is a curve for that ``r`` only)."""
    factor = target_params / ev["n_max"]
    tpp = target_tokens / target_params
    ratio = ev.get("tokens_per_param")
    in_range = ev["n_min"] <= target_params <= ev["horizon"] * ev["n_max"]
    same_line = ratio is not None and 0.5 <= tpp / ratio <= 2.0
    per = {name: bool(not f["degenerate"] and in_range and same_line) for name, f in ev["fits"].items()}
    why = []
    bad = [name for name, f in ev["fits"].items() if f["degenerate"]]
    if bad:
        who = f"all {len(bad)} fits are" if len(bad) == len(ev["fits"]) else f"the fit of {', '.join(bad)} is"
        why.append(f"{who} degenerate ({bad[0]}'s: {ev['fits'][bad[0]]['issues'][0]}), so they forecast nothing "
                   "beyond the trained sizes")
    if not in_range:
        why.append(f"your model is outside the fits' range (N {ev['n_min']:,}-{ev['n_max']:,}, forecasts up to "
                   f"{ev['horizon']:g}x the largest)")
    if not same_line:
        why.append(f"the fits are along {ratio:g} tokens per parameter, yours is {tpp:.3g}")
    return {"params_over_largest": factor, "far": factor > 10.0 or factor < 0.1, "tokens_per_param": tpp,
            "reaches": per, "reaches_any": any(per.values()), "why_not": why}


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m normlab.report.scaling_evidence POINTS.json OUT.json", file=sys.stderr)
        return 2
    src, out = map(Path, argv)
    data = build_scaling_evidence(read_json(src), points_name=src.name)
    out.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
