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
import os

from normlab.errors import NormlabError
from normlab.version import __version__  # the one place it is written

_CUBLAS_WORKSPACE = ":4096:8"  # normlab.train.precision.CUBLAS_WORKSPACE (this module imports nothing of normlab)
"""The deterministic cuBLAS workspace (8 chunks of 4 MiB: torch's own default size on Hopper) that torch's
reproducibility notes name. cuBLAS reads ``CUBLAS_WORKSPACE_CONFIG`` once per process, when it makes its first
handle (the process's first CUDA matmul), so it is set here, where every process that may train
(``python -m normlab``, a sweep worker, a DDP rank, the demo, a script that imports normlab) starts, before torch is
imported: a deterministic run (``train.deterministic``) then gets a deterministic workspace even after earlier CUDA
work in the same process. A value already set (a user's ``:16:8``) is kept; nothing removes it."""
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", _CUBLAS_WORKSPACE)


_API = ("make_config", "build_model", "train_run", "load_run", "evaluate", "generate", "compare", "Run")
__all__ = [*_API, "NormlabError", "__version__"]


def __getattr__(name: str) -> object:
    if name in _API:
        return getattr(importlib.import_module("normlab.api"), name)
    raise AttributeError(f"module 'normlab' has no attribute '{name}'")
