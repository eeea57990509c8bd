"""Budgets of ``normlab claims``: model shapes, steps and seeds.

Costs (measured 2026-11-21, 1 thread per run, 2 workers, width 64, context 64, batch 16, pystdlib bytes, on a
2-core machine shared with other jobs, load average ~5): 7-9k tokens/s per worker for a 4-block model, 4-6k
for an 8-block model; ``quick`` (3 seeds x 250 steps, 33 runs, deep = 8 blocks) took about 14 min wall under that
load, so about 7 min on an idle machine. ``full`` (5 seeds x 500 steps, 55 runs, deep = 12 blocks) scales that
by 5/3 x 2 (x 1.5 for the deep half): about 60 min under the same load, ~30 min idle (estimate; its first
12-block runs took 115-270 s each at 2-4.4k tokens/s under load ~5).
``tiny`` is for the tests: a few seconds.
The full suite has 13 shallow/deep variants (``ln_untied`` and ``softplus_lssar`` added: 65 runs at
5 seeds) plus the learning-rate grid (175 runs) and the surgery measurements. Measured 2026-11-23 on the shared
2-core machine (load average 9-12, the claims processes at nice 10, 2 workers): a quick-budget 8-block run took
about 6 min wall, a 4-block one about 3 min; a full-budget 12-block run at nice 19 reached step 250 of 500 in about
11 min. From the 2026-11-21 costs (55 runs ~3k CPU-s; the demo's 6-block runs ~23 CPU-s per 120 steps) a
from-scratch ``full`` run was estimated at roughly 10-11k CPU-seconds. Measured 2026-11-24: ``normlab claims --budget
full --workers 2`` from an empty directory trained 240 runs and measured 24 claims in 106.7 min wall on the shared
2-core machine, its two workers at nice 5 getting about half a core each (37 CPU-min per worker after 74 min), so
roughly 50-55 min on 2 idle cores: already above a ~30-minute target at width 64, so the width was not
raised (docs/claims.md states each claim's width, blocks, steps and tokens).

Learning-rate sweep claims (``grid_*``): 7 variants x ``grid_lrs`` x seeds runs of a ``grid_depth``-block model for
``grid_steps`` steps. ``quick``: 7 x 5 x 3 = 105 runs of 120 steps, each exactly a run of the demo preset (same
model, lr grid 1e-3 .. 3e-1, steps, validation), so ``normlab claims --reuse runs/demo-quick-<hash>`` copies the 50
runs the demo already trained for seeds 0 and 1 instead of training them; ``full``: 7 x 5 x 5 = 175 runs of 200
steps (run 2026-11-24, above). Since the claims' fixed rules (2026-11-25) ``dyt-vs-ln`` trains DyT and its LayerNorm
baseline on the grid too
(``grid_dyt``, ``grid_ln_untied``: 2 x 5 x 5 = 50 more full-budget runs of 6 blocks x 200 steps, about a fifth
more of the full budget's cost by the 2026-11-24 rates; not measured). The paper's grid is 3e-4 .. 3e-1 in factors
of ~3 over much longer runs; these grids are coarser and shorter to fit a CPU.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from normlab.errors import NormlabError


@dataclass(frozen=True)
class Budget:
    name: str
    source: str
    seeds: int
    steps: int
    batch_size: int
    context: int
    width: int
    heads: int
    depth: int          # the "shallow" model: norm / attention comparisons
    deep_depth: int     # depth studies: variance growth, Mix-LN gradients, Post-LN without warm-up
    warmup_steps: int
    lr: float
    eval_batches: int
    diag_every: int     # training-time per-block gradient norms (Mix-LN claim)
    sample_sequences: int   # post-hoc diagnostics sample (validation windows)
    extrap_factors: tuple[float, ...]
    extrap_windows: int     # windows of the largest factor's context scored by the extrapolation claim
    # learning-rate sweep claims (Wortsman et al. 2023): every grid variant runs at each of grid_lrs
    grid_lrs: tuple[float, ...] = (1e-3, 1e-2, 1e-1)
    grid_depth: int = 6
    grid_steps: int = 120
    grid_warmup: int = 12
    grid_eval_batches: int = 24

    def to_dict(self) -> dict:
        return asdict(self)


BUDGETS: dict[str, Budget] = {
    "tiny": Budget("tiny", "synthetic:markov?order=2&alphabet=16&length=300000&seed=0", seeds=2, steps=8,
                   batch_size=4, context=32, width=32, heads=2, depth=2, deep_depth=3, warmup_steps=2, lr=3e-3,
                   eval_batches=2, diag_every=2, sample_sequences=4, extrap_factors=(1, 4), extrap_windows=2,
                   grid_lrs=(1e-3, 1e-2, 30.0), grid_depth=2, grid_steps=8, grid_warmup=2, grid_eval_batches=2),
    "quick": Budget("quick", "pystdlib", seeds=3, steps=250, batch_size=16, context=64, width=64, heads=4, depth=4,
                    deep_depth=8, warmup_steps=25, lr=3e-3, eval_batches=16, diag_every=25, sample_sequences=16,
                    extrap_factors=(1, 16), extrap_windows=4,
                    grid_lrs=(0.001, 0.00416, 0.0173, 0.0721, 0.3)),
    "full": Budget("full", "pystdlib", seeds=5, steps=500, batch_size=16, context=64, width=64, heads=4, depth=4,
                   deep_depth=12, warmup_steps=50, lr=3e-3, eval_batches=32, diag_every=50, sample_sequences=32,
                   extrap_factors=(1, 2, 4, 8, 16), extrap_windows=8,
                   grid_lrs=(0.001, 0.00416, 0.0173, 0.0721, 0.3), grid_depth=6, grid_steps=200, grid_warmup=20),
}


def get_budget(name: str) -> Budget:
    if name not in BUDGETS:
        raise NormlabError(f"unknown budget '{name}'; allowed: {', '.join(BUDGETS)}")
    return BUDGETS[name]
