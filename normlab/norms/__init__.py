"""Hidden-state normalization layers, looked up by name (see ``registry``).

Every module in this package is imported here, so a new norm is one registered class in one file.
"""

import importlib
import pkgutil

from normlab.norms.registry import build_norm, get_norm_class, list_norms, norm_names, register_norm

for _info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
    if _info.name not in ("registry", "functional"):
        importlib.import_module(f"{__name__}.{_info.name}")

__all__ = ["build_norm", "get_norm_class", "list_norms", "norm_names", "register_norm"]
