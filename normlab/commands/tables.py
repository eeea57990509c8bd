"""Tables on the terminal that fit :data:`WIDTH` columns (or the terminal, when it is narrower).

Long cells wrap inside their column and nothing is cut off (a word longer than its column folds onto the next line
rather than ending in an ellipsis); long column titles are abbreviated, and a legend under the table spells out each
abbreviation it used. A table may leave some of its columns to the report files (``drop``): a line under it names
them and where they are. Cells are printed literally (no rich markup: names come from sweep files).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence

from rich import box
from rich.cells import cell_len
from rich.console import Console
from rich.table import Table

from normlab.safety import printable

WIDTH = 100
"""The widest a terminal table gets, whatever the terminal's width."""

ABBREVIATIONS: dict[str, tuple[str, str]] = {
    "LR sensitivity (bits/byte)": ("LR sens.", "LR sensitivity in bits/byte (mean ± 95% CI over seeds)"),
    "best sampled val bits/byte": ("best val", "best sampled validation bits/byte (mean ± 95% CI; a fixed "
                                   "sample of the validation split, not normlab eval's whole split)"),
    "stable width (decades)": ("stable dec.", "width of the stable learning-rate range in decades"),
    "adjusted p": ("adj. p", "p after the declared family's multiplicity correction (primary rows)"),
    "smallest exact p": ("min ex. p", "the smallest p the exact sign-flip test can give at this n"),
    "exact p": ("ex. p", "exact sign-flip test p"),
    "per-seed corr": ("r", "correlation of the two variants' per-seed values"),
    "sampled val bits/byte (mean ± 95% CI)": ("sampled val", "final sampled validation bits/byte (mean ± 95% CI)"),
}
MAX_WORD = 14
"""A column is at least as wide as its longest word, up to this; a longer word folds onto the next line."""
WIDE = ("reading", "verdict")
"""Columns that keep their width longest when a table must shrink (the answer reads on few lines)."""
_DELTA = re.compile(r"Δ vs (?P<base>.+) \((?P<unit>[^()]+)\)")


def abbreviate(header: str) -> tuple[str, str | None]:
    """``(short title, meaning)`` of a column title; the meaning is None where the title is printed as it is."""
    if header in ABBREVIATIONS:
        return ABBREVIATIONS[header]
    m = _DELTA.fullmatch(header)
    if m:
        return "Δ", f"difference vs {m['base']} in {m['unit']} (mean ± 95% CI over paired seeds)"
    return header, None


def table_width(console: Console | None = None) -> int:
    """:data:`WIDTH`, or the terminal's width where stdout is a narrower terminal."""
    console = console or Console(file=sys.stdout)
    return min(WIDTH, console.width) if console.is_terminal else WIDTH


def column_widths(titles: Sequence[str], rows: Sequence[Sequence[str]], room: int,
                  last: Sequence[int] = (), whole: Sequence[int] = ()) -> list[int]:
    """Column widths that sum to at most ``room`` where possible: each column starts as wide as its widest cell or
    title, then the widest column that can still shrink loses one character at a time; none shrinks below its
    longest word (at most :data:`MAX_WORD`), so words wrap whole; columns in ``whole`` (numbers: ``0.512 ± 0.018``,
    ``< 0.001``) not below their longest cell (at most :data:`MAX_WORD`) while the others can still shrink enough.
    Columns in ``last``
    (indices) shrink only once every other column is at its floor (the verdict keeps its width)."""
    cols = [[t, *(r[j] for r in rows)] for j, t in enumerate(titles)]
    widths = [max(cell_len(c) for c in col) for col in cols]

    def floor(col: list[str], whole_cells: bool) -> int:
        return min(max(cell_len(w) for c in col for w in ([c] if whole_cells else c.split() or [""])), MAX_WORD)

    for stage in (set(whole), set()):  # numbers whole while that fits, then every column down to its words
        floors = [floor(col, j in stage) for j, col in enumerate(cols)]
        while sum(widths) > room:
            shrinkable = [j for j in range(len(widths)) if widths[j] > floors[j]]
            if not shrinkable:
                break
            j = max(shrinkable, key=lambda k: (k not in last, widths[k]))
            widths[j] -= 1
    return widths


def render(head: Sequence[str], rows: Sequence[Sequence[str]], *, title: str | None = None,
           left: Sequence[str] = ("variant",), drop: Sequence[str] = (), where: str = "report.md",
           styles: Sequence[str | None] | None = None, width: int | None = None) -> list:
    """The rich renderables of one table (the table, then its legend and dropped-columns lines) at ``width``.
    ``left``: titles of left-aligned (text) columns; the others are right-aligned numbers that wrap only at spaces.
    ``drop``: titles left out here (named under the table as being in ``where``)."""
    keep = [i for i, h in enumerate(head) if h not in drop]
    width = width or table_width()
    table = Table(title=printable(title) if title else None, box=box.SIMPLE_HEAD, show_edge=False, padding=(0, 1),
                  title_justify="left")
    legend, titles = [], []
    for i in keep:
        short, meaning = abbreviate(head[i])
        titles.append(short)
        if meaning:
            legend.append(f"{short} = {meaning}")
    cells = [[printable(str(r[i])) for i in keep] for r in rows]
    wide = [j for j, i in enumerate(keep) if head[i] in WIDE]
    numbers = [j for j, i in enumerate(keep) if head[i] not in left]
    for short, i, w in zip(titles, keep, column_widths(titles, cells, width - 3 * len(keep) + 1, wide, numbers)):
        table.add_column(short, justify="left" if head[i] in left else "right", overflow="fold", width=w)
    for j, r in enumerate(rows):
        table.add_row(*cells[j], style=(styles[j] if styles else None))
    out: list = [table]
    if legend:
        out.append(printable("; ".join(legend)) + ".")
    left_out = [h for h in head if h in drop]
    if left_out:
        out.append(printable(f"Not shown here: {', '.join(left_out)} ({where})."))
    return out


def print_table(head: Sequence[str], rows: Sequence[Sequence[str]], *, console: Console | None = None,
                **kw) -> None:
    """Print :func:`render`'s table on stdout (or ``console``) at :func:`table_width`."""
    console = console or Console(file=sys.stdout, markup=False, highlight=False)
    width = table_width(console)
    console = Console(file=console.file, width=width, markup=False, highlight=False,
                      force_terminal=console.is_terminal, no_color=not console.is_terminal)
    for r in render(head, rows, width=width, **kw):
        console.print(r)
