"""normlab.markdown and the report's writers: hostile variant names are escaped in report.md / report.html
and printed literally, in the surgery sections too; the report never writes through a symlink out of the sweep
directory."""

from __future__ import annotations

import json

import pytest

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
