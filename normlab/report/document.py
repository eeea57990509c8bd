"""The report's document model, written once per section and rendered to HTML and to Markdown.

A section builder returns :class:`Section` values (a title and a list of blocks); :func:`to_html` and
:func:`to_markdown` render a whole :class:`Document`. Blocks: :class:`Paragraph`, :class:`Note` (small grey text),
:class:`Bullets`, :class:`Fields` (key: value pairs), :class:`Table` (cells are text or :class:`Code`),
:class:`Figure` (a PNG: inline base64 in HTML, a file link in Markdown), :class:`Panels` (titled figures side by
side), :class:`Preformatted`, :class:`Details` (a collapsed code block), :class:`Subheading`, and two HTML-only
pieces: :class:`Html` (markup as written) and :class:`Break` (a line break in the HTML source, no effect on the
page). ``only="html"`` / ``"md"`` on a paragraph or note keeps it to one rendering.

All user text goes through one escaper per format: ``html.escape`` and :mod:`normlab.markdown`. In Markdown every
block ends with a blank line; a document is its lines joined by newlines.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Literal, Union

from normlab.markdown import md_code, md_escape, md_fence

Format = Literal["html", "md"]

CSS = """
body{font-family:-apple-system,"Segoe UI",Roboto,"DejaVu Sans",Helvetica,Arial,sans-serif;margin:0;color:#1d232a;
background:#f6f7f9}
main{max-width:1120px;margin:0 auto;padding:24px 32px 48px;background:#fff;min-height:100vh;box-sizing:border-box}
h1,h2,h3,p,li,.note,.sub,summary{overflow-wrap:anywhere}
.tw{overflow-x:auto;max-width:100%;margin:8px 0 4px}
.tw>table{margin:0}
.tw tr>:last-child{position:sticky;right:0;background:#fff;box-shadow:-1px 0 0 #e3e6ea}
.tw tr>th:last-child{background:#f0f2f5}
.tw tr.best>td:last-child{background:#eaf6ec}
.tw td.l:last-child{min-width:14em}
h1{font-size:26px;margin:4px 0 2px}
h2{font-size:19px;margin:30px 0 8px;border-bottom:1px solid #e3e6ea;padding-bottom:4px}
h3{font-size:15px;margin:18px 0 6px}
.sub{color:#5b6470;font-size:13px;margin-bottom:14px}
table{border-collapse:collapse;font-size:13px;margin:8px 0 4px}
th,td{border-bottom:1px solid #e3e6ea;padding:5px 10px;text-align:right;white-space:nowrap}
th{background:#f0f2f5;font-weight:600}
td.l,th.l{text-align:left}
td.l{white-space:normal;min-width:6em;max-width:30em;overflow-wrap:anywhere}
tr.best td{background:#eaf6ec;font-weight:600}
tr.div td{color:#a33}
ul.summary li{margin:4px 0;line-height:1.45}
img{max-width:100%;height:auto;display:block;margin:8px 0}
code,pre{font-family:"DejaVu Sans Mono",Menlo,Consolas,monospace;font-size:12px}
pre{background:#f4f5f7;padding:8px 10px;overflow-x:auto;border-radius:4px;margin:6px 0}
details{margin:4px 0}summary{cursor:pointer;font-size:13px}
.note{color:#5b6470;font-size:12px}
.grid{display:flex;flex-wrap:wrap;gap:10px}.grid>div{flex:1 1 480px}
"""


@dataclass(frozen=True)
class Code:
    """Inline code in a table cell."""

    text: str


Cell = Union[str, Code]


@dataclass(frozen=True)
class Paragraph:
    text: str
    only: Format | None = None


@dataclass(frozen=True)
class Note:
    """An explanatory note (HTML: small grey text; Markdown: a paragraph)."""

    text: str
    only: Format | None = None


@dataclass(frozen=True)
class Bullets:
    items: Sequence[str]


@dataclass(frozen=True)
class Fields:
    """``(key, value)`` pairs: a two-column table in HTML, ``- **key**: value`` in Markdown."""

    items: Sequence[tuple[str, str]]


@dataclass(frozen=True)
class Table:
    """``head`` and ``rows`` of cells. ``left``: indexes of left-aligned columns (HTML class ``l``, Markdown
    ``:---``); ``md_left``: the Markdown alignment where it differs. HTML only: ``row_class`` (one per row, for
    ``<tr class=...>``), ``class_every_cell`` (right-aligned cells carry ``class=''`` too), ``row_lines`` (each row
    on its own source line)."""

    head: Sequence[str]
    rows: Sequence[Sequence[Cell]]
    left: Collection[int] = ()
    md_left: Collection[int] | None = None
    row_class: Sequence[str] | None = None
    class_every_cell: bool = False
    row_lines: bool = False


@dataclass(frozen=True)
class Figure:
    """A PNG figure ``name`` (the file written next to report.md); renders nothing when ``png`` is None."""

    name: str
    caption: str
    png: bytes | None = field(default=None, repr=False)


@dataclass(frozen=True)
class Panels:
    """``(title, figure)`` panels side by side (HTML grid; Markdown: a ``###`` heading per panel)."""

    panels: Sequence[tuple[str, Figure]]


@dataclass(frozen=True)
class Preformatted:
    text: str
    info: str = ""  # the Markdown fence's info string (a language name)


@dataclass(frozen=True)
class Details:
    """A collapsed block: the summary ``label: text`` (label in bold in HTML), opening to ``body`` as code."""

    label: str
    text: str
    body: str
    info: str = ""


@dataclass(frozen=True)
class Subheading:
    text: str


@dataclass(frozen=True)
class Html:
    """HTML markup placed as written (HTML only)."""

    markup: str


@dataclass(frozen=True)
class Break:
    """A line break in the HTML source (no effect on the page; nothing in Markdown)."""


Block = Union[Paragraph, Note, Bullets, Fields, Table, Figure, Panels, Preformatted, Details, Subheading, Html, Break]


@dataclass(frozen=True)
class Section:
    """One ``<h2>`` / ``##`` section of a report."""

    title: str
    blocks: Sequence[Block]

    def figures(self) -> dict[str, bytes]:
        """``{file name: PNG bytes}`` of the figures this section shows."""
        figs = [b for b in self.blocks if isinstance(b, Figure)]
        figs += [f for b in self.blocks if isinstance(b, Panels) for _, f in b.panels]
        return {f.name: f.png for f in figs if f.png}


@dataclass(frozen=True)
class Document:
    title: str
    subtitle: str
    sections: Sequence[Section]

    def figures(self) -> dict[str, bytes]:
        return {n: png for s in self.sections for n, png in s.figures().items()}


# ---------------------------------------------------------------------------------------------------------- HTML
e = html.escape


def _img(f: Figure) -> str:
    if not f.png:
        return ""
    return f"<img alt='{e(f.caption)}' src='data:image/png;base64,{base64.b64encode(f.png).decode()}'>"


def _html_cell(tag: str, c: Cell, left: bool, every: bool) -> str:
    cls = f" class='{'l' if left else ''}'" if left or every else ""
    inner = f"<code>{e(c.text)}</code>" if isinstance(c, Code) else e(c)
    return f"<{tag}{cls}>{inner}</{tag}>"


def _html_table(t: Table) -> str:
    sep = "\n" if t.row_lines else ""
    out = ["<table><tr>" + "".join(_html_cell("th", c, i in t.left, t.class_every_cell)
                                   for i, c in enumerate(t.head)) + "</tr>"]
    for j, r in enumerate(t.rows):
        tr = "<tr>" if t.row_class is None else f"<tr class='{t.row_class[j]}'>"
        out.append(sep + tr + "".join(_html_cell("td", c, i in t.left, t.class_every_cell)
                                      for i, c in enumerate(r)) + "</tr>")
    return "<div class='tw'>" + "".join(out) + sep + "</table></div>"


def block_html(b: Block) -> str:
    if isinstance(b, (Paragraph, Note)):
        if b.only == "md":
            return ""
        return f"<p>{e(b.text)}</p>" if isinstance(b, Paragraph) else f"<div class='note'>{e(b.text)}</div>"
    if isinstance(b, Bullets):
        return "<ul class='summary'>" + "".join(f"<li>{e(s)}</li>" for s in b.items) + "</ul>"
    if isinstance(b, Fields):
        return "<div class='tw'><table>" + "".join(f"<tr><th class='l'>{e(k)}</th><td class='l'>{e(v)}</td></tr>"
                                                   for k, v in b.items) + "</table></div>"
    if isinstance(b, Table):
        return _html_table(b)
    if isinstance(b, Figure):
        return _img(b)
    if isinstance(b, Panels):
        return ("<div class='grid'>" + "".join(f"\n<div><h3>{e(t)}</h3>{_img(f)}</div>" for t, f in b.panels)
                + "\n</div>")
    if isinstance(b, Preformatted):
        return f"<pre>{e(b.text)}</pre>"
    if isinstance(b, Details):
        return f"<details><summary><b>{e(b.label)}</b>: {e(b.text)}</summary><pre>{e(b.body)}</pre></details>"
    if isinstance(b, Subheading):
        return f"<h3>{e(b.text)}</h3>"
    if isinstance(b, Html):
        return b.markup
    if isinstance(b, Break):
        return "\n"
    raise TypeError(f"not a report block: {b!r}")


def section_html(s: Section) -> str:
    return f"<h2>{e(s.title)}</h2>" + "".join(block_html(b) for b in s.blocks)


def to_html(doc: Document) -> str:
    """A self-contained page: inline CSS, figures as base64 PNG; each section starts on a new source line."""
    head = (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{e(doc.title)}</title>"
            f"<style>{CSS}</style></head><body><main>")
    parts = [head, f"<h1>{e(doc.title)}</h1><div class='sub'>{e(doc.subtitle)}</div>"]
    parts += [section_html(s) for s in doc.sections]
    return "\n".join([*parts, "</main></body></html>"])


# ------------------------------------------------------------------------------------------------------ Markdown
def _md_cell(c: Cell) -> str:
    return md_code(c.text, in_table=True) if isinstance(c, Code) else md_escape(c)


def _md_table(t: Table) -> list[str]:
    left = t.left if t.md_left is None else t.md_left
    lines = ["| " + " | ".join(md_escape(c) for c in t.head) + " |",
             "| " + " | ".join(":---" if i in left else "---:" for i in range(len(t.head))) + " |"]
    return lines + ["| " + " | ".join(_md_cell(c) for c in r) + " |" for r in t.rows] + [""]


def _md_img(f: Figure) -> list[str]:
    return [f"![{md_escape(f.caption)}]({f.name})", ""] if f.png else []


def block_md(b: Block) -> list[str]:
    """The block's Markdown lines, ending with a blank line (none for an HTML-only block)."""
    if isinstance(b, (Paragraph, Note)):
        return [] if b.only == "html" else [md_escape(b.text), ""]
    if isinstance(b, Bullets):
        return [f"- {md_escape(s)}" for s in b.items] + [""]
    if isinstance(b, Fields):
        return [f"- **{md_escape(k)}**: {md_escape(v)}" for k, v in b.items] + [""]
    if isinstance(b, Table):
        return _md_table(b)
    if isinstance(b, Figure):
        return _md_img(b)
    if isinstance(b, Panels):
        return [x for t, f in b.panels for x in [f"### {md_escape(t)}", "", *_md_img(f)]]
    if isinstance(b, Preformatted):
        return [*md_fence(b.text, b.info), ""]
    if isinstance(b, Details):
        return [f"<details><summary>{md_escape(b.label)}: {md_escape(b.text)}</summary>", "",
                *md_fence(b.body, b.info), "", "</details>", ""]
    if isinstance(b, Subheading):
        return [f"### {md_escape(b.text)}", ""]
    if isinstance(b, (Html, Break)):
        return []
    raise TypeError(f"not a report block: {b!r}")


def section_md(s: Section) -> list[str]:
    return [f"## {md_escape(s.title)}", ""] + [x for b in s.blocks for x in block_md(b)]


def to_markdown(doc: Document) -> str:
    """The document as Markdown (CommonMark + GFM tables), figures linked as files next to it."""
    lines = [f"# {md_escape(doc.title)}", "", f"_{md_escape(doc.subtitle)}_", ""]
    lines += [x for s in doc.sections for x in section_md(s)]
    return "\n".join(lines) + "\n"
