"""normlab's version: the one place it is written (``pyproject.toml`` reads it, ``normlab/__init__.py`` re-exports
it). A module on the lowest floor, so code that records the version imports nothing of the package's API."""

__version__ = "0.1.0"
