"""The one statistics package of normlab (the report, the claims suite, scaling and sweeps use it; none computes its
own p-values). Torch-free; computes with ``scipy.stats``. Formulas and their sources:
docs/compare.md, "Declared questions and what the report decides".

- ``intervals``: Student-t intervals, Welch, paired differences (``mean_ci``, ``paired_diff``, ``welch_diff``).
- ``multiplicity``: Holm's step-down and Benjamini–Hochberg adjustments over a declared family.
- ``exact``: the exact sign-flip (paired) and permutation (unpaired) tests, Clopper–Pearson intervals.
- ``planning``: seeds needed for a difference, from an SD pooled over variants with its chi-square range; the power
  of a paired t-test (noncentral t) at Holm's first level.
- ``learning``: the one "did not learn" rule and the one "collapse" rule (the unigram level minus one margin).
"""

from normlab.stats.exact import (
    ClopperPearson,
    clopper_pearson,
    min_permutation_p,
    min_sign_flip_p,
    permutation_p,
    sign_flip_p,
)
from normlab.stats.intervals import (
    Diff,
    MeanCI,
    Welch,
    mean_ci,
    paired_diff,
    t_cdf,
    t_ppf,
    two_sided_t_p,
    welch,
    welch_diff,
)
from normlab.stats.learning import (
    DID_NOT_LEARN_MARGIN,
    NOT_DECIDED_BASE_DNL,
    NOT_DECIDED_DNL,
    collapsed,
    did_not_learn,
    learning_note,
)
from normlab.stats.multiplicity import ADJUSTMENTS, adjust, benjamini_hochberg, holm
from normlab.stats.planning import (
    SEEDS_NEEDED_MAX,
    PooledSD,
    SeedsRange,
    holm_first_level,
    paired_t_power,
    pooled_sd,
    seeds_needed,
    seeds_needed_range,
)

__all__ = [
    "ADJUSTMENTS",
    "DID_NOT_LEARN_MARGIN",
    "NOT_DECIDED_BASE_DNL",
    "NOT_DECIDED_DNL",
    "SEEDS_NEEDED_MAX",
    "ClopperPearson",
    "Diff",
    "MeanCI",
    "PooledSD",
    "SeedsRange",
    "Welch",
    "adjust",
    "benjamini_hochberg",
    "clopper_pearson",
    "collapsed",
    "did_not_learn",
    "holm",
    "holm_first_level",
    "learning_note",
    "mean_ci",
    "min_permutation_p",
    "min_sign_flip_p",
    "paired_diff",
    "paired_t_power",
    "permutation_p",
    "pooled_sd",
    "seeds_needed",
    "seeds_needed_range",
    "sign_flip_p",
    "t_cdf",
    "t_ppf",
    "two_sided_t_p",
    "welch",
    "welch_diff",
]
