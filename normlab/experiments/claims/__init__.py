"""``normlab claims``: published claims about normalization re-measured at CPU scale, with seeds, 95% t-intervals
and honest verdicts (``held`` / ``not held`` / ``inconclusive``).

- :mod:`.stats`: mean, Student-t CI (own t quantile), verdict logic;
- :mod:`.budgets`: ``tiny`` (tests), ``quick`` (< 15 min on 2 cores), ``full`` (docs/claims.md);
- :mod:`.suite`: the claims as data, the runs they need, per-seed measurements, ``run_suite``.
"""

from normlab.experiments.claims.budgets import BUDGETS, Budget, get_budget
from normlab.experiments.claims.stats import mean_ci, t_quantile, verdict
from normlab.experiments.claims.suite import CLAIM_NAMES, CLAIMS, run_suite, select

__all__ = ["BUDGETS", "Budget", "CLAIMS", "CLAIM_NAMES", "get_budget", "mean_ci", "run_suite", "select",
           "t_quantile", "verdict"]
