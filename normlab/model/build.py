"""``build_model``: the model a config describes, GPT or the compressed-stream CRMSGPT (normlab.model.crms).

Its own module so that ``gpt`` (GPT) and ``crms`` (CRMSGPT, a GPT subclass) do not import each other.
"""

from __future__ import annotations

from normlab.model.config import ModelConfig
from normlab.model.crms import CRMSGPT
from normlab.model.gpt import GPT
from normlab.norms import get_norm_class


def build_model(cfg: ModelConfig) -> GPT:
    """Validate ``cfg`` and build the model (call under a seeded RNG for reproducible init). A norm class that
    declares ``compressed_stream`` (CRMSNorm) gets ``CRMSGPT``: the residual stream in width - 1 coordinates
    (docs/convert.md)."""
    if get_norm_class(cfg.norm).compressed_stream:
        return CRMSGPT(cfg)
    return GPT(cfg)
