"""normlab.markdown and the report's writers: hostile variant names are escaped in report.md / report.html
and printed literally, in the surgery sections too; the report never writes through a symlink out of the sweep
directory.

The one Markdown escaper (normlab.markdown) and every Markdown writer that uses it (issue 27 item 5).

Independent reference: markdown-it-py (CommonMark with GFM tables and strikethrough, raw HTML passed through as a
permissive viewer does) renders what normlab writes; planted markup in every user-controlled string (variant and
baseline names, the sweep name, run ids / directory names, paths in docs/claims.md) must come out as text, never
as a tag, link, emphasis, heading or table cell break, in report.md and in report.html."""

from __future__ import annotations

import html
import json
from pathlib import Path

import pytest
import yaml

from normlab.config import config_from_dict
from normlab.markdown import md_code, md_escape, md_fence, md_table
from tests.helpers import HOSTILE, assert_bad_input, make_sweep, run_inproc

pytestmark = pytest.mark.usefixtures("one_thread")


def test_report_escapes_names_and_prints_them_literally(tmp_path, cache):
    s = make_sweep(tmp_path / "s")
    proc = run_inproc("report", str(s), cache=cache)
    assert proc.returncode == 0, proc.stderr
    assert "[/bold]x" in proc.stdout  # printed as written, not read as rich markup
    md, page = (s / "report.md").read_text(), (s / "report.html").read_text()
    assert "<script>" not in md and "&lt;script&gt;alert(1)&lt;/script&gt;" in md
    assert "<script>alert" not in page
    assert "<details><summary>&lt;script&gt;" in md  # also inside the <details> block
    assert "| a\\|b\\*\\_c\\_ |" in md  # Markdown punctuation of a name cannot break the table or add emphasis
    # the seed without a final result is named, not silently dropped
    summary = json.loads(run_inproc("report", str(s), "--json", cache=cache).stdout)["summary"]
    assert any(line.startswith("[/bold]x: 1 of 2 seeds have no final result (r3") for line in summary), summary
    proc = run_inproc("runs", str(s), cache=cache)
    assert proc.returncode == 0 and "[/bold]x" in proc.stdout, proc.stderr
    assert_bad_input(run_inproc("eval", str(tmp_path / "a[/bold]"), cache=cache), "a[/bold]", "does not exist")


def test_report_surgery_sections_escape_names(tmp_path, cache):
    """report --quantize --label-free: the W4 rows and the label-free section carry hostile variant names escaped
    in report.md (entities + backslashed Markdown) and report.html, as the rest of the report does."""
    from normlab.surgery.robustness import FORMAT

    rows = [(v, s, "completed", 1.5 + i / 10) for i, (v, s, _, _) in enumerate(HOSTILE)]
    s = make_sweep(tmp_path / "s", rows)
    for i in range(len(rows)):
        r = s / "runs" / f"r{i}"
        r.mkdir(parents=True)
        (r / "quant_robustness.json").write_text(json.dumps({
            "settings": {"format": FORMAT, "max_tokens": 8192, "bits": 4}, "bpb": 2.0, "w4_rtn": 0.01 + i / 100,
            "w4_hadamard": 0.005, "hadamard_error": None, "max_act_outlier_ratio": 3.0}))
        (r / "label_free.json").write_text(json.dumps({
            "settings": {"format": FORMAT, "max_tokens": 8192}, "mano": 0.5 - i / 100,
            "matrix_nuclear_norm": 1.0 + i, "loss": 2.0 + i / 10, "bpb": 3.0}))
    proc = run_inproc("report", str(s), "--quantize", "--label-free", cache=cache)
    assert proc.returncode == 0, proc.stderr
    md, page = (s / "report.md").read_text(), (s / "report.html").read_text()
    block = md[md.index("## Label-free metrics"):].split("\n## ")[0]
    assert "| &lt;script&gt;alert(1)&lt;/script&gt; | " in block and "| \\[/bold\\]x | " in block
    assert "| a\\|b\\*\\_c\\_ | " in block  # a name cannot break the table or add emphasis
    assert "<script>" not in md and "<script>alert" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;</td>" in page[page.index("Label-free metrics"):]


def test_report_never_writes_through_a_symlink_out_of_the_sweep_dir(tmp_path, cache):
    s = make_sweep(tmp_path / "s", HOSTILE[:2])
    victim = tmp_path / "victim.md"
    victim.write_text("precious")
    (s / "report.md").symlink_to(victim)
    assert_bad_input(run_inproc("report", str(s), cache=cache), "refusing to write", "report.md")
    assert victim.read_text() == "precious" and not (s / "report.html").exists()


