"""Printing a registry listing (``normlab norms``, ``normlab attention``): one rich table, or ``--json``."""

from __future__ import annotations

import json
from typing import Callable


def print_listing(key: str, rows: list[dict], columns: dict[str, Callable[[dict], str]], as_json: bool) -> int:
    """Print ``rows`` (one dict per registered entry) and return exit status 0.

    With ``as_json``: one JSON object ``{key: rows}`` on stdout. Otherwise a rich table whose headings are the
    keys of ``columns`` and whose cells are ``columns[heading](row)``, printed with markup off (paper titles may
    hold square brackets).
    """
    if as_json:
        print(json.dumps({key: rows}))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(*columns)
    for r in rows:
        table.add_row(*(cell(r) for cell in columns.values()))
    Console(markup=False).print(table)
    return 0
