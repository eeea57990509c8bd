"""Budgets of ``normlab claims``: model shapes, steps and seeds (definitions; what a run of the suite cost is
measured by that run: its ``claims.json`` records the wall time and the runs it trained, and docs/claims.md prints
them).

- ``tiny``: the tests' budget, a synthetic Markov corpus and a few steps (seconds);
- ``quick``: 3 seeds x 250 steps on pystdlib, depth studies at 8 blocks;
- ``full``: 5 seeds x 500 steps on pystdlib, depth studies at 12 blocks (docs/claims.md);
- ``scale``: the claims whose verdict at width 64 is an initialisation artefact or not observable
  (:data:`SCALE_CLAIMS`), at a scale where training dominates the initialisation, sized for one GPU: 8 seeds x 2,000
  steps on pystdlib, 12 blocks of width 256 (4 heads), context 256, batch 16, the learning-rate grid of ``quick`` at
  the same shape and length; its runs ask for ``device: cuda`` (a CPU-only machine refuses the budget in one line
  with its estimated time, normlab.experiments.estimate) and use their own seed block, 5000-5007 (docs/compare.md,
  "Seed blocks");
- ``confirm``: ``full``'s models, steps and 5 seeds on a fresh seed block, 6000-6004, for the claims whose definition
  was revised after a verdict on seeds 0-4 (:data:`CONFIRM_CLAIMS`; normlab/evidence/revisions.yaml): their verdicts
  on seeds 0-4 are exploratory (runs that shaped a design cannot confirm it), the same definitions judged on seeds
  no revision saw are confirmatory (``normlab.experiments.claims.execution.judge``; docs/claims-confirm.md);
- ``followup``: ``full``'s models, steps and measurements on 12 seeds of a fresh block, 7000-7011, for the claims whose
  verdicts differed between the two fresh 5-seed blocks that measured the revised claims (1000-1004 and 6000-6004;
  :data:`FOLLOWUP_CLAIMS`). It *follows* ``confirm`` (``Budget.follows``): for its claims its verdicts, judged on its
  own block alone with Holm over its own family, supersede ``confirm``'s (docs/claims-followup.md);
- ``rejudge``: ``full``'s models, steps and 5 seeds on a fresh block, 9100-9104, for the claims whose verdict the
  decision layer's rules (normlab.decide) changed on a stored result or cannot judge from stored details
  (:data:`REJUDGE_CLAIMS`; docs/claims.md, "Re-judged under the decision layer"); judged on its own block with Holm
  over its own family (docs/claims-rejudge.md).

- ``frontier``: ``full``'s models, steps and measurements on 5 seeds of a fresh block, 23000-23004, for the claims of
  the residual-stream and normalization-free papers (:data:`FRONTIER_CLAIMS`: hyper-connections, mHC, nGPT,
  DeepNorm, Derf; docs/streams.md), declared before any of their runs.

Why the follow-up decides alone. Its claims were chosen after both 5-seed blocks were known (a post-hoc choice, and
the choice to let it replace the registered confirmation's verdicts for them is post hoc too); its own block is
independent of that choice, so its verdict on a claim is a test at the usual level given the choice (a two-sided test
whose sign picks the verdict: at most alpha / 2 per direction under the null). Its seeds are not pooled with the
blocks that prompted it: continuing only where earlier blocks looked a certain way and pooling would not keep that
level. Its family for Holm is its own 3 claims (a new, declared question set), not the 17 the same claims faced in
``confirm``; the packaged evidence thus mixes Holm families (docs/advise.md). Twelve seeds: a one-sample t-test over
12 seeds has about half the interval width of one over 5 at the same spread (t quantile and square root of n).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

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
    measure_tokens: int = 8192  # tokens a post-hoc measurement scores (quantization, norm removal, literature)
    removal_steps: int = 10     # fine-tuning steps of the norm-removal measurement
    device: str | None = None   # the device its runs ask for (None: the config's default, auto)
    seed_base: int = 0          # its seeds are seed_base .. seed_base + n - 1
    claims: tuple[str, ...] = ()  # the claims it runs without --only (empty: every claim)
    follows: str | None = None  # the confirmation budget whose verdicts its own supersede, for its claims

    def to_dict(self) -> dict:
        """The budget's fields (``claims.json``'s ``budget_spec``); the four above only where set."""
        d = asdict(self)
        for key, default in (("device", None), ("seed_base", 0), ("claims", ()), ("follows", None)):
            if d[key] == default:
                del d[key]
        return d

    def seed_list(self, n: int) -> list[int]:
        """The seeds of ``n`` replicates: the budget's block from its first seed."""
        return list(range(self.seed_base, self.seed_base + n))