# ---------------------------------------------------------------- the one Markdown escaper and its writers
EVIL = [
    "<script>alert(1)</script>",
    "<img src=x onerror=alert(2)>",
    "a|b | c",
    "**bold** _em_ ~~gone~~ `code`",
    "[link](http://e.vil) ![img](http://e.vil/x.png)",
    "# heading",
    "line\n## injected heading\n| x |",
    "back\\slash \\<b>not bold</b>",
    "&amp; &lt;b&gt; entity",
    "``` fence",
]
LIVE = [r"<script", r"<svg", r"<img\s[^>]*src=(?!['\"]?(data:|report_))", r"<b onclick", r"<b>not bold</b>",
        r"<del>", r"<s>", r"<a\s",
        r"<strong>(bold|b)</strong>", r"<code>(c|code|x)</code>", r"<em>em</em>", r"<h[1-6]>(injected|h)\b"]
"""Tags planted markup would produce (the report's own images are data: URIs or report_*.png)."""


def _md():
    from markdown_it import MarkdownIt

    return MarkdownIt("commonmark").enable(["table", "strikethrough"])


def _text_of(inline_tokens) -> str:
    """The text a renderer shows for inline tokens; fails on anything but text (no tags, links, emphasis)."""
    out = []
    for t in inline_tokens:
        assert t.type in ("text", "softbreak"), (t.type, t.content)
        out.append(t.content if t.type == "text" else "\n")
    return "".join(out)


def _folded(s: str) -> str:
    return s.replace("\n", " ")


@pytest.mark.parametrize("s", EVIL)
def test_escaped_text_renders_as_exactly_itself(s):
    md = _md()
    # a paragraph, a heading and a table cell: the renderer shows the original string, as plain text
    para = md.parse(md_escape(s))
    assert [t.type for t in para] == ["paragraph_open", "inline", "paragraph_close"]
    assert _text_of(para[1].children) == _folded(s)
    head = md.parse("## Paired differences vs " + md_escape(s))
    assert head[0].tag == "h2" and _text_of(head[1].children) == "Paired differences vs " + _folded(s)
    table = md.parse(md_table(["variant", "x"], [[s, "1"]], [":---", "---:"]))
    cells = [t for t in table if t.type == "inline"]
    assert len(cells) == 4, "no extra cells, rows or blocks"
    assert _text_of(cells[2].children) == _folded(s) and _text_of(cells[3].children) == "1"


@pytest.mark.parametrize("s", EVIL)
def test_code_spans_and_fences_hold_any_text(s):
    md = _md()
    toks = md.parse(f"run {md_code(s)} now")[1].children
    assert [t.type for t in toks] == ["text", "code_inline", "text"] and toks[1].content == _folded(s).strip()
    fence = md.parse("\n".join(md_fence(s + "\n```\nafter")))
    assert [t.type for t in fence] == ["fence"] and fence[0].content.rstrip("\n") == s + "\n```\nafter"
    cell = md.parse(md_table(["c"], [["x"]]).replace("| x |", f"| {md_code(s, in_table=True)} |"))
    inline = [t for t in cell if t.type == "inline"]
    assert len(inline) == 2 and [c.type for c in inline[1].children] == ["code_inline"]


def _no_live_markup(rendered: str) -> None:
    import re

    for pattern in LIVE:
        m = re.search(pattern, rendered, re.I)
        assert m is None, rendered[max(0, m.start() - 80): m.end() + 80]


# -- the report: planted markup in every user-controlled string --------------------------------------------------
VARIANTS = {"<script>alert(1)</script>": [2.0, 2.01, 2.02], "<img src=x onerror=alert(2)>": [2.5, 2.51, 2.52],
            "**b** [l](http://e.vil) ~~s~~ `c` # h": [2.001, 2.2, 2.0]}
SWEEP_NAME = "<svg onload=alert(3)>_sweep_"


