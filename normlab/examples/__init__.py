"""Runnable examples that ship inside the package (so they work from a wheel install): ``python -m
normlab.examples.api OUT_DIR`` (docs/api.md)."""
