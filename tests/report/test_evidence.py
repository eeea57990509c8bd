"""normlab.report.evidence: the packaged evidence equals what the docs' stored results rebuild, and is readable as
package data (an installed wheel has no docs/)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from normlab.errors import NormlabError
from normlab.report.evidence import build_evidence, load_evidence
from tests.helpers import assert_bad_input, run_inproc as normlab

DOCS = Path(__file__).resolve().parents[2] / "docs"
CLAIMS, REPS = DOCS / "claims-full-2026-11-28.json", DOCS / "replications-2026-11-26.json"
CONFIRM = DOCS / "claims-confirm-2026-11-28.json"
FOLLOWUP = DOCS / "claims-followup-2026-11-28.json"
REJUDGE = DOCS / "claims-rejudge-2026-12-07.json"
FRONTIER = DOCS / "claims-frontier-2026-12-08.json"  # claims declared after the full run, on their own block
ADVISED = DOCS / "replications-advise-2026-11-28.json"  # advise's next question, run (docs/advise.md)


def test_packaged_evidence_equals_the_rebuild_from_docs():
    want = build_evidence(json.loads(CLAIMS.read_text()), json.loads(REPS.read_text()), claims_name=CLAIMS.name,
                          replications_name=REPS.name,
                          confirmations=tuple((json.loads(f.read_text()), f.name)
                                              for f in (CONFIRM, FOLLOWUP, REJUDGE, FRONTIER)),
                          more_replications=((json.loads(ADVISED.read_text()), ADVISED.name),))
    assert load_evidence() == json.loads(json.dumps(want)), (
        "normlab/evidence/claims.json is stale: python -m normlab.report.evidence docs/claims-full-2026-11-28.json "
        "docs/replications-2026-11-26.json normlab/evidence/claims.json --confirm docs/claims-confirm-2026-11-28.json "
        "--confirm docs/claims-followup-2026-11-28.json --confirm docs/claims-rejudge-2026-12-07.json "
        "--confirm docs/claims-frontier-2026-12-08.json --replications docs/replications-advise-2026-11-28.json")
    # every claim revised after a verdict on seeds 0-4 is read from a fresh block: the decision layer's re-run
    # (9100-9104) for the claims whose verdict its rules changed, the follow-up (7000-7011) for lssar-extrapolation,
    # the confirmation (6000-6004) for the others; exploratory: postln-warmup (revised after results on 6000-6004 and
    # 7000-7007) and the two LR claims whose metric was redefined without changing their verdict (not re-run)
    from normlab.experiments.claims.budgets import FOLLOWUP_CLAIMS, FRONTIER_CLAIMS, REJUDGE_CLAIMS

    ev = load_evidence()
    assert [c["name"] for c in ev["claims"] if c["exploratory"]] == ["postln-warmup", "warmup-lr-sensitivity",
                                                                      "adagc-lr-sensitivity"]
    assert next(c for c in ev["claims"] if c["name"] == "postln-warmup")["source"] == CLAIMS.name
    confirmed = {x["name"] for x in json.loads(CONFIRM.read_text())["claims"]}
    assert {c["name"] for c in ev["claims"] if c["source"] == REJUDGE.name} == set(REJUDGE_CLAIMS)
    assert {c["name"] for c in ev["claims"] if c["source"] == FOLLOWUP.name} == {"lssar-extrapolation"}
    assert {c["name"] for c in ev["claims"] if c["source"] == CONFIRM.name} == \
        confirmed - set(FOLLOWUP_CLAIMS) - set(REJUDGE_CLAIMS)
    assert {c["name"] for c in ev["claims"] if "superseded_confirmation" in c} == {"lssar-extrapolation"}
    # the claims first measured on their own block (declared after the full run): their records, after the others
    assert [c["name"] for c in ev["claims"] if c["source"] == FRONTIER.name] == list(FRONTIER_CLAIMS)
    assert [c["name"] for c in ev["claims"]][-len(FRONTIER_CLAIMS):] == list(FRONTIER_CLAIMS)


def test_every_claim_has_a_scale_and_every_replication_names_a_claim():
    ev = load_evidence()
    names = {c["name"] for c in ev["claims"]}
    assert all(c["scale"] for c in ev["claims"])
    assert {r["claim"] for r in ev["replications"]} <= names
    assert not any("/work" in json.dumps(x) or "/tmp" in json.dumps(x) for x in ev["claims"])


def test_a_replication_of_an_unknown_claim_is_refused():
    claims = json.loads(CLAIMS.read_text())
    reps = {"format": "normlab-replications-v1", "replications": [{"claim": "no-such-claim"}]}
    with pytest.raises(NormlabError, match="no-such-claim"):
        build_evidence(claims, reps, claims_name="c.json", replications_name="r.json")


def _block(full: dict, budget: str, **spec) -> dict:
    """The stored full run's claims of the registered budget ``budget`` (confirm, followup) as if measured on its
    seeds (each claim's per-seed values, details and runs repeated in turn to the budget's seed count)."""
    from normlab.experiments.claims.budgets import BUDGETS

    b = BUDGETS[budget]
    seeds = b.seed_list(b.seeds)

    def cycle(xs: list) -> list:
        return [xs[i % len(xs)] for i in range(len(seeds))]

    return {**full, "budget": budget, "seeds": len(seeds),
            "budget_spec": {**json.loads(json.dumps(b.to_dict())), **spec},
            "claims": [{**c, "seeds": seeds, "values": cycle(c["values"]), "details": cycle(c["details"]),
                        "runs": cycle(c["runs"])} for c in full["claims"] if c["name"] in b.claims]}


def _confirmation(full: dict, **spec) -> dict:
    """The stored full run's revised claims as if measured on the confirm budget's seeds 6000-6004."""
    return _block(full, "confirm", **spec)


def test_a_confirmation_on_a_fresh_block_replaces_only_the_exploratory_records():
    """A claim exploratory in the main run (judged on seeds its revision saw) takes the confirmation's record where
    the confirmation is confirmatory, with the exploratory verdict beside it; a claim never revised keeps the main
    record; advise counts the confirmed record as it counts any confirmatory one. A claim revised after the
    confirmation's results too (postln-warmup) is not confirmed there: it keeps its exploratory main record."""
    from normlab.report.advise import status

    full, reps = json.loads(CLAIMS.read_text()), json.loads(REPS.read_text())
    main = build_evidence(full, reps, claims_name="f.json", replications_name="r.json")
    ev = build_evidence(full, reps, claims_name="f.json", replications_name="r.json",
                        confirmations=((_confirmation(full), "c.json"),))
    before = {c["name"]: c for c in main["claims"]}
    from normlab.experiments.claims.execution import judge

    conf = {x["name"]: x for x in judge(_confirmation(full))["claims"]}
    # revised after results on 6000-6004 as well (postln-warmup's rule, the decision layer's rule changes): the
    # confirmation is exploratory for them too
    seen = {n for n, x in conf.items() if x["exploratory"]}
    assert {"postln-warmup", "cod-growth", "hadamard-w4"} <= seen
    for c in ev["claims"]:
        k = conf.get(c["name"])
        if before[c["name"]]["exploratory"] and k is not None and k["name"] not in seen and k["current_definition"]:
            assert c["source"] == "c.json" and not c["exploratory"] and c["seeds"] == [6000, 6001, 6002, 6003, 6004]
            assert c["exploratory_result"]["verdict"] == before[c["name"]]["verdict"]
            assert c["exploratory_result"]["seeds"] == [0, 1, 2, 3, 4]
        elif k is not None and k["name"] in seen and k["current_definition"]:
            # its main record, with the confirmation's exploratory result beside
            assert {**c, "exploratory_elsewhere": None} == {**before[c["name"]], "exploratory_elsewhere": None}
            assert [x["source"] for x in c["exploratory_elsewhere"]] == ["c.json"]
        else:
            assert c == before[c["name"]] and c["source"] == "f.json"
    assert before["postln-warmup"]["exploratory"]
    mixln = next(c for c in ev["claims"] if c["name"] == "mixln-grad")
    assert status(before["mixln-grad"]) == "undecided" and mixln["verdict"] == "held"
    # its own family: the 17 revised claims' Holm-adjusted p, not the main run's 33-claim family
    assert mixln["p_adj"] < before["mixln-grad"]["p_adj"] and status(mixln) == "decided"
    assert ev["suite"]["confirmations"][0]["seeds"] == [6000, 6001, 6002, 6003, 6004]


