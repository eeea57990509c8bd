"""The report's document model (normlab.report.document): one section rendered to HTML and to Markdown shows the
same text in both, read back by independent parsers (Python's html.parser; markdown-it, a CommonMark + GFM
parser); the report is the sections of render.SECTIONS in order, and a builder added there appears in it."""

from __future__ import annotations

import base64
from html.parser import HTMLParser

import pytest

from normlab.report import render
from normlab.report.document import (Break, Bullets, Code, Details, Document, Fields, Figure, Html, Note, Panels,
                                     Paragraph, Preformatted, Section, Subheading, Table, section_html, to_html,
                                     to_markdown)

EVIL = "<b>x</b> | *y* _z_ `q` [l](u) # ~ ! & 'a' \"b\""
PNG = b"\x89PNG\r\n\x1a\nnot really a png"


def _doc() -> Document:
    return Document(f"title {EVIL}", "sub", [
        Section(f"vs {EVIL}", [
            Bullets(["one", EVIL]),
            Table(["variant", "n"], [[EVIL, "1"], ["b", Code(f"cmd {EVIL}")]], left={0}, row_class=["best", ""],
                  class_every_cell=True),
            Note(EVIL), Note("html note", only="html"), Paragraph("md paragraph", only="md"), Break(),
            Figure("report_x.png", f"cap {EVIL}", PNG), Figure("report_missing.png", "absent", None)]),
        Section("Second", [Fields([("key", EVIL)]), Subheading("sub3"), Preformatted(f"line1\n{EVIL}\n```"),
                           Details("name", "a=1", "k: v\n", "yaml"), Html("<div class='x'>raw</div>"),
                           Panels([("panel", Figure("report_p.png", "p", PNG))])]),
    ])


class _Text(HTMLParser):
    """Text of each element by tag, and img attributes."""

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []
        self.text: dict[str, list[str]] = {}
        self.imgs: list[dict[str, str | None]] = []

    def handle_starttag(self, tag, attrs):
        if tag in ("img", "meta"):  # void elements
            if tag == "img":
                self.imgs.append(dict(attrs))
            return
        self.stack.append(tag)
        self.text.setdefault(tag, []).append("")

    def handle_endtag(self, tag):
        assert self.stack.pop() == tag

    def handle_data(self, data):
        for tag in self.stack[-1:]:
            self.text[tag][-1] += data


def test_html_shows_every_text_as_written_once():
    p = _Text()
    p.feed(to_html(_doc()))
    assert p.stack == [] and p.text["title"] == [f"title {EVIL}"] and p.text["h1"] == [f"title {EVIL}"]
    assert p.text["h2"] == [f"vs {EVIL}", "Second"] and p.text["h3"] == ["sub3", "panel"]
    assert p.text["li"] == ["one", EVIL]
    assert p.text["th"][:2] == ["variant", "n"] and p.text["td"][:3] == [EVIL, "1", "b"]
    assert p.text["code"] == [f"cmd {EVIL}"]
    assert p.text["th"][2:] == ["key"] and p.text["td"][4:] == [EVIL]  # Fields: key / value rows
    assert p.text["pre"] == [f"line1\n{EVIL}\n```", "k: v\n"] and p.text["b"] == ["name"]
    assert [d for d in p.text["div"] if d in (EVIL, "html note", "raw")] == [EVIL, "html note", "raw"]
    assert "md paragraph" not in to_html(_doc())
    assert [(i["alt"], base64.b64decode(i["src"].split(",", 1)[1])) for i in p.imgs] == [
        (f"cap {EVIL}", PNG), ("p", PNG)]  # the figure without a PNG renders nothing


