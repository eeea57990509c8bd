"""Typed, validated model configuration (litgpt style: strings name choices, validated when built)."""

from __future__ import annotations

from dataclasses import dataclass

from normlab.errors import NormlabError, unknown

ACTIVATIONS = ("gelu", "swiglu")
POSITIONS = ("rope", "learned")


@dataclass
class ModelConfig:
    """Decoder-only GPT shape and normalization choices.

    ``vocab_size`` is normally filled in from the tokenizer; ``context`` is the training sequence length.
    """

    vocab_size: int = 256
    context: int = 128
    width: int = 128
    depth: int = 4
    heads: int = 4
    mlp_ratio: float = 4.0
    activation: str = "gelu"
    positions: str = "rope"
    rope_base: float = 10000.0
    dropout: float = 0.0
    tie_embeddings: bool = True
    bias: bool = False
    norm: str = "layernorm"
    norm_eps: float = 1e-5
    placement: str = "pre"
    final_norm: bool | None = None
    init_std: float = 0.02

    def validate(self) -> "ModelConfig":
        """Check cross-field constraints; raise a one-line NormlabError naming the field."""
        from normlab.model.placements import PLACEMENTS
        from normlab.norms import get_norm_class

        for name in ("vocab_size", "context", "width", "depth", "heads"):
            if getattr(self, name) < 1:
                raise NormlabError(f"model.{name} must be >= 1, got {getattr(self, name)}")
        if self.width % self.heads:
            raise NormlabError(
                f"model.width ({self.width}) must be divisible by model.heads ({self.heads})"
            )
        if self.positions == "rope" and (self.width // self.heads) % 2:
            raise NormlabError(f"model.positions 'rope' needs an even head dim, got {self.width // self.heads}")
        if self.activation not in ACTIVATIONS:
            raise unknown("model.activation", self.activation, ACTIVATIONS)
        if self.positions not in POSITIONS:
            raise unknown("model.positions", self.positions, POSITIONS)
        if self.placement not in PLACEMENTS:
            raise unknown("model.placement", self.placement, PLACEMENTS)
        get_norm_class(self.norm)
        if not 0.0 <= self.dropout < 1.0:
            raise NormlabError(f"model.dropout must be in [0, 1), got {self.dropout}")
        if self.mlp_ratio <= 0 or self.norm_eps <= 0 or self.init_std <= 0:
            raise NormlabError("model.mlp_ratio, model.norm_eps and model.init_std must be > 0")
        return self

    @property
    def head_dim(self) -> int:
        return self.width // self.heads
