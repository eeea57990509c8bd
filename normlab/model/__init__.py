"""GPT model: config, placements, blocks."""

from normlab.model.config import ModelConfig
from normlab.model.gpt import GPT, build_model, init_weights
from normlab.model.placements import PLACEMENTS

__all__ = ["GPT", "ModelConfig", "PLACEMENTS", "build_model", "init_weights"]
