"""Matplotlib plumbing shared by every PNG normlab writes: the headless backend and atomic saving."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from normlab.io import atomic_path


def pyplot():
    """``matplotlib.pyplot`` on the Agg backend (no display needed); imported lazily, it is slow to import."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_png(fig, path: str | Path) -> str:
    """Lay out ``fig``, write it to ``path`` as a 100-dpi PNG via a temp file + rename (never half-written), close
    it; returns the file name."""
    path = Path(path)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    pyplot().close(fig)
    return path.name


@contextmanager
def quiet_drawing() -> Iterator[None]:
    """Warnings raised while figures are drawn (matplotlib's "Tight layout not applied", "No artists with labels
    found to put in legend", numpy's empty-slice means of an empty panel) concern the drawing, not the results: they
    are kept off the terminal. What a figure shows or leaves out is stated in the report itself."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        warnings.simplefilter("ignore", RuntimeWarning)
        yield
