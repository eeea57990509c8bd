"""The registry listings (``normlab norms``, ``normlab attention``) share ``normlab.commands.listing``."""

from __future__ import annotations

import argparse
import json

from normlab.attention import list_attention
from normlab.commands.attention import run_attention
from normlab.commands.listing import print_listing
from normlab.commands.norms import run_norms
from normlab.norms import list_norms


def test_listing_json_is_the_rows_under_the_key(capsys):
    rows = [{"name": "a", "x": 1}, {"name": "b", "x": 2}]
    assert print_listing("things", rows, {"name": lambda r: r["name"]}, as_json=True) == 0
    assert json.loads(capsys.readouterr().out) == {"things": rows}


def test_listing_table_has_headings_and_cells_in_order_without_markup(capsys):
    rows = [{"n": "alpha", "v": 1}, {"n": "[bold]beta[/bold]", "v": 22}]
    print_listing("t", rows, {"name": lambda r: r["n"], "twice": lambda r: str(2 * r["v"])}, as_json=False)
    lines = capsys.readouterr().out.splitlines()
    heading = next(ln for ln in lines if "name" in ln)
    assert heading.index("name") < heading.index("twice")
    body = [ln.rstrip()[1:-1].split("│") for ln in lines if ln.startswith("│")]
    assert [[c.strip() for c in row] for row in body] == [["alpha", "2"], ["[bold]beta[/bold]", "44"]]


def test_norms_and_attention_tables_list_every_registered_name(capsys):
    for run, rows in ((run_norms, list_norms()), (run_attention, list_attention())):
        assert run(argparse.Namespace(json=False)) == 0
        first_cells = [ln.rstrip()[1:-1].split("│")[0].strip() for ln in capsys.readouterr().out.splitlines()
                       if ln.startswith("│")]
        assert [r["name"] for r in rows] == [c for c in first_cells if c]