def _sweep(d: Path) -> Path:
    from normlab.experiments.store import Store
    from normlab.experiments.worker import record

    d.mkdir(parents=True)
    store = Store(d / "results.sqlite")
    store.create(SWEEP_NAME, "f" * 16)
    runs = []
    for i, (v, finals) in enumerate(VARIANTS.items()):
        for seed in range(3):
            runs.append({"run_id": f"v{i}<b onclick=x>id-s{seed}", "position": len(runs), "variant": v, "seed": seed,
                         "config_hash": f"{i}{seed}", "axes": {"variant": v}, "overrides": {"model.norm": "rmsnorm"},
                         "config": {"seed": seed, "data": {"source": "synthetic:markov?order=2", "tokenizer": "bytes"},
                                    "model": {"width": 32, "depth": 1, "heads": 2, "context": 32},
                                    "train": {"steps": 20, "batch_size": 8, "lr": 0.003}}})
    store.register(runs)
    for r in runs:
        final = VARIANTS[r["variant"]][r["seed"]]
        run_dir = d / "runs" / r["run_id"]
        run_dir.mkdir(parents=True)
        # every section, as normlab train writes it (rundir.readers.open_config refuses a run config without one)
        (run_dir / "config.yaml").write_text(yaml.safe_dump(config_from_dict(r["config"]).to_dict()))
        recs = [{"step": s, "loss": 3.0 - s / 20, "val_bpb": final + (0.3 if s == 10 else 0.0)} for s in (10, 20)]
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in recs))
        summary = {"status": "completed", "step": 20, "steps": 20, "val_bpb": final, "best_val_bpb": final,
                   "init_val_bpb": 8.0,
                   "params": 1000}
        (run_dir / "summary.json").write_text(json.dumps(summary))
        record(store, d, r["run_id"], summary, peak_mem_mb=10.0)
    return d


def test_report_escapes_every_user_string_in_html_and_markdown(tmp_path):
    d = _sweep(tmp_path / "s")
    baseline = "**b** [l](http://e.vil) ~~s~~ `c` # h"
    proc = run_inproc("report", str(d), "--baseline", baseline, "--json", cache=tmp_path / "cache")
    assert proc.returncode == 0, proc.stderr
    page, md_text = (d / "report.html").read_text(), (d / "report.md").read_text()
    body = page.split("</style>", 1)[1]
    _no_live_markup(body)
    assert f"Paired differences vs {html.escape(baseline, quote=False)}</h2>" in body
    for v in VARIANTS:
        assert html.escape(v, quote=False) in body
    rendered = _md().render(md_text)
    _no_live_markup(rendered)
    assert 'href="http://e.vil"' not in rendered
    tokens = _md().parse(md_text)
    headings = [tokens[i + 1].content for i, t in enumerate(tokens) if t.type == "heading_open"]
    assert any(h.startswith("Paired differences vs ") for h in headings)
    h2 = [tokens[i + 1] for i, t in enumerate(tokens) if t.type == "heading_open"]
    paired = next(t for t in h2 if t.content.startswith("Paired differences vs "))
    assert _text_of(paired.children) == "Paired differences vs " + baseline  # shown exactly, nothing live
    assert _text_of(h2[0].children) == "normlab compare: " + SWEEP_NAME  # the title: the sweep name as text
    # every table row keeps its column count (no '|' in a name splits a cell)
    for i, t in enumerate(tokens):
        if t.type == "tr_open":
            j = i + 1
            n = 0
            while tokens[j].type != "tr_close":
                n += tokens[j].type in ("td_open", "th_open")
                j += 1
            k = i - 1
            while tokens[k].type != "table_open":
                k -= 1
            first = k + 2  # thead_open, tr_open
            m = 0
            j = first + 1
            while tokens[j].type != "tr_close":
                m += tokens[j].type == "th_open"
                j += 1
            assert n == m


def test_report_of_run_dirs_with_markup_in_their_names(tmp_path):
    d = _sweep(tmp_path / "s")
    runs = sorted((d / "runs").iterdir())[:2]
    out = tmp_path / "rep"
    proc = run_inproc("report", *map(str, runs), "--out", str(out), cache=tmp_path / "cache")
    assert proc.returncode == 0, proc.stderr
    _no_live_markup((out / "report.html").read_text().split("</style>", 1)[1])
    _no_live_markup(_md().render((out / "report.md").read_text()))


def test_report_on_a_list_summary_is_one_line(tmp_path):
    d = _sweep(tmp_path / "s")
    import shutil

    run = tmp_path / "single"  # a run of its own (normlab train's output), not inside a sweep directory
    shutil.copytree(sorted((d / "runs").iterdir())[0], run)
    (run / "summary.json").write_text("[1, 2]")
    proc = run_inproc("report", str(run), "--out", str(tmp_path / "rep"), cache=tmp_path / "cache")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.count("\n") == 1 and "must hold a JSON object" in proc.stderr and "summary.json" in proc.stderr


