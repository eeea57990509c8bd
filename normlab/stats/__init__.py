"""The one statistics package of normlab (the report, the claims suite, scaling and sweeps use it; none computes its
own p-values). Torch-free; computes with ``scipy.stats``. Import a name from the submodule that defines it
(``from normlab.stats.intervals import mean_ci``): this package imports nothing, so a module that needs only
``learning`` (the run-directory readers, hence ``normlab --help``) does not import SciPy.
Formulas and their sources: docs/compare.md, "Declared questions and what the report decides".

- ``intervals``: Student-t intervals, Welch, paired differences (``mean_ci``, ``paired_diff``, ``welch_diff``).
- ``multiplicity``: Holm's step-down and Benjamini–Hochberg adjustments over a declared family.
- ``exact``: the exact sign-flip (paired) and permutation (unpaired) tests, Clopper–Pearson intervals.
- ``planning``: seeds needed for a difference, from an SD pooled over variants with its chi-square range; the power
  of a paired t-test (noncentral t) at Holm's first level.
- ``learning``: the one "did not learn" rule and the one "collapse" rule (the unigram level minus one margin).
"""
