"""The decision layer: the one place where normlab decides.

A declared question (``question``: metric, baseline, family, alpha, correction, margin, seed block), per-seed values
with their learned / collapsed / diverged state (``guard``), the one guard every path applies, the tests (paired t,
exact sign-flip, Welch, TOST, Clopper-Pearson, all from normlab.stats), the family's multiplicity (TOST included),
sequential looks that re-check the guard at every look (``looks``), replication, the claims' verdicts with the
training-not-initialisation rule (``verdicts``), and the words themselves (``vocab``). ``normlab.experiments``
produces runs and values and asks this layer whether to stop; ``normlab.report``, the commands, the API and advise
only render what it returns. Torch-free.
"""
