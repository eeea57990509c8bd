"""Printing a registry listing (``normlab norms``, ``normlab attention``): one rich table, or ``--json``."""

from __future__ import annotations

import json
from typing import Callable

from rich.console import Console
from rich.table import Table

from normlab.safety import printable


def print_listing(key: str, rows: list[dict], columns: dict[str, Callable[[dict], str]], as_json: bool) -> int:
    """Print ``rows`` (one dict per registered entry) and return exit status 0.

    With ``as_json``: one JSON object ``{key: rows}`` on stdout. Otherwise a rich table whose headings are the
    keys of ``columns`` and whose cells are ``columns[heading](row)``, printed with markup off (paper titles may
    hold square brackets). The first column (the names) is never wrapped or truncated.
    """
    if as_json:
        print(json.dumps({key: rows}))
        return 0

    table = Table(*columns)
    cells = [[printable(cell(r)) for cell in columns.values()] for r in rows]  # control characters as escapes
    if cells:  # the first column (the names) is never wrapped or cut, however narrow the terminal
        table.columns[0].no_wrap = True
        table.columns[0].min_width = max(len(c[0]) for c in cells)
    for c in cells:
        table.add_row(*c)
    Console(markup=False).print(table)
    return 0