def test_claims_page_keeps_user_paths_inert(tmp_path):
    from normlab.experiments.claims.docs import write_docs

    evil_out = "runs/`x`<img src=x onerror=alert(5)>|y"
    report = {"budget": "tiny", "seeds": 2, "command": "normlab claims --out '```\n# <script>alert(6)</script>'",
              "elapsed_s": 60.0, "trained_runs": 1, "reused_runs": 0, "claims": [], "out": evil_out,
              "machine": {"platform": "linux", "cpu_count": 2, "python": "3", "torch": "2", "loadavg_at_end": 1.0},
              "budget_spec": {"source": "corpus`<img src=y onerror=alert(7)>", "context": 32, "width": 32,
                              "heads": 2, "depth": 1, "deep_depth": 2, "steps": 10, "batch_size": 4, "lr": 0.003,
                              "warmup_steps": 2}}
    path = tmp_path / "claims.md"
    write_docs(report, path)
    text = path.read_text()
    rendered = _md().render(text)
    _no_live_markup(rendered)
    tokens = _md().parse(text)
    fences = [t for t in tokens if t.type == "fence"]
    assert fences and fences[0].content.rstrip("\n") == report["command"]
    codes = [c.content for t in tokens if t.type == "inline" for c in t.children if c.type == "code_inline"]
    assert f"{evil_out}/claims.json" in codes and report["budget_spec"]["source"] in codes


def test_scaling_section_escapes_variant_names(tmp_path):
    """A size sweep whose variants are named with markup: the scaling section's sentences and tables (which quote
    the names) are text in report.md and report.html."""
    from normlab.experiments.sweep import parse_sweep
    from normlab.experiments.worker import record
    from tests.helpers import register_sweep
    from tests.report.test_scaling import BASE, LAWS, _non_embedding

    names = {"<img src=x onerror=alert(8)>": "pre", "**b** [l](http://e.vil) `c`": "post"}
    sweep = parse_sweep({"name": "sizes", "base": BASE, "seeds": [0, 1], "sizes": [[16, 1], [32, 1], [48, 2], [64, 3]],
                         "variants": [{"name": n, "set": {"model.placement": p}} for n, p in names.items()]})
    d = tmp_path / "sizes"
    store = register_sweep(d, sweep)
    for r in sweep.runs:
        law = LAWS["Pre" if names[r.axes["variant"]] == "pre" else "Post"]
        final = float(law(_non_embedding(r.config))) * (1.0 + (0.004 if r.seed else -0.004))
        run_dir = d / "runs" / r.run_id
        run_dir.mkdir(parents=True)
        recs = [{"step": s + 1, "loss": 2.0, "val_bpb": final + 0.01 * (4 - s)} for s in range(5)]
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in recs))
        summary = {"status": "completed", "step": 5, "steps": 5, "val_bpb": final, "best_val_bpb": final,
                   "params": 1000}
        record(store, d, r.run_id, summary, peak_mem_mb=1.0)
    proc = run_inproc("report", str(d), cache=tmp_path / "c")
    assert proc.returncode == 0, proc.stderr
    md_text = (d / "report.md").read_text()
    rendered = _md().render(md_text)
    section = rendered.split("<h2>Scaling</h2>", 1)[1].split("<h2>", 1)[0]
    for n in names:  # quoted in the section's sentences and tables, shown as exactly their text
        assert html.escape(n, quote=False) in section, n
    _no_live_markup(rendered)
    assert 'href="http://e.vil"' not in rendered
    _no_live_markup((d / "report.html").read_text().split("</style>", 1)[1])


@pytest.mark.parametrize("s", ["R\x1b[31m<b>x", "bell\x07 del\x7f c1\x9b tab\tend", "osc\x1b]0;title\x07"])
def test_control_characters_are_shown_as_escapes_never_written_raw(s):
    """A control character other than a line break (an ANSI escape in a directory name that became a run id) is
    written as its Python escape by md_escape and md_code, so `cat report.md` shows it instead of obeying it; the
    renderer shows exactly that escape (safety.printable's spelling) as text."""
    shown = s.encode("unicode_escape").decode("ascii").replace("\\\\", "\\")  # \x1b, \x07, \t ...; '<' kept
    for out in (md_escape(s), md_code(s), md_code(s, in_table=True)):
        assert all(c.isprintable() for c in out), out
    md = _md()
    assert _text_of(md.parse(md_escape(s))[1].children) == shown
    assert md.parse(f"run {md_code(s)} now")[1].children[1].content == shown