def test_table_html_classes_and_row_lines():
    t = Table(["a", "b"], [["1", "2"]], left={0})
    assert section_html(Section("S", [t])) == (
        "<h2>S</h2><div class='tw'><table><tr><th class='l'>a</th><th>b</th></tr>"
        "<tr><td class='l'>1</td><td>2</td></tr></table></div>")  # a box of its own: a wide table scrolls there
    t = Table(["a", "b"], [["1", "2"], ["3", "4"]], left={1}, row_class=["best", "div"], class_every_cell=True,
              row_lines=True)
    assert section_html(Section("S", [t])).splitlines() == [
        "<h2>S</h2><div class='tw'><table><tr><th class=''>a</th><th class='l'>b</th></tr>",
        "<tr class='best'><td class=''>1</td><td class='l'>2</td></tr>",
        "<tr class='div'><td class=''>3</td><td class='l'>4</td></tr>", "</table></div>"]


def _md():
    markdown_it = pytest.importorskip("markdown_it")
    return markdown_it.MarkdownIt("commonmark").enable(["table", "strikethrough"])


def _inline_text(tok) -> str:
    out = []
    for t in tok.children:
        assert t.type in ("text", "code_inline"), (t.type, t.content)  # no tag, link or emphasis got through
        out.append(t.content)
    return "".join(out)


def test_markdown_shows_every_text_as_written_once():
    text = to_markdown(_doc())
    toks = _md().parse(text)
    heads = [(toks[i].tag, _inline_text(toks[i + 1])) for i, t in enumerate(toks) if t.type == "heading_open"]
    assert heads == [("h1", f"title {EVIL}"), ("h2", f"vs {EVIL}"), ("h2", "Second"), ("h3", "sub3"), ("h3", "panel")]
    cells = [_inline_text(toks[i + 1]) for i, t in enumerate(toks) if t.type in ("th_open", "td_open")]
    assert cells == ["variant", "n", EVIL, "1", "b", f"cmd {EVIL}"]
    codes = [c for t in toks if t.type == "inline" for c in t.children if c.type == "code_inline"]
    assert [c.content for c in codes] == [f"cmd {EVIL}"]
    sub, *paras = [toks[i + 1] for i, t in enumerate(toks) if t.type == "paragraph_open" and t.level == 0]
    assert [c.type for c in sub.children] == ["em_open", "text", "em_close"]  # the subtitle, in italics
    paras = [_inline_text(p) for p in paras if all(c.type != "image" for c in p.children)]
    assert EVIL in paras and "md paragraph" in paras and "html note" not in text and "raw" not in text
    items = [toks[i + 2] for i, t in enumerate(toks) if t.type == "list_item_open"]
    assert [_inline_text(t) for t in items[:2]] == ["one", EVIL]
    field = [c for c in items[2].children if c.content or c.type != "text"]  # Fields: **key**: value
    assert [c.type for c in field] == ["strong_open", "text", "strong_close", "text"]
    assert field[1].content == "key" and field[3].content == f": {EVIL}"
    fences = [(t.info, t.content) for t in toks if t.type == "fence"]
    assert fences == [("", f"line1\n{EVIL}\n```\n"), ("yaml", "k: v\n")]
    imgs = [c for t in toks if t.type == "inline" for c in t.children if c.type == "image"]
    assert [(i.attrs["src"], _inline_text(i)) for i in imgs] == [("report_x.png", f"cap {EVIL}"), ("report_p.png", "p")]


def test_markdown_blocks_end_with_a_blank_line():
    doc = Document("t", "s", [Section("S", [Table(["a"], [["1"]]), Note("n"), Break(), Html("<p>x</p>")])])
    assert to_markdown(doc) == "# t\n\n_s_\n\n## S\n\n| a |\n| ---: |\n| 1 |\n\nn\n\n"


def test_figures_are_those_shown():
    assert _doc().figures() == {"report_x.png": PNG, "report_p.png": PNG}


def test_a_registered_builder_appears_in_its_place():
    rep = type("Rep", (), {"meta": {"title": "T"}, "sweep_dir": None})()
    extra = ("extra", lambda r: [Section("Extra", [Paragraph(f"from {r.meta['title']}")])])
    doc = render.document(rep, (("a", lambda r: [Section("A", [])]), extra, ("none", lambda r: [])))
    assert [s.title for s in doc.sections] == ["A", "Extra"] and doc.title == "T"
    names = [n for n, _ in render.SECTIONS]
    assert names[0] == "summary" and names[-2:] == ["setup", "reproduce"] and len(set(names)) == len(names)