@pytest.mark.parametrize("change, says", [
    ({"seed_base": 2}, "not a run of a registered confirmation budget as declared"),  # seeds 2-6: 2-4 were seen
    ({"seed_base": 1000}, "not a run of a registered confirmation budget as declared"),  # the unregistered block
    ({"steps": 50}, "a confirmation runs the main run's budget on other seeds; its steps differ"),
])
def test_a_confirmation_not_run_as_its_budget_declares_is_refused(change, says):
    """Only the registered confirmation counts: another block (seeds a revision saw, or the first, moved block
    1000-1004), another budget, a --only selection or fewer seeds are refused in one line."""
    full, reps = json.loads(CLAIMS.read_text()), json.loads(REPS.read_text())
    kw = {"claims_name": "f.json", "replications_name": "r.json"}
    with pytest.raises(NormlabError, match=says):
        build_evidence(full, reps, **kw, confirmations=((_confirmation(full, **change), "c.json"),))
    only = _confirmation(full)
    only["claims"] = only["claims"][:1]
    with pytest.raises(NormlabError, match="c.json: a confirm run holds exactly its budget's claims"):
        build_evidence(full, reps, **kw, confirmations=((only, "c.json"),))
    short = _confirmation(full)
    short["claims"][2] = {**short["claims"][2], "seeds": [6000, 6001, 6002]}
    with pytest.raises(NormlabError, match=f"{short['claims'][2]['name']} not measured on the confirm budget's "
                                           "seeds 6000-6004"):
        build_evidence(full, reps, **kw, confirmations=((short, "c.json"),))
    stored = json.loads((DOCS / "claims-confirm-seeds1000-2026-11-28.json").read_text())
    with pytest.raises(NormlabError, match="c1000.json: not a run of a registered confirmation budget"):
        build_evidence(full, reps, **kw, confirmations=((stored, "c1000.json"),))