# claims whose verdict at width 64 is a property of the initialisation (cod-growth: Pre-LN's depth slope is there at
# init; peri-variance-magnitude: the gap is larger at init than at the end) or not observable (docs/claims.md)
SCALE_CLAIMS = ("cod-growth", "peri-variance", "peri-variance-magnitude", "dyt-vs-ln", "stablemax-collapse",
                "mano-rank", "mnn-rank", "residual-sink-clipping")


# every claim whose definition was revised after a verdict on seeds 0-4 (normlab/evidence/revisions.yaml), fixed
# before the ``confirm`` run: all of them, whatever their verdict there (choosing by the verdict would be a forking
# path); tests/experiments/claims/test_budgets.py keeps it equal to the revised claims
CONFIRM_CLAIMS = ("cod-growth", "peri-massive", "peri-variance", "peri-variance-magnitude", "mixln-grad",
                  "postln-warmup", "dyt-vs-ln", "lssar-extrapolation", "powernorm-lm", "linear-attention",
                  "hadamard-w4", "peri-quant", "mano-rank", "mnn-rank", "mixln-lr-best", "stablemax-collapse",
                  "residual-sink-clipping")
CONFIRM_SEED_BASE = 6000  # a block no shipped question uses (claims 0-4, quick 1000s/2000s, scale 3000s-5000s)

# the claims whose verdict on 1000-1004 (the first confirmation run, kept as docs/claims-confirm-seeds1000-*.json; it
# matched seeds 0-4 on all 17) and on 6000-6004 (docs/claims-confirm-*.json) differ: every such claim, fixed
# before the ``followup`` run; tests/experiments/claims/test_budgets.py recomputes the list from those two files
FOLLOWUP_CLAIMS = ("postln-warmup", "lssar-extrapolation", "mano-rank")
FOLLOWUP_SEED_BASE = 7000  # a block no shipped question uses (the blocks above, confirm 6000s)
FOLLOWUP_SEEDS = 12  # over twice the 5 seeds whose verdicts disagreed

# the claims whose verdict on a stored result the decision layer's rules changed (normlab.decide: one guard, state
# claims on their change from initialisation, TOST inside the family, LR sensitivity with collapsed runs scored at
# L_init), or that its rules cannot judge from the stored details (no at-init value): every such claim, fixed from
# the re-judged table of docs/claims.md before the ``rejudge`` run; measured again on a fresh block, judged on it
# alone (its own family), whatever they show
REJUDGE_CLAIMS = ("cod-growth", "cod-lns", "peri-massive", "peri-variance-magnitude", "hadamard-w4", "peri-quant",
                  "mano-rank", "qk-lr-sensitivity", "postln-lr-sensitivity", "peri-lr-sensitivity")
REJUDGE_SEED_BASE = 9100  # a block no shipped question uses (the blocks above, advise's 8000s, replications +10000)

# the residual-stream and normalization-free papers (hyper-connections, mHC, nGPT, DeepNorm, Derf; their
# claims declared in defs/ before any of their runs): ``full``'s models on a block no shipped question uses (the
# blocks above, advise's 8000s, rejudge's 9100s, replications +10000, advise's replication 18000s)
FRONTIER_CLAIMS = ("mhc-composite-gain", "hc-lr-sensitivity", "hc-vs-pre", "hc-vs-pre-flops", "ngpt-fewer-steps",
                   "deepnorm-deep-post", "derf-vs-dyt", "derf-vs-ln")
