"""``python -m normlab``: the same as the ``normlab`` console script."""

from normlab.cli import entry

entry()