# -- the page in a real browser ----------------------------------------------------------------------------------
LAYOUT_PROBE = """<script>
window.addEventListener('load', () => {
  const se = document.scrollingElement;
  const tables = [...document.querySelectorAll('table')].map(t => {
    const box = t.parentElement, r = box.getBoundingClientRect();
    const last = t.querySelector('tr:last-child > :last-child');
    const lr = last ? last.getBoundingClientRect() : null;
    return {head: t.querySelector('tr').textContent.slice(0, 80), boxRight: r.right,
            lastLeft: lr ? lr.left : null, lastRight: lr ? lr.right : null};
  });
  const out = {scrollWidth: se.scrollWidth, innerWidth: window.innerWidth, tables: tables};
  const pre = document.createElement('pre'); pre.id = 'layout-probe'; pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>"""


def browser_layout(report_html, tmp_path, width: int) -> dict:
    """The page at a window ``width`` pixels wide in headless Chromium: the document's scroll width against the
    window's inner width, and per table the right edge of its box and of its last row's last cell (a probe script
    added to a copy of the page; the report itself has no script)."""
    import html as html_lib
    import json
    import re
    import shutil
    import subprocess

    page = tmp_path / f"layout-{width}.html"
    page.write_text(report_html.read_text().replace("</body>", LAYOUT_PROBE + "</body>"))
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    cmd = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars",
           f"--user-data-dir={tmp_path / f'profile-{width}'}", f"--window-size={width},1000",
           "--virtual-time-budget=10000", "--dump-dom", page.resolve().as_uri()]
    dom = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False).stdout
    m = re.search(r"<pre id=\"layout-probe\">(.*?)</pre>", dom, re.S)
    assert m, "the layout probe printed nothing (chromium printed no DOM)"
    return json.loads(html_lib.unescape(m.group(1)))


def _demo_shaped_report(d):
    """A stored learning-rate sweep of the demo's shape (four variants, five learning rates, four seeds, the declared
    question; one variant collapsing at the large rates), its report written."""
    import random

    from normlab.report import write_report
    from tests.report_fakes import fake_grid

    d.mkdir()
    variants = ["Pre-LN", "Peri-LN", "Pre-LN + QK-norm", "Post-LN"]
    rng = random.Random(0)

    def final(v, s, lr):
        if v == "Post-LN" and lr > 0.01:
            return 4.7
        return 3.5 + variants.index(v) * 0.05 + 40 * (lr - 0.004) ** 2 + rng.random() * 0.1

    fake_grid(d, variants, [0, 1, 2, 3], [0.001, 0.00416, 0.0173, 0.0721, 0.3], final, baseline="Pre-LN",
              primary="lr_sensitivity", family=variants[1:])
    write_report(d)
    return d / "report.html"


@pytest.mark.skipif(__import__("shutil").which("chromium") is None and __import__("shutil").which(
    "chromium-browser") is None, reason="chromium is not installed (make test installs Debian's chromium)")
@pytest.mark.parametrize("width", [1280, 1920])
def test_the_report_fits_the_window_without_sideways_scrolling(tmp_path, width):
    """At 1280 and 1920 pixels the page does not scroll sideways (document.scrollingElement.scrollWidth <=
    innerWidth); a table wider than the page scrolls inside its own box, whose right edge is inside the window,
    and every table's last column (the paired table's reading) is visible within the window."""
    layout = browser_layout(_demo_shaped_report(tmp_path / "s"), tmp_path, width)
    assert layout["innerWidth"] == width
    assert layout["scrollWidth"] <= layout["innerWidth"], layout
    assert layout["tables"]
    for t in layout["tables"]:
        assert t["boxRight"] <= width, t
        assert t["lastRight"] is None or t["lastRight"] <= width, t
