"""``normlab claims``: published claims about normalization re-measured at CPU scale, with seeds, 95% t-intervals
and honest verdicts (``held`` / ``not held`` / ``inconclusive``).

- :mod:`.stats`: the verdict logic (means and Student-t CIs from ``normlab.stats``, the project's one copy);
- :mod:`.budgets`: ``tiny`` (tests), ``quick`` (< 15 min on 2 cores), ``full`` (docs/claims.md);
- :mod:`.suite`: the claims as data, the runs they need, per-seed measurements, ``run_suite``.
"""

from normlab.experiments.claims.budgets import BUDGETS, Budget, get_budget
from normlab.experiments.claims.stats import verdict
from normlab.experiments.claims.suite import CLAIM_NAMES, CLAIMS, run_suite, select

__all__ = ["BUDGETS", "Budget", "CLAIMS", "CLAIM_NAMES", "get_budget", "run_suite", "select", "verdict"]
