"""Sweeps: expand a sweep file into runs, run them in parallel worker processes, store results in SQLite.

>>> sweep = load_sweep(preset="quick")                      # doctest: +SKIP
>>> outcome = run_sweep(sweep, default_sweep_dir(sweep))     # doctest: +SKIP

Names are imported lazily, so a worker process that only records results (``normlab.experiments.store`` /
``.worker``) does not pay for importing torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_NAMES = {
    "SweepOutcome": "runner", "default_sweep_dir": "runner", "plan_workers": "runner", "run_sweep": "runner",
    "Store": "store",
    "Sweep": "sweep", "SweepRun": "sweep", "list_presets": "sweep", "load_sweep": "sweep", "parse_sweep": "sweep",
}
__all__ = sorted(_NAMES)


def __getattr__(name: str) -> Any:
    if name in _NAMES:
        return getattr(importlib.import_module(f"normlab.experiments.{_NAMES[name]}"), name)
    raise AttributeError(f"module 'normlab.experiments' has no attribute '{name}'")