FRONTIER_SEED_BASE = 23000


BUDGETS: dict[str, Budget] = {
    "tiny": Budget("tiny", "synthetic:markov?order=2&alphabet=16&length=300000&seed=0", seeds=2, steps=8,
                   batch_size=4, context=32, width=32, heads=2, depth=2, deep_depth=3, warmup_steps=2, lr=3e-3,
                   eval_batches=2, diag_every=2, sample_sequences=4, extrap_factors=(1, 4), extrap_windows=2,
                   grid_lrs=(1e-3, 1e-2, 30.0), grid_depth=2, grid_steps=8, grid_warmup=2, grid_eval_batches=2,
                   measure_tokens=512, removal_steps=2),
    "quick": Budget("quick", "pystdlib", seeds=3, steps=250, batch_size=16, context=64, width=64, heads=4, depth=4,
                    deep_depth=8, warmup_steps=25, lr=3e-3, eval_batches=16, diag_every=25, sample_sequences=16,
                    extrap_factors=(1, 16), extrap_windows=4,
                    grid_lrs=(0.001, 0.00416, 0.0173, 0.0721, 0.3)),
    "full": Budget("full", "pystdlib", seeds=5, steps=500, batch_size=16, context=64, width=64, heads=4, depth=4,
                   deep_depth=12, warmup_steps=50, lr=3e-3, eval_batches=32, diag_every=50, sample_sequences=32,
                   extrap_factors=(1, 2, 4, 8, 16), extrap_windows=8,
                   grid_lrs=(0.001, 0.00416, 0.0173, 0.0721, 0.3), grid_depth=6, grid_steps=200, grid_warmup=20,
                   measure_tokens=16384, removal_steps=30),
    "scale": Budget("scale", "pystdlib", seeds=8, steps=2000, batch_size=16, context=256, width=256, heads=4, depth=12,
                    deep_depth=12, warmup_steps=100, lr=3e-3, eval_batches=24, diag_every=100, sample_sequences=32,
                    extrap_factors=(1, 4), extrap_windows=4, grid_lrs=(0.001, 0.00416, 0.0173, 0.0721, 0.3),
                    grid_depth=12, grid_steps=2000, grid_warmup=100, grid_eval_batches=24, device="cuda",
                    seed_base=5000, claims=SCALE_CLAIMS),
}
BUDGETS["confirm"] = replace(BUDGETS["full"], name="confirm", seed_base=CONFIRM_SEED_BASE, claims=CONFIRM_CLAIMS)
BUDGETS["followup"] = replace(BUDGETS["full"], name="followup", seeds=FOLLOWUP_SEEDS, seed_base=FOLLOWUP_SEED_BASE,
                              claims=FOLLOWUP_CLAIMS, follows="confirm")
BUDGETS["rejudge"] = replace(BUDGETS["full"], name="rejudge", seed_base=REJUDGE_SEED_BASE, claims=REJUDGE_CLAIMS)
BUDGETS["frontier"] = replace(BUDGETS["full"], name="frontier", seed_base=FRONTIER_SEED_BASE, claims=FRONTIER_CLAIMS)


def stored_spec(raw: dict) -> dict:
    """A ``budget_spec`` ``raw`` as stored (tuples as lists), with the measurement fields it was run with where it
    predates them (``measure_tokens`` / ``removal_steps``: the measures then looked them up by budget name, tiny /
    quick / full, any other name taking quick's)."""
    old = BUDGETS.get(raw.get("name"), BUDGETS["quick"]) if raw.get("name") in ("tiny", "quick", "full") \
        else BUDGETS["quick"]
    full = {"measure_tokens": old.measure_tokens, "removal_steps": old.removal_steps, **raw}
    return {k: list(v) if isinstance(v, tuple) else v for k, v in full.items()}  # as JSON stores them


