"""Sweeps: expand a sweep file into runs, run them, store results in SQLite.

>>> import normlab.experiments                                 # doctest: +SKIP
>>> from normlab.experiments.sweep import load_sweep
>>> from normlab.experiments.sweepdir import default_sweep_dir
>>> sweep = load_sweep(preset="quick")
>>> outcome = normlab.experiments.run(sweep, default_sweep_dir(sweep), executor="local")

``normlab.experiments.run`` (defined in ``entry``) is the one entry: once, or in rounds until decided. Modules:
``sweep`` (sweep files, presets, expansion into runs), ``entry`` (``run``), ``sweepdir`` (one pass: the sweep
directory, resume, planning), ``scheduling`` (the ``Executor`` protocol, the one scheduling loop and its signal
handling; worker processes, in-process and stacked executors), ``executors`` (Ray), ``pool`` (the worker processes),
``worker`` (one run, torch-free result recording), ``store`` (SQLite results), ``claims`` (the published-claims
suite). Import from the module that defines a name: this package imports nothing when imported (``run`` is loaded
on first use), so a worker that only records results does not import torch.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    """``normlab.experiments.run``: ``entry.run``, imported on first use (module docstring)."""
    if name == "run":
        from normlab.experiments.entry import run

        return run
    raise AttributeError(f"module 'normlab.experiments' has no attribute '{name}'")
