"""``python -m normlab``: the same as the ``normlab`` console script.

``python -m`` puts the current directory first on ``sys.path``, so a ``yaml.py`` or ``transformers.py`` in the
directory a user runs from (a downloaded model directory, say) would be imported in place of the real package the
first time normlab imports it. That entry is removed here, before anything else is imported (``os`` and ``sys``
are loaded by the interpreter itself before this runs); the package ``normlab`` itself is already imported by then
and imports nothing at module level that a file there could replace. ``PYTHONSAFEPATH`` / ``-P`` (Python 3.11)
leave no such entry; then nothing is removed.
"""

import os
import sys


def _drop_current_directory() -> None:
    """Remove ``sys.path[0]`` when it is the current directory (``''`` or its path), the entry ``-m`` adds."""
    if not sys.path:
        return
    first = sys.path[0]
    try:
        here = os.getcwd()
    except OSError:  # the current directory was deleted: any relative entry is meaningless
        here = None
    if first in ("", ".") or (here is not None and os.path.realpath(first) == os.path.realpath(here)):
        del sys.path[0]


_drop_current_directory()

from normlab.cli import entry  # noqa: E402 - after the sys.path fix, on purpose

entry()
