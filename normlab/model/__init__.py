"""GPT model: config, placements, blocks."""

from normlab.model.build import build_model
from normlab.model.config import ModelConfig
from normlab.model.gpt import GPT, init_weights
from normlab.model.placements import PLACEMENTS

__all__ = ["GPT", "ModelConfig", "PLACEMENTS", "build_model", "init_weights"]
