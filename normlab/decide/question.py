"""The one declared question: what a sweep, a preset, a claim, ``--until-decided`` and ``--replicate-on`` decide.

A question names the metric decided on, the baseline every comparison is ``variant - baseline`` against, the family
of comparisons adjusted together, the level, the correction, the test's pairing, the practical margin (equivalence by
TOST: normlab.decide.verdicts), the seed block it runs on and its observability rule. It is declared before the
data (docs/compare.md, "Declared questions")::

    primary: lr_sensitivity      # lr_sensitivity (needs lr_grid), best_loss, final_loss
    baseline: Pre-LN             # default: the first variant
    family: [Peri-LN, Post-LN]   # default: every other variant vs the baseline
    alpha: 0.05                  # family-wise error (holm) or false discovery rate (bh)
    correction: holm             # holm (default) or bh (Benjamini-Hochberg)
    paired: true                 # paired t over shared seeds (default); false: Welch
    margin: 0.01                 # optional: the practical margin; a difference whose 1 - 2 alpha interval lies
                                 # inside +-margin is "within margin" (TOST; needs paired: true, no sequential plan)

Every reader goes through this module: ``parse_question`` checks a sweep file's keys (one-line errors),
``stored_question`` reads the question of a stored sweep spec (typed by normlab.experiments.sweepspec.SweepSpec;
the report, the sequential looks and the replications),
``question_of`` turns a design dict (the store's ``design`` meta, or a partial one) into a ``Question``, and
``claim_question`` reads a claim's definition. The defaults are written once, here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from normlab.errors import NormlabError, did_you_mean

PRIMARY_METRICS = ("lr_sensitivity", "best_loss", "final_loss")
"""``primary:`` values: per-seed LR sensitivity and best-of-grid loss (a sweep with ``lr_grid``), or the final
validation bits/byte (a sweep at one learning rate, where it equals ``best_loss``)."""
METRIC_LABELS = {"lr_sensitivity": "LR sensitivity", "best_loss": "best loss", "final_loss": "final loss"}
CORRECTIONS = ("holm", "bh")
QUESTION_KEYS = ("primary", "family", "alpha", "correction", "paired", "margin")
"""Top-level sweep keys of the question; not part of the sweep hash (changing them after results is recorded and
reported instead of orphaning the sweep directory). ``baseline`` is older and stays in the hash."""
DEFAULT_ALPHA = 0.05
CLAIM_METRICS = {"sens_diff": "lr_sensitivity", "best_diff": "best_loss"}
"""Claim measures that are a sweep's primary metric as ``args[0] - args[1]`` per seed (claims/measures_lr.py)."""


def default_primary(grid: bool) -> str:
    """The metric of a question that names none: LR sensitivity over a learning-rate grid, else the final loss."""
    return "lr_sensitivity" if grid else "final_loss"


@dataclass(frozen=True)
class Question:
    """A declared (or default) question: each of ``family`` (None: every other variant) against ``baseline`` on
    ``primary``, adjusted by ``correction`` at ``alpha``; ``declared`` False: nothing is decided (exploratory).
    ``margin``: the practical margin ("within margin" by TOST, normlab.decide.verdicts), ``seeds``: the seed
    block, ``observable``: the details key whose per-seed CI must lie
    above 0 for the phenomenon to be observable (a claim's)."""

    primary: str
    baseline: str | None
    family: tuple[str, ...] | None = None
    alpha: float = DEFAULT_ALPHA
    correction: str = "holm"
    paired: bool = True
    declared: bool = True
    margin: float | None = None
    seeds: tuple[int, ...] = ()
    observable: str = ""

    def members(self, groups: Sequence[str]) -> tuple[str, ...]:
        """The family among ``groups`` (the variants that ran), in the groups' order."""
        return tuple(g for g in groups if g != self.baseline and (self.family is None or g in self.family))

    def as_dict(self) -> dict[str, Any]:
        """The question as recorded in a sweep's design (the store's ``design`` meta) and the report's JSON; the
        margin and observability rule only where set, so a design recorded without them is unchanged; the seed block
        is the design's own ``seeds`` (``make_design``)."""
        out = {"declared": self.declared, "primary": self.primary, "baseline": self.baseline,
               "family": None if self.family is None else list(self.family), "alpha": self.alpha,
               "correction": self.correction, "paired": self.paired}
        extra = {"margin": self.margin, "observable": self.observable or None}
        return {**out, **{k: v for k, v in extra.items() if v is not None}}