def test_two_confirmations_of_one_claim_are_refused_and_an_outdated_one_confirms_nothing():
    """Two confirmation runs of the same claim would let the order of --confirm pick a verdict: refused in one line.
    A confirmation measured under a definition revised since (its spec hash no longer current) confirms nothing."""
    full, reps = json.loads(CLAIMS.read_text()), json.loads(REPS.read_text())
    with pytest.raises(NormlabError, match="b.json: a second confirm run beside a.json; give one per budget"):
        build_evidence(full, reps, claims_name="f.json", replications_name="r.json",
                       confirmations=((_confirmation(full), "a.json"), (_confirmation(full), "b.json")))
    old = _confirmation(full)
    old["claims"] = [{**c, "spec_hash": "000000000000"} for c in old["claims"]]
    ev = build_evidence(full, reps, claims_name="f.json", replications_name="r.json", confirmations=((old, "c.json"),))
    assert all(c["source"] == "f.json" for c in ev["claims"])


def test_the_builder_command_says_what_is_wrong_in_one_line(tmp_path, capsys):
    """``python -m normlab.report.evidence`` on a missing, a malformed or an unwritable path: one line, exit 2,
    nothing written; on the docs' files it writes the packaged evidence exactly."""
    from normlab.report.evidence import main

    out = tmp_path / "ev.json"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "normlab-claims-v1"}))
    (tmp_path / "afile").write_text("x")
    for argv, says in (([str(tmp_path / "none.json"), str(REPS), str(out)], "none.json"),
                       ([str(bad), str(REPS), str(out)], "not normlab claims / replications results"),
                       ([str(CLAIMS), str(REPS), str(tmp_path / "afile" / "ev.json")], "afile")):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: ") and len(err.splitlines()) == 1 and says in err, err
        assert not out.exists()
    assert main([str(CLAIMS), str(REPS), str(out), "--confirm", str(CONFIRM), "--confirm", str(FOLLOWUP),
                 "--confirm", str(REJUDGE), "--confirm", str(FRONTIER), "--replications", str(ADVISED)]) == 0
    assert json.loads(out.read_text()) == load_evidence()


