"""normlab: a lab for normalization in transformer language models.

The Python API (docs/api.md), imported lazily so ``normlab --help`` does not pay for torch:

- ``normlab.make_config(base, overrides)``: a validated ``RunConfig`` from a preset, YAML path or dict
- ``normlab.build_model(cfg)``: the untrained model of a config
- ``normlab.train_run(cfg, out)``: train into a run directory, returns its summary
- ``normlab.load_run(run_dir)``: a trained ``Run`` (model, config, tokenizer, data)
- ``normlab.evaluate(run)``: loss, bits/byte, perplexities (as ``normlab eval --json``)
- ``normlab.generate(run, prompt)``: sampled text
- ``normlab.compare(sweep, out)``: run a sweep in parallel and write its report
- ``normlab.NormlabError``: every user-facing error
"""

from __future__ import annotations

import importlib  # loaded by the interpreter before this runs: nothing from the current directory (__main__.py)

from normlab.errors import NormlabError
from normlab.version import __version__  # noqa: E402 - the one place it is written

_API = ("make_config", "build_model", "train_run", "load_run", "evaluate", "generate", "compare", "Run")
__all__ = [*_API, "NormlabError", "__version__"]


def __getattr__(name: str) -> object:
    if name in _API:
        return getattr(importlib.import_module("normlab.api"), name)
    raise AttributeError(f"module 'normlab' has no attribute '{name}'")
