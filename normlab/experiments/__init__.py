"""Sweeps: expand a sweep file into runs, run them in parallel worker processes, store results in SQLite.

>>> from normlab.experiments.sweep import load_sweep           # doctest: +SKIP
>>> from normlab.experiments.runner import default_sweep_dir, run_sweep
>>> sweep = load_sweep(preset="quick")
>>> outcome = run_sweep(sweep, default_sweep_dir(sweep))

Modules: ``sweep`` (sweep files, presets, expansion into runs), ``runner`` (parallel execution, resume, signals),
``executors`` (local processes or Ray), ``worker`` (one run, torch-free result recording), ``store`` (SQLite results),
``claims`` (the published-claims suite). Import from the module that defines a name: this package re-exports
nothing, so a worker that only records results does not import torch.
"""