def test_a_followup_supersedes_the_confirmation_it_follows_for_its_claims_only():
    """A follow-up run (``--budget followup``: its budget follows confirm) replaces the confirmation's records of its
    own claims, the confirmation's kept as ``superseded_confirmation`` and the exploratory result still beside; a
    claim neither confirms (postln-warmup, revised after results on both blocks) keeps its exploratory main record;
    the other confirmed claims keep the confirmation's record. Given without the confirmation it follows it is
    refused in one line, and so is a second plain confirmation."""
    from normlab.experiments.claims.budgets import FOLLOWUP_CLAIMS

    full, reps = json.loads(CLAIMS.read_text()), json.loads(REPS.read_text())
    conf, follow = _confirmation(full), _block(full, "followup")
    kw = {"claims_name": "f.json", "replications_name": "r.json"}
    once = build_evidence(full, reps, **kw, confirmations=((conf, "c.json"),))
    both = build_evidence(full, reps, **kw, confirmations=((follow, "u.json"), (conf, "c.json")))  # any order
    assert both == build_evidence(full, reps, **kw, confirmations=((conf, "c.json"), (follow, "u.json")))
    before = {c["name"]: c for c in once["claims"]}
    for c in both["claims"]:
        if c["name"] in FOLLOWUP_CLAIMS:
            old = before[c["name"]]
            if c["name"] in ("postln-warmup", "mano-rank"):  # revisions saw 6000-6004 and 7000s: nothing confirms
                assert old["source"] == "f.json" and c["exploratory"]
                assert {k: v for k, v in c.items() if k != "exploratory_elsewhere"} == {
                    k: v for k, v in old.items() if k != "exploratory_elsewhere"}
                # but each block's exploratory result stays beside the record, in the order they were applied
                assert [(x["source"], x["seeds"][0], len(x["seeds"])) for x in c["exploratory_elsewhere"]] == [
                    ("c.json", 6000, 5), ("u.json", 7000, 12)]
                assert old["exploratory_elsewhere"] == c["exploratory_elsewhere"][:1]
                continue
            assert c["source"] == "u.json" and c["seeds"] == list(range(7000, 7012)) and not c["exploratory"]
            assert c["superseded_confirmation"]["source"] == "c.json"
            assert c["superseded_confirmation"]["seeds"] == old["seeds"] == [6000, 6001, 6002, 6003, 6004]
            assert c["exploratory_result"] == old["exploratory_result"]
        else:
            assert c == before[c["name"]]
    assert both["suite"]["confirmations"][1] == {**both["suite"]["confirmations"][1], "source": "u.json",
                                                 "follows": "c.json"}
    with pytest.raises(NormlabError, match="u.json: a follow-up of the confirm budget's confirmation; give that"):
        build_evidence(full, reps, **kw, confirmations=((follow, "u.json"),))
    with pytest.raises(NormlabError, match="d.json: a second confirm run beside c.json; give one per budget"):
        build_evidence(full, reps, **kw, confirmations=((conf, "c.json"), (follow, "u.json"), (conf, "d.json")))


def test_a_later_confirmation_keeps_the_exploratory_results_of_earlier_blocks(monkeypatch):
    """A claim exploratory on the confirmation's block and (simulated) confirmatory on the follow-up's takes the
    follow-up's record and keeps the confirmation's exploratory result beside it (it was dropped silently)."""
    import normlab.report.evidence as E

    real = E.judge

    def judge(doc):
        out = real(doc)
        if doc.get("budget") == "followup":
            for c in out["claims"]:
                if c["name"] == "postln-warmup":
                    c["exploratory"] = False
        return out

    monkeypatch.setattr(E, "judge", judge)
    full, reps = json.loads(CLAIMS.read_text()), json.loads(REPS.read_text())
    ev = E.build_evidence(full, reps, claims_name="f.json", replications_name="r.json",
                          confirmations=((json.loads(CONFIRM.read_text()), "c.json"),
                                         (json.loads(FOLLOWUP.read_text()), "u.json")))
    c = next(c for c in ev["claims"] if c["name"] == "postln-warmup")
    assert c["source"] == "u.json" and c["exploratory_result"]["source"] == "f.json"
    assert [(x["source"], x["seeds"][0]) for x in c["exploratory_elsewhere"]] == [("c.json", 6000)]