def confirmation_mismatch(main: dict, confirmation: dict, main_name: str, name: str) -> str | None:
    """Why the stored budget spec ``confirmation`` (``claims.json``'s ``budget_spec``) cannot confirm ``main``'s
    verdicts (one line naming what differs), or None: a confirmation is the same budget on other seeds (its
    models, steps and measurements equal; only ``name``, its seeds (``seed_base``, their number), the claims it runs
    and the confirmation it follows may differ)."""
    main, confirmation = stored_spec(main), stored_spec(confirmation)
    differ = sorted(k for k in set(main) | set(confirmation) if k not in ("name", "seed_base", "seeds", "claims",
                                                                          "follows")
                    and main.get(k) != confirmation.get(k))
    if not differ:
        return None
    return (f"{name}: a confirmation runs the main run's budget on other seeds; its {', '.join(differ)} differ from "
            f"{main_name}'s")


def confirmation_problem(main: dict, doc: dict, main_name: str, name: str) -> str | None:
    """Why the stored claims results ``doc`` (a ``claims.json``) cannot confirm the verdicts of the run whose budget
    spec is ``main`` (one line), or None. A confirmation is the same budget on other seeds
    (:func:`confirmation_mismatch`), run as its registered budget declares it: its stored spec is that of the budget
    it names (``confirm`` on 6000-6004, ``followup`` on 7000-7011: a run of that budget on other seeds is not the
    registered confirmation), and it holds exactly the budget's claims, each on the budget's seeds (not a
    ``--only`` or ``--seeds`` selection)."""
    spec = doc.get("budget_spec") or {}
    why = confirmation_mismatch(main, spec, main_name, name)
    if why:
        return why
    budget = BUDGETS.get(str(doc.get("budget")))
    if budget is None or not budget.claims or stored_spec(spec) != stored_spec(budget.to_dict()):
        return (f"{name}: not a run of a registered confirmation budget as declared (confirm, followup: their "
                "budget spec, seeds included, as normlab.experiments.claims.budgets defines it)")
    claims = [c for c in doc.get("claims") or [] if isinstance(c, dict)]
    if sorted(str(c.get("name")) for c in claims) != sorted(budget.claims):
        return f"{name}: a {budget.name} run holds exactly its budget's claims ({', '.join(budget.claims)})"
    seeds = budget.seed_list(budget.seeds)
    short = [str(c["name"]) for c in claims if c.get("seeds") != seeds]
    if short:
        return (f"{name}: {', '.join(short)} not measured on the {budget.name} budget's seeds "
                f"{seeds[0]}-{seeds[-1]}")
    return None


def confirmations_problem(main: dict, docs: list[tuple[dict, str]], main_name: str) -> str | None:
    """Why the stored claims results ``docs`` ((document, name) pairs) cannot together confirm the run whose budget
    spec is ``main`` (one line), or None; the one check ``normlab claims --render --confirmation`` and the evidence
    builder (normlab.report.evidence) make: each is a registered confirmation run as declared
    (:func:`confirmation_problem`), at most one per budget (two would let their order or a choice between their
    verdicts decide: a forking path), and a follow-up comes with the confirmation it follows (whose verdicts it
    supersedes for its claims)."""
    given: dict[str, str] = {}
    for doc, name in docs:
        why = confirmation_problem(main, doc, main_name, name)
        if why:
            return why
        budget = str(doc.get("budget"))
        if budget in given:
            return (f"{name}: a second {budget} run beside {given[budget]}; give one per budget (choosing between "
                    "two by their verdicts is a forking path)")
        given[budget] = name
    for doc, name in docs:
        follows = BUDGETS[str(doc.get("budget"))].follows
        if follows and follows not in given:
            return (f"{name}: a follow-up of the {follows} budget's confirmation; give that confirmation too, whose "
                    "verdicts it supersedes for its claims")
    return None


def get_budget(name: str) -> Budget:
    if name not in BUDGETS:
        raise NormlabError(f"unknown budget '{name}'; allowed: {', '.join(BUDGETS)}")
    return BUDGETS[name]
