#!/usr/bin/env python
"""The family-wise error of normlab's seeds-until-decided procedure, simulated under the null.

Each simulated sweep has a baseline and ``m`` variants with no true difference: per seed a stand-in metric
``x_v ~ N(0, 1)``; at each look (``--looks``, seeds so far) every variant is compared with the baseline by the paired
t statistic of the first ``n`` seeds, mapped to the normal scale (normlab.stats.sequential.t_to_z), and the
group-sequential Holm procedure (``sequential_holm``) rejects where it crosses the boundary of its level. The
family-wise error is the share of sweeps with any rejection at any look, reported with its Monte-Carlo standard
error, for the normal-theory Lan-DeMets boundaries (``HolmLevels.build``) and the t-based boundaries the looks of
a real sweep use (``HolmLevels.build_t``, calibrated on draws independent of these: another generator seed).
``--partial`` adds one variant with a true effect of 2 SD (rejected early, so Holm raises the others' level): the
error is then counted over the true nulls only.

    python benchmarks/sequential_error.py [--looks 2,4,6,8] [--m 1,3] [--runs 200000] [--alpha 0.05] [--partial]
        [--json]

200k runs give a standard error of about 0.0005 at alpha 0.05; the unit test (tests/report/test_sequential.py) runs a
smaller simulation with a tolerance.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time

import numpy as np

from normlab.stats.sequential import HolmLevels, paired_z, sequential_holm

CHUNK = 25_000


def familywise_error(looks: list[int], m: int, runs: int, levels: HolmLevels, *, seed: int, partial: bool
                     ) -> tuple[float, float]:
    """``(error rate, Monte-Carlo SE)`` over ``runs`` simulated sweeps (drawn in chunks of ``CHUNK``)."""
    rng = np.random.default_rng(seed)
    effects = np.array([0.0] + ([2.0] if partial else []) + [0.0] * m)
    nulls = slice(2 if partial else 1, None)
    hits = 0
    done = 0
    while done < runs:
        s = min(CHUNK, runs - done)
        x = rng.standard_normal((s, looks[-1], len(effects))) + effects
        d = x[:, :, 1:] - x[:, :, :1]
        z = np.stack([paired_z(d[:, :n, :]) for n in looks], axis=1)
        rej = sequential_holm(z, levels)
        hits += int((rej[:, nulls.start - 1:] >= 0).any(axis=1).sum())
        done += s
    p = hits / runs
    return p, math.sqrt(p * (1 - p) / runs)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="benchmarks/sequential_error.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--looks", default="2,4,6,8", help="seeds at each look, increasing (default 2,4,6,8)")
    ap.add_argument("--m", default="1,3", help="family sizes to simulate (default 1,3)")
    ap.add_argument("--runs", type=int, default=200_000, help="simulated sweeps per setting (default 200000)")
    ap.add_argument("--alpha", type=float, default=0.05)
    ap.add_argument("--partial", action="store_true", help="add one variant with a true 2-SD effect")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    try:
        looks = [int(x) for x in a.looks.split(",")]
        ms = [int(x) for x in a.m.split(",")]
    except ValueError:
        print("--looks and --m take comma-separated integers, e.g. --looks 2,4,6,8 --m 1,3", file=sys.stderr)
        return 2
    if looks[0] < 2 or any(b <= c for c, b in zip(looks, looks[1:])) or min(ms) < 1 or a.runs < 1 \
            or not 0 < a.alpha < 1:
        print("--looks must increase strictly from >= 2 seeds, --m >= 1, --runs >= 1, 0 < --alpha < 1",
              file=sys.stderr)
        return 2
    rows = []
    for m in ms:
        m_all = m + (1 if a.partial else 0)
        t0 = time.perf_counter()
        normal = HolmLevels.build([n / looks[-1] for n in looks], a.alpha, m_all)
        tbased = HolmLevels.build_t(looks, looks[-1], a.alpha, m_all)
        for name, lv in (("normal-theory", normal), ("t-based", tbased)):
            p, se = familywise_error(looks, m, a.runs, lv, seed=a.seed, partial=a.partial)
            rows.append({"m": m, "partial": a.partial, "boundaries": name, "looks": looks, "runs": a.runs,
                         "alpha": a.alpha, "familywise_error": p, "se": se,
                         "first_step_bounds": lv.bounds[m_all]})
        rows[-1]["seconds"] = time.perf_counter() - t0
    if a.json:
        print(json.dumps(rows))
        return 0
    print(f"looks {looks}, alpha {a.alpha:g}, {a.runs:,} simulated sweeps per row" + (", one true 2-SD effect added"
                                                                                      if a.partial else ""))
    print(f"{'m':>3} {'boundaries':<14} {'family-wise error':>18} {'± SE':>8}  first Holm step's |z| boundaries")
    for r in rows:
        b = ", ".join(f"{c:.3f}" for c in r["first_step_bounds"])
        print(f"{r['m']:>3} {r['boundaries']:<14} {r['familywise_error']:>18.4f} {r['se']:>8.4f}  {b}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
