"""The one Markdown escaper every Markdown writer uses (report.md, its learning-rate and scaling sections, the
surgery columns, docs/claims.md).

User-controlled text (variant and baseline names, sweep names, run ids, directory names, sentences quoting them)
reaches Markdown only through these functions:

- ``md_escape(text)``: HTML-escaped (``<&>`` as entities, as the HTML report does: a viewer that passes inline
  HTML shows ``<script>`` as text), CommonMark punctuation that starts emphasis, links, images, code, headings,
  tables or strikethrough backslashed (``\\ ` * _ [ ] | # ~ !``), and line breaks folded to spaces (a newline in a
  table cell or heading would start a new block), other control characters written as their Python escapes
  (``\\x1b``: ``cat report.md`` cannot drive a terminal);
- ``md_code(text, in_table=...)``: a code span no backtick inside ``text`` can close (HTML is not interpreted in
  code spans; in a table ``|`` is still backslashed, as GFM requires);
- ``md_fence(text)``: a fenced code block whose fence ``text`` cannot close;
- ``md_table(head, rows, align)``: a GFM table with every cell escaped.

CommonMark spec 0.31 (https://spec.commonmark.org/0.31.2/, "Backslash escapes": any ASCII punctuation may be
backslash-escaped; "Raw HTML"; "Code spans"), GFM tables (https://github.github.com/gfm/#tables-extension-).
"""

from __future__ import annotations

import html
from collections.abc import Sequence

from normlab.errors import printable

_MD_SPECIAL = str.maketrans({c: "\\" + c for c in "\\`*_[]|#~!"})
_BREAKS = str.maketrans({"\r": " ", "\n": " ", "\u2028": " ", "\u2029": " ", "\x0b": " ", "\x0c": " "})


def md_escape(text: object) -> str:
    """``text`` as inert Markdown inline text (see the module docstring); any other control character (an ANSI
    escape from a directory name) is written as its Python escape (``\\x1b``, as ``errors.printable``), so ``cat
    report.md`` cannot drive a terminal."""
    return html.escape(printable(str(text).translate(_BREAKS)), quote=False).translate(_MD_SPECIAL)


def md_code(text: object, *, in_table: bool = False) -> str:
    """``text`` as a code span (a run of backticks longer than any inside it closes it); one line, control
    characters as their Python escapes (as ``md_escape``)."""
    s = printable(str(text).translate(_BREAKS))
    run = 1
    while "`" * run in s:
        run += 1
    fence = "`" * run
    span = f"{fence} {s} {fence}" if "`" in s or s.startswith(" ") else f"{fence}{s}{fence}"
    return span.replace("|", "\\|") if in_table else span


def md_fence(text: str, info: str = "") -> list[str]:
    """A fenced code block (lines) whose fence is longer than any backtick run in ``text``, so the text cannot
    close it (CommonMark "Fenced code blocks")."""
    run, longest = 0, 0
    for ch in text:
        run = run + 1 if ch == "`" else 0
        longest = max(longest, run)
    fence = "`" * max(3, longest + 1)
    return [fence + info, text.rstrip("\n"), fence]


def md_table(head: Sequence[object], rows: Sequence[Sequence[object]], align: Sequence[str] | None = None) -> str:
    """A GFM table; every header and body cell through :func:`md_escape`. ``align``: ``:---`` / ``---:`` per
    column (default right-aligned)."""
    align = list(align) if align is not None else ["---:"] * len(head)
    lines = ["| " + " | ".join(md_escape(c) for c in head) + " |", "| " + " | ".join(align) + " |"]
    lines += ["| " + " | ".join(md_escape(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)