def test_further_replications_documents_follow_the_first_and_one_block_counts_once():
    """A further declared sweep's replications (``--replications``, e.g. advise's next question) are appended after
    the demo's and named in the sources; the same claim, corpus and seed block given twice is refused."""
    claims, reps = json.loads(CLAIMS.read_text()), json.loads(REPS.read_text())
    more = {"format": "normlab-replications-v1", "replications": [
        {**reps["replications"][0], "seeds": [8000, 8001, 8002, 8003], "command": "normlab compare a.yaml"}]}
    ev = build_evidence(claims, reps, claims_name="c.json", replications_name="r.json",
                        more_replications=((more, "m.json"),))
    assert ev["replications"] == reps["replications"] + more["replications"]
    assert ev["sources"]["more_replications"] == ["m.json"]
    with pytest.raises(NormlabError, match="m2.json: .* seeds 8000-8003 is in m.json already"):
        build_evidence(claims, reps, claims_name="c.json", replications_name="r.json",
                       more_replications=((more, "m.json"), (more, "m2.json")))


class _Packaged:
    """``importlib.resources.files('normlab')`` whose evidence/claims.json reads ``text`` (a hand-edited copy); every
    other packaged file is the real one."""

    def __init__(self, real, text: str):
        self.real, self.text = real, text

    def joinpath(self, *parts):
        return self if parts[-1] == "claims.json" else self.real.joinpath(*parts)

    def read_text(self, encoding=None):
        return self.text


def _broken(change) -> dict:
    ev = load_evidence()
    change(ev)
    return ev


def _elsewhere(ev: dict) -> dict:
    return next(c for c in ev["claims"] if c.get("exploratory_elsewhere"))


@pytest.mark.parametrize("change, says", [
    (lambda ev: ev.pop("claims"), "claims must be a list of objects"),
    (lambda ev: ev.__setitem__("replications", None), "replications must be a list of objects"),
    (lambda ev: ev.__setitem__("suite", None), "suite must be an object"),
    (lambda ev: ev["claims"][0].pop("verdict"), "claims[0].verdict must be a string"),
    (lambda ev: _elsewhere(ev).__setitem__("exploratory_elsewhere", "x"),
     "exploratory_elsewhere must be a list of objects"),
    (lambda ev: _elsewhere(ev).__setitem__("exploratory_elsewhere", [{}]), "exploratory_elsewhere[0].seeds must be"),
    (lambda ev: _elsewhere(ev)["exploratory_elsewhere"][0].__setitem__("seeds", "abc"),
     "exploratory_elsewhere[0].seeds must be a list of integers"),
    (lambda ev: ev["replications"][0].__setitem__("seeds", None),
     "replications[0].seeds must be a non-empty list of integers"),
    (lambda ev: ev["replications"][0].__setitem__("seeds", []), "replications[0].seeds must be a non-empty list"),
    (lambda ev: ev["replications"][0].__setitem__("estimate", None), "replications[0].estimate must be a number"),
    (lambda ev: ev["replications"][-1].__setitem__("scale", 128), "scale must be a string"),
    (lambda ev: ev["sources"].__setitem__("more_replications", "r.json"),
     "sources.more_replications must be a list of strings"),
])
def test_a_hand_edited_evidence_file_is_one_line_naming_the_field(monkeypatch, tmp_path, change, says):
    """advise reads only the packaged evidence; a hand-edited copy with a missing or wrongly typed field is one line
    naming it, exit 2 (it was a KeyError/TypeError traceback from deep inside advise)."""
    from normlab.report import evidence as E

    assert E.evidence_problem(load_evidence()) is None  # the shipped evidence passes the check
    text, files = json.dumps(_broken(change)), E.resources.files
    monkeypatch.setattr(E.resources, "files", lambda pkg: _Packaged(files(pkg), text))
    proc = normlab("advise", "tiny", "--no-write", cache=tmp_path / "c")
    assert_bad_input(proc, "normlab/evidence/claims.json", says)
    assert proc.stdout == ""
