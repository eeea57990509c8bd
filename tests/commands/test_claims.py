"""normlab.commands.claims: ``claims --render`` on a path that exists but is not a regular file (a FIFO, a
directory) is the safe reader's one line naming what it is, never 'no such file' (what it said before) and never a
blocking read of the FIFO; a missing path still says 'no such file'. The rendered table shows a stored claims.json's
control characters as escapes (``\x1b``) and its rich markup as text, so the file cannot drive the terminal."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.helpers import assert_bad_input, run_inproc


@pytest.mark.parametrize("kind, says", [("fifo", "is a FIFO (named pipe), not a regular file"),
                                        ("dir", "is a directory, not a regular file")])
def test_render_names_what_is_in_the_way(tmp_path, kind, says):
    src = tmp_path / "claims.json"
    os.mkfifo(src) if kind == "fifo" else src.mkdir()
    proc = run_inproc("claims", "--render", str(src), cache=tmp_path / "c")
    assert_bad_input(proc, f"claims results {src} {says}")
    assert "no such file" not in proc.stderr


def test_render_of_a_missing_file_says_so(tmp_path):
    assert_bad_input(run_inproc("claims", "--render", str(tmp_path / "none.json"), cache=tmp_path / "c"),
                     f"--render {tmp_path / 'none.json'}: no such file")


def test_render_shows_control_characters_and_markup_as_text(tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "2000")  # no cell wrapped
    stored = json.loads((Path(__file__).parents[2] / "docs" / "claims-full-2026-11-26.json").read_text())
    c = stored["claims"][0]
    c["name"], c["paper"] = "N\x1b[2J[red]x[/red]", "P\x1b]0;title\x07"
    stored["budget"] = "B\x1b[5m[bold]"
    src = tmp_path / "claims.json"
    src.write_text(json.dumps(stored))
    proc = run_inproc("claims", "--render", str(src), cache=tmp_path / "c")
    assert proc.returncode == 0, proc.stderr
    assert "\x1b" not in proc.stdout and "\x07" not in proc.stdout  # no raw escape byte reaches the terminal
    for shown in ("N\\x1b[2J[red]x[/red]: ", "P\\x1b]0;title\\x07", "budget B\\x1b[5m[bold], "):
        assert shown in proc.stdout, shown


DOCS = Path(__file__).resolve().parents[2] / "docs"


def _block(full: dict, budget: str, **spec) -> dict:
    """The stored full run's claims of the registered budget ``budget`` (confirm, followup) as that budget's run on
    its own seeds would store them (per-seed values, details and runs repeated in turn to its seed count)."""
    from normlab.experiments.claims.budgets import BUDGETS

    b = BUDGETS[budget]
    seeds = b.seed_list(b.seeds)

    def cycle(xs: list) -> list:
        return [xs[i % len(xs)] for i in range(len(seeds))]

    return {**full, "budget": budget, "seeds": len(seeds), "command": f"normlab claims --budget {budget}",
            "budget_spec": {**json.loads(json.dumps(b.to_dict())), **spec},
            "claims": [{**c, "seeds": seeds, "values": cycle(c["values"]), "details": cycle(c["details"]),
                        "runs": cycle(c["runs"])} for c in full["claims"] if c["name"] in b.claims]}


def test_render_with_a_confirmation_lists_its_verdict_beside_each_exploratory_one(tmp_path):
    """``--render FULL --confirmation CONFIRM --docs``: the page gains a section with one row per claim that is
    exploratory in FULL, its exploratory verdict beside the confirmatory one (judged in CONFIRM's own family)."""
    from normlab.experiments.claims.execution import judge

    full = json.loads((DOCS / "claims-full-2026-11-28.json").read_text())
    conf = tmp_path / "confirm.json"
    conf.write_text(json.dumps(_block(full, "confirm")))
    page = tmp_path / "claims.md"
    run_inproc("claims", "--render", str(DOCS / "claims-full-2026-11-28.json"), "--confirmation", str(conf),
               "--docs", str(page), cache=tmp_path / "c", check=True)
    text = page.read_text()
    section = text.split("## Confirmed on a fresh seed block")[1].split("\n## ")[0]
    rows = [ln for ln in section.splitlines() if ln.startswith("| `")]
    judged = {c["name"]: c for c in judge(_block(full, "confirm"))["claims"]}
    # the rows: the claims exploratory in FULL that the confirmation measured (CONFIRM_CLAIMS: 17; the decision
    # layer's LR and cod-lns revisions are exploratory on 0-4 too, but the rejudge run measures them)
    conf_names = {c["name"] for c in _block(full, "confirm")["claims"]}
    exploratory = [c["name"] for c in judge(full)["claims"] if c["exploratory"] and c["name"] in conf_names]
    assert [r.split("`")[1] for r in rows] == exploratory and len(rows) == 17
    for r in rows:
        c = judged[r.split("`")[1]]
        assert f"**{c['verdict']}**" in r.split("|")[5]
        # revised again after these seeds' results (postln-warmup; the decision layer's rule changes): listed, not
        # confirmed
        seen = {"postln-warmup", "cod-growth", "peri-massive", "peri-variance-magnitude", "hadamard-w4", "peri-quant",
                "mano-rank"}
        assert ("(not confirmed)" in r.split("|")[5]) == c["exploratory"] == (c["name"] in seen)
    assert "seeds 6000-6004" in section and "(seeds 0-4)" in section
    assert "--confirmation" in text.split("```")[1]  # the render command on the page names it


def test_a_confirmation_of_another_budget_or_without_render_is_one_line(tmp_path):
    full = json.loads((DOCS / "claims-full-2026-11-28.json").read_text())
    conf = tmp_path / "confirm.json"
    conf.write_text(json.dumps(_block(full, "confirm", steps=50)))
    assert_bad_input(run_inproc("claims", "--render", str(DOCS / "claims-full-2026-11-28.json"), "--confirmation",
                                str(conf), cache=tmp_path / "c"), "its steps differ from")
    assert_bad_input(run_inproc("claims", "--budget", "tiny", "--confirmation", str(conf), cache=tmp_path / "c"),
                     "--confirmation goes with --render")


def test_render_with_a_followup_lists_it_beside_the_confirmation_it_supersedes(tmp_path):
    """``--render FULL --confirmation CONFIRM --confirmation FOLLOWUP --docs``: after the confirmation's section, one
    row per follow-up claim with the exploratory, the confirmation's and the follow-up's verdict (judged in the
    follow-up's own family). A follow-up given without the confirmation it follows is one line, exit 2."""
    from normlab.experiments.claims.budgets import FOLLOWUP_CLAIMS
    from normlab.experiments.claims.execution import judge

    full = json.loads((DOCS / "claims-full-2026-11-28.json").read_text())
    conf, fol = tmp_path / "confirm.json", tmp_path / "followup.json"
    conf.write_text(json.dumps(_block(full, "confirm")))
    follow = _block(full, "followup")
    fol.write_text(json.dumps(follow))
    page = tmp_path / "claims.md"
    run_inproc("claims", "--render", str(DOCS / "claims-full-2026-11-28.json"), "--confirmation", str(conf),
               "--confirmation", str(fol), "--docs", str(page), cache=tmp_path / "c", check=True)
    text = page.read_text()
    assert text.index("## Confirmed on a fresh seed block") < text.index("## Followed up on a larger fresh block")
    section = text.split("## Followed up on a larger fresh block")[1].split("\n## ")[0]
    rows = [ln for ln in section.splitlines() if ln.startswith("| `")]
    judged = {c["name"]: c for c in judge(follow)["claims"]}
    confirmed = {c["name"]: c for c in judge(_block(full, "confirm"))["claims"]}
    assert sorted(r.split("`")[1] for r in rows) == sorted(FOLLOWUP_CLAIMS)
    for r in rows:
        name, cells = r.split("`")[1], r.split("|")
        assert cells[3].strip().startswith(confirmed[name]["verdict"] + (
            " (exploratory: revised after these seeds)," if confirmed[name]["exploratory"] else ","))
        # revised after results on 6000-6004: postln-warmup's rule, mano-rank's family (the TOSTs joined it)
        assert confirmed[name]["exploratory"] == (name in ("postln-warmup", "mano-rank"))
        assert f"**{judged[name]['verdict']}**" in cells[6]
    assert "(seeds 6000-6004)" in section and "7000-7011" in section and "(seeds 0-4)" in section
    assert text.split("```")[1].count("--confirmation") == 2  # the render command on the page names both
    assert_bad_input(run_inproc("claims", "--render", str(DOCS / "claims-full-2026-11-28.json"), "--confirmation",
                                str(fol), cache=tmp_path / "c"),
                     f"--confirmation {fol}: a follow-up of the confirm budget's confirmation; give that")
    # the same rule as the evidence builder's (budgets.confirmations_problem): one confirmation per budget
    assert_bad_input(run_inproc("claims", "--render", str(DOCS / "claims-full-2026-11-28.json"), "--confirmation",
                                str(conf), "--confirmation", str(conf), cache=tmp_path / "c"),
                     f"--confirmation {conf}: a second confirm run beside --confirmation {conf}; give one per budget")


@pytest.mark.parametrize("change, flag", [({"claims": [1, "x"]}, "--render"), ({"budget_spec": "x"}, "--render"),
                                          ({"budget_spec": "x"}, "--confirmation"),
                                          ({"claims": [None]}, "--confirmation")])
def test_a_claims_file_of_the_wrong_shape_is_one_line(tmp_path, change, flag):
    """A claims.json whose entries or budget spec are not objects: one line naming the file, exit 2, never a
    traceback, as the main file and as a confirmation."""
    full = json.loads((DOCS / "claims-full-2026-11-28.json").read_text())
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**full, **change}))
    args = ["--render", str(bad)] if flag == "--render" else [
        "--render", str(DOCS / "claims-full-2026-11-28.json"), "--confirmation", str(bad)]
    assert_bad_input(run_inproc("claims", *args, cache=tmp_path / "c"),
                     f"{flag} {bad} is not a claims.json written by normlab claims")


