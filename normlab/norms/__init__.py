"""Hidden-state normalization layers, looked up by name (see ``registry``)."""

from normlab.norms import modules as _modules  # noqa: F401  (registers the built-in norms)
from normlab.norms.registry import build_norm, get_norm_class, list_norms, norm_names, register_norm

__all__ = ["build_norm", "get_norm_class", "list_norms", "norm_names", "register_norm"]
