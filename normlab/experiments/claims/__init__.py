"""``normlab claims``: published claims about normalization re-measured at CPU scale, with seeds, 95% t-intervals
and honest verdicts (``held`` / ``not held`` / ``inconclusive``).

- :mod:`.specs`: loads the claims' definitions (``defs/<name>.yaml``, one per claim, in ``suite.yaml``'s order:
  text, paper, the question, named variants, the measure by name, source, deviations) with their revisions
  (``normlab/evidence/revisions.yaml``); ``spec_hash`` over the definition only;
- :mod:`.variants`: the runs they need (each a keyword ``Variant``: depth class and config overrides);
- :mod:`.measure_registry` and :mod:`.measures` (+ :mod:`.measures_lr`, :mod:`.measures_surgery`,
  :mod:`.measures_literature`): the per-seed measures, plain functions registered by name;
- :mod:`.execution`: training what is missing, reusing what is complete, measuring, ``claims.json``;
- the verdicts (Holm over the family of claims with a significance test, practical margins by TOST, observability,
  collapse rates with Clopper-Pearson intervals) are made by ``normlab.decide.verdicts``, the one module that
  makes verdicts (sweeps, looks and replications too);
- :mod:`.docs`: docs/claims.md from a report (verdict table with the Holm column, Definitions revised, spec hashes);
- :mod:`.budgets`: ``tiny`` (tests), ``quick``, ``full`` (docs/claims.md).
"""

from normlab.experiments.claims.budgets import BUDGETS, Budget, get_budget
from normlab.experiments.claims.execution import run_suite, save_report
from normlab.experiments.claims.specs import CLAIM_NAMES, CLAIMS, Claim, select
from normlab.decide.verdicts import claim_verdict as verdict

__all__ = ["BUDGETS", "Budget", "CLAIMS", "CLAIM_NAMES", "Claim", "get_budget", "run_suite", "save_report", "select",
           "verdict"]
