"""Exact conversions between normalization families (Jiang et al. 2023, arXiv:2305.14858; TransformerLens fold_ln).

- ``convert_model(model, run_cfg, kind)``: in memory, ``kind`` in ``rmsnorm | crmsnorm | folded``;
- ``convert_run(run_dir, kind, out)``: a run directory in, a checked run directory out (``normlab convert``);

See docs/convert.md for the math, the eval-affine protocol for batch-statistics norms, and what is refused. The
compressed-stream model itself (``CRMSGPT``) is a model: ``normlab.model.crms``.
"""

from normlab.convert.exact import KINDS, convert_model
from normlab.convert.run import convert_run

__all__ = ["KINDS", "convert_model", "convert_run"]