@pytest.mark.parametrize("field, value, says", [
    ("measured", "NaN", "measured must be a number or null"),
    # an integer past 100 digits is refused by the one bounded reader before the page looks at it
    ("measured", 10 ** 400, "holds an integer of 401 digits"),
    ("values", [10 ** 400] * 5, "holds an integer of 401 digits"),
    ("ci", "x", "ci must be null or a list of two numbers")])
def test_render_of_a_claim_with_a_wrong_number_is_one_line(tmp_path, field, value, says):
    """A hand-edited claims.json whose numbers the page cannot show (a string, an integer beyond a float, a
    non-list interval) is bad input naming the claim and field, for the table and --json alike (it was a
    TypeError / OverflowError / IndexError traceback)."""
    stored = json.loads((DOCS / "claims-full-2026-11-28.json").read_text())
    stored["claims"][0][field] = value
    src = tmp_path / "claims.json"
    src.write_text(json.dumps(stored))
    for extra in ((), ("--json",)):
        proc = run_inproc("claims", "--render", str(src), *extra, cache=tmp_path / "c")
        assert_bad_input(proc, says if "digits" in says else f"--render {src}: claim 1 (exact-conversion): {says}")
        assert proc.stdout == ""


def test_rendered_page_shows_control_characters_as_escapes(tmp_path):
    """--render --docs: a stored name or metric with control characters reaches the page as escapes (``\\x1b``),
    so printing the Markdown file cannot drive a terminal; the page of the shipped results has none to escape."""
    stored = json.loads((DOCS / "claims-full-2026-11-28.json").read_text())
    stored["claims"][0]["name"] = "N\x1b[2J\x07"
    stored["claims"][1]["metric"] = "M\x1b]0;t\x07\r"
    src, page = tmp_path / "claims.json", tmp_path / "claims.md"
    page.write_text("before")
    src.write_text(json.dumps(stored))
    assert run_inproc("claims", "--render", str(src), "--docs", str(page), cache=tmp_path / "c").returncode == 0
    text = page.read_text()
    assert not any(ch in text for ch in "\x1b\x07\r"), [ch for ch in text if ord(ch) < 32 and ch != "\n"]
    assert "N\\x1b[2J\\x07" in text and "M\\x1b]0;t\\x07\\r" in text