def parse_question(raw: Mapping[str, Any], names: list[str], *, grid: bool, source: str) -> Question:
    """Check the question keys of sweep mapping ``raw`` against the group labels ``names`` (baseline first when not
    given); ``declared`` is False when ``primary:`` is absent: then the defaults are used and the report treats every
    comparison as exploratory. The family is resolved (every other variant when not given); the seed block is the
    sweep's (set by its parser once a sequential plan has extended it)."""
    declared = raw.get("primary") is not None
    primary = raw.get("primary", default_primary(grid))
    if primary not in PRIMARY_METRICS:
        raise NormlabError(
            f"{source}: primary {primary!r} is not a metric{did_you_mean(str(primary), PRIMARY_METRICS)};"
            f" allowed: {', '.join(PRIMARY_METRICS)}"
        )
    if primary == "lr_sensitivity" and not grid:
        raise NormlabError(f"{source}: primary: lr_sensitivity needs an lr_grid (at one learning rate use final_loss)")
    if primary == "final_loss" and grid:
        raise NormlabError(f"{source}: primary: final_loss is for a sweep at one learning rate; with lr_grid use "
                           "lr_sensitivity or best_loss (the best final loss of the grid)")
    baseline = raw.get("baseline")
    if baseline is None:
        baseline = names[0] if names else None
    elif baseline not in names:
        raise NormlabError(f"{source}: baseline {baseline!r} is not a variant{did_you_mean(str(baseline), names)}; "
                           f"variants: {', '.join(names)}")
    others = [n for n in names if n != baseline]
    family = raw.get("family")
    if family is None:
        family = others
    else:
        if not isinstance(family, list) or not family or not all(isinstance(f, str) for f in family):
            raise NormlabError(f"{source}: family must be a non-empty list of variant names compared with the "
                               f"baseline; variants: {', '.join(others)}")
        for f in family:
            if f == baseline:
                raise NormlabError(f"{source}: family names the baseline {f!r}; list the variants compared with it")
            if f not in others:
                raise NormlabError(f"{source}: family member {f!r} is not a variant{did_you_mean(f, others)}; "
                                   f"variants: {', '.join(others)}")
        if len(set(family)) != len(family):
            raise NormlabError(f"{source}: family lists a variant twice: {family}")
    alpha = raw.get("alpha", DEFAULT_ALPHA)
    if (isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha)
            or not 0 < alpha <= 0.5):
        raise NormlabError(f"{source}: alpha must be a number in (0, 0.5], got {alpha!r}")
    correction = raw.get("correction", "holm")
    if correction not in CORRECTIONS:
        raise NormlabError(f"{source}: correction {correction!r} is not one of {', '.join(CORRECTIONS)} "
                           "(holm: family-wise error; bh: Benjamini-Hochberg false discovery rate)")
    paired = raw.get("paired", True)
    if not isinstance(paired, bool):
        raise NormlabError(
            f"{source}: paired must be true (paired t over shared seeds) or false (Welch), got {paired!r}"
        )
    margin = raw.get("margin")
    if margin is not None:
        if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not math.isfinite(margin) or margin <= 0:
            raise NormlabError(f"{source}: margin must be a number > 0 (the practical margin, in the primary metric's "
                               f"units), got {margin!r}")
        if not paired:
            raise NormlabError(f"{source}: margin is tested on the per-seed differences (TOST): it needs paired: true")
        margin = float(margin)
    return Question(primary, baseline, tuple(family), float(alpha), correction, paired, declared, margin)


def question_spec(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The question keys as given in ``raw`` (for the stored, self-contained sweep spec)."""
    return {k: raw[k] for k in QUESTION_KEYS if raw.get(k) is not None}


def question_of(d: Mapping[str, Any] | Question | None, *, baseline: str | None, grid: bool) -> Question:
    """A ``Question`` from a design dict (the store's ``design`` meta, or the partial ``{declared, baseline}`` of a
    store written before designs were recorded); missing keys take the defaults, None is the undeclared default
    question with ``baseline`` (every comparison exploratory)."""
    if isinstance(d, Question):
        return d
    d = d or {"declared": False, "primary": default_primary(grid)}
    family = d.get("family")
    seeds = d.get("seeds")
    return Question(d.get("primary") or default_primary(grid), baseline if "baseline" not in d else d["baseline"],
                    None if family is None else tuple(family), d.get("alpha", DEFAULT_ALPHA),
                    d.get("correction", "holm"), d.get("paired", True), bool(d.get("declared")),
                    d.get("margin"), tuple(seeds) if isinstance(seeds, list) else (), d.get("observable") or "")


def stored_question(spec: Any, groups: list[str]) -> Question:
    """The declared question of a stored sweep spec (``SWEEP_DIR/sweep.yaml``, checked by ``parse_question`` when
    it was written; read typed by normlab.experiments.sweepspec.SweepSpec: ``lr_grid``, ``baseline``, ``primary``,
    ``family``, ``alpha``, ``correction``, ``paired``, ``margin``, ``seeds``) over ``groups``, the variant labels
    that ran (the grid groups of an lr_grid sweep), for the sequential looks and the replications: a baseline that
    did not run is the first group, the family is its members among ``groups`` in their order."""
    grid = isinstance(spec.lr_grid, list) and len(spec.lr_grid) >= 2
    baseline = spec.baseline if spec.baseline in groups else (groups[0] if groups else "")
    alpha = float(spec.alpha)
    if not (0.0 < alpha < 1.0 and math.isfinite(alpha)):
        raise NormlabError(f"alpha must be in (0, 1), got {alpha}")
    margin = spec.margin
    q = Question(spec.primary or default_primary(grid), baseline, spec.family, alpha, spec.correction or "holm",
                 spec.paired, spec.primary is not None, None if margin is None else float(margin),
                 tuple(spec.seeds or ()))
    return Question(q.primary, q.baseline, q.members(groups), q.alpha, q.correction, q.paired, q.declared,
                    q.margin, q.seeds)


def claim_question(claim: Any, *, seeds: int | None = None, alpha: float = DEFAULT_ALPHA,
                   correction: str = "holm") -> Question | None:
    """The question a claim declares, where its measure is a sweep's primary metric (``CLAIM_METRICS``): per seed
    ``args[0] - args[1]``, so ``args[1]`` is the baseline and ``args[0]`` the one member; its seed block is seeds
    0..n-1 (``claim.seeds``, else ``seeds``: the budget's), its margin the practical margin, its observability rule
    the claim's. None for a claim measured otherwise (a slope, a ratio, a rank)."""
    metric = CLAIM_METRICS.get(getattr(claim, "measure", ""))
    args = tuple(getattr(claim, "args", ()) or ())
    if metric is None or len(args) < 2:
        return None
    n = claim.seeds if getattr(claim, "seeds", None) is not None else seeds
    return Question(metric, args[1], (args[0],), alpha, correction, True, True,
                    getattr(claim, "practical_margin", None), tuple(range(n)) if n else (),
                    getattr(claim, "observable", "") or "")
