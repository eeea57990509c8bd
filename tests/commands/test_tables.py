"""normlab.commands.tables: terminal tables fit 100 columns, wrap rather than cut, and explain abbreviations."""

from __future__ import annotations

import io
import random

from rich.cells import cell_len
from rich.console import Console

from normlab.commands.tables import ABBREVIATIONS, WIDTH, column_widths, print_table, table_width
from tests.helpers import run_inproc
from tests.report_fakes import fake_grid


def _lines(text: str) -> list[str]:
    return [ln.rstrip() for ln in text.splitlines()]


def test_column_widths_fit_the_room_and_keep_words_whole():
    rng = random.Random(0)
    for _ in range(200):
        n = rng.randint(2, 12)
        titles = [rng.choice(["p", "variant", "reading", "adj. p", "Δ"]) for _ in range(n)]
        rows = [[" ".join("x" * rng.randint(1, 9) for _ in range(rng.randint(1, 6))) for _ in range(n)]
                for _ in range(rng.randint(1, 5))]
        room = rng.randint(20, 120)
        widths = column_widths(titles, rows, room, last=[n - 1])
        words = [max(cell_len(w) for c in [t, *(r[j] for r in rows)] for w in c.split()) for j, t in enumerate(titles)]
        natural = [max(cell_len(c) for c in [t, *(r[j] for r in rows)]) for j, t in enumerate(titles)]
        assert all(min(wd, 14) <= w <= nat for w, wd, nat in zip(widths, words, natural))
        if sum(min(wd, 14) for wd in words) <= room:
            assert sum(widths) <= room  # fits whenever the words allow it
        if widths[-1] < natural[-1]:  # the protected column shrank only after every other one reached its floor
            assert all(w == min(wd, 14) for w, wd in zip(widths[:-1], words[:-1]))


def test_numbers_stay_whole_while_text_can_wrap():
    titles, rows = ["variant", "Δ"], [["Pre-LN + QK-norm", "+0.004 ± 0.018"]]
    assert column_widths(titles, rows, 22, whole=[1]) == [8, 14]  # "Pre-LN +" / "QK-norm"; the number on one line


def test_a_wide_table_fits_with_a_legend_and_loses_no_cell():
    head = ["#", "variant", "LR sensitivity (bits/byte)", "best sampled val bits/byte", "best lr", "stable range",
            "stable width (decades)", "diverged", "seeds", "adjusted p", "reading"]
    rows = [[str(i), f"Pre-LN + QK-norm {i}", "0.442 ± 0.016", "3.642 ± 0.035", "0.001 (seeds: 0.001–0.00416)",
             "0.001 – 0.0173", "1.24 ± 0.00", "0/20", "4", "< 0.001",
             "undecided; ~209 seeds (range 109–563) to resolve (80% power)"] for i in range(3)]
    buf = io.StringIO()
    print_table(head, rows, title="T", left=("variant", "stable range", "reading"), drop=("seeds",),
                console=Console(file=buf, width=200))
    out = buf.getvalue()
    assert max(cell_len(ln) for ln in _lines(out)) <= WIDTH
    assert "…" not in out
    flat = " ".join(out.split())
    for r in rows:  # every word of every kept cell is printed (wrapped, never cut)
        for cell in r[:8] + r[9:]:
            for word in cell.split():
                assert word in flat, word
    for full in ("LR sensitivity (bits/byte)", "stable width (decades)", "adjusted p"):
        short, meaning = ABBREVIATIONS[full]
        assert f"{short} = {meaning}" in flat
    assert "Not shown here: seeds (report.md)." in flat


def test_a_narrow_terminal_narrows_the_table():
    assert table_width(Console(file=io.StringIO(), width=60, force_terminal=True)) == 60
    assert table_width(Console(file=io.StringIO(), width=300, force_terminal=True)) == WIDTH
    assert table_width(Console(file=io.StringIO(), width=40)) == WIDTH  # not a terminal: 100 columns


def test_report_tables_fit_100_columns(tmp_path):
    """``normlab report`` on a learning-rate sweep of four variants (the demo's shape): every printed line fits
    100 columns, no header or cell is cut with an ellipsis, and the paired table's verdicts are printed whole."""
    d = tmp_path / "s"
    d.mkdir()
    variants = ["Pre-LN", "Peri-LN", "Pre-LN + QK-norm", "Post-LN"]
    rng = random.Random(1)
    fake_grid(d, variants, [0, 1, 2, 3], [0.001, 0.00416, 0.0173, 0.0721, 0.3],
              lambda v, s, lr: 3.5 + variants.index(v) * 0.05 + 200 * (lr - 0.004) ** 2 + rng.random() * 0.1,
              baseline="Pre-LN", primary="lr_sensitivity", family=variants[1:])
    r = run_inproc("report", str(d), cache=tmp_path / "cache")
    assert r.returncode == 0, r.stderr
    assert max(cell_len(ln) for ln in _lines(r.stdout)) <= WIDTH, r.stdout
    assert "…" not in r.stdout
    from normlab.report.analysis import load
    from normlab.report.lrsection import paired_cells

    _, rows = paired_cells(load(d).grid)
    flat = " ".join(r.stdout.split())
    for row in rows:
        assert " ".join(row[-1].split()) in flat or all(w in flat for w in row[-1].split())
        assert row[3] in flat  # the difference with its interval on one line
