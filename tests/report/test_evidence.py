"""normlab.report.evidence: the packaged evidence equals what the docs' stored results rebuild, and is readable as
package data (an installed wheel has no docs/)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from normlab.errors import NormlabError
from normlab.report.evidence import build_evidence, load_evidence

DOCS = Path(__file__).resolve().parents[2] / "docs"
CLAIMS, REPS = DOCS / "claims-full-2026-11-28.json", DOCS / "replications-2026-11-26.json"
CONFIRM = DOCS / "claims-confirm-2026-11-28.json"


def test_packaged_evidence_equals_the_rebuild_from_docs():
    want = build_evidence(json.loads(CLAIMS.read_text()), json.loads(REPS.read_text()), claims_name=CLAIMS.name,
                          replications_name=REPS.name, confirmations=((json.loads(CONFIRM.read_text()), CONFIRM.name),))
    assert load_evidence() == json.loads(json.dumps(want)), (
        "normlab/evidence/claims.json is stale: python -m normlab.report.evidence docs/claims-full-2026-11-28.json "
        "docs/replications-2026-11-26.json normlab/evidence/claims.json --confirm docs/claims-confirm-2026-11-28.json")
    # every claim revised after a verdict on seeds 0-4 is read from its confirmation on 6000-6004: none exploratory
    ev = load_evidence()
    assert not any(c["exploratory"] for c in ev["claims"])
    assert {c["name"] for c in ev["claims"] if c["source"] == CONFIRM.name} == {
        c["name"] for c in json.loads(CLAIMS.read_text())["claims"] if c["name"] in
        {x["name"] for x in json.loads(CONFIRM.read_text())["claims"]}}


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


def _confirmation(full: dict, shift: int = 1000, **spec) -> dict:
    """The stored full run's revised claims as if measured on the seed block ``shift`` .. (a confirm run's shape)."""
    from normlab.experiments.claims.budgets import BUDGETS, CONFIRM_CLAIMS

    return {**full, "budget": "confirm",
            "budget_spec": {**json.loads(json.dumps(BUDGETS["confirm"].to_dict())), "seed_base": shift, **spec},
            "claims": [{**c, "seeds": [shift + s for s in c["seeds"]]} for c in full["claims"]
                       if c["name"] in CONFIRM_CLAIMS]}


def test_a_confirmation_on_a_fresh_block_replaces_only_the_exploratory_records():
    """A claim exploratory in the main run (judged on seeds its revision saw) takes the confirmation's record where
    the confirmation is confirmatory, with the exploratory verdict beside it; a claim never revised keeps the main
    record; advise counts the confirmed record as it counts any confirmatory one."""
    from normlab.report.advise import status

    full, reps = json.loads(CLAIMS.read_text()), json.loads(REPS.read_text())
    main = build_evidence(full, reps, claims_name="f.json", replications_name="r.json")
    ev = build_evidence(full, reps, claims_name="f.json", replications_name="r.json",
                        confirmations=((_confirmation(full), "c.json"),))
    before = {c["name"]: c for c in main["claims"]}
    for c in ev["claims"]:
        if before[c["name"]]["exploratory"]:
            assert c["source"] == "c.json" and not c["exploratory"] and c["seeds"] == [1000, 1001, 1002, 1003, 1004]
            assert c["exploratory_result"]["verdict"] == before[c["name"]]["verdict"]
            assert c["exploratory_result"]["seeds"] == [0, 1, 2, 3, 4]
        else:
            assert c == before[c["name"]] and c["source"] == "f.json"
    mixln = next(c for c in ev["claims"] if c["name"] == "mixln-grad")
    assert status(before["mixln-grad"]) == "undecided" and mixln["verdict"] == "held"
    # its own family: the 17 revised claims' Holm-adjusted p, not the main run's 33-claim family
    assert mixln["p_adj"] < before["mixln-grad"]["p_adj"] and status(mixln) == "decided"
    assert ev["suite"]["confirmations"][0]["seeds"] == [1000, 1001, 1002, 1003, 1004]


def test_a_confirmation_on_seeds_a_revision_saw_confirms_nothing():
    full, reps = json.loads(CLAIMS.read_text()), json.loads(REPS.read_text())
    main = build_evidence(full, reps, claims_name="f.json", replications_name="r.json")
    seen = build_evidence(full, reps, claims_name="f.json", replications_name="r.json",
                          confirmations=((_confirmation(full, shift=2), "c.json"),))  # seeds 2-6: 2-4 were seen
    assert [c["source"] for c in seen["claims"]] == ["f.json"] * len(main["claims"])


def test_a_confirmation_of_another_budget_is_refused():
    full, reps = json.loads(CLAIMS.read_text()), json.loads(REPS.read_text())
    with pytest.raises(NormlabError, match="c.json: a confirmation runs the main run's budget on other seeds; its "
                                           "steps differ"):
        build_evidence(full, reps, claims_name="f.json", replications_name="r.json",
                       confirmations=((_confirmation(full, steps=50), "c.json"),))


def test_two_confirmations_of_one_claim_are_refused_and_an_outdated_one_confirms_nothing():
    """Two confirmation runs of the same claim would let the order of --confirm pick a verdict: refused in one line.
    A confirmation measured under a definition revised since (its spec hash no longer current) confirms nothing."""
    full, reps = json.loads(CLAIMS.read_text()), json.loads(REPS.read_text())
    with pytest.raises(NormlabError, match="is confirmed by a.json already; give one confirmation per claim"):
        build_evidence(full, reps, claims_name="f.json", replications_name="r.json",
                       confirmations=((_confirmation(full), "a.json"), (_confirmation(full, shift=7000), "b.json")))
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
    assert main([str(CLAIMS), str(REPS), str(out), "--confirm", str(CONFIRM)]) == 0
    assert json.loads(out.read_text()) == load_evidence()


def test_a_followup_supersedes_the_confirmation_it_follows_for_its_claims_only():
    """A follow-up run (``--budget followup``: its budget follows confirm) replaces the confirmation's records of its
    own claims, the confirmation's kept as ``superseded_confirmation`` and the exploratory result still beside; the
    other confirmed claims keep the confirmation's record. Given without the confirmation it follows, or following a
    budget none of the given files ran, it is refused in one line, and so is a second plain confirmation."""
    from normlab.experiments.claims.budgets import BUDGETS, FOLLOWUP_CLAIMS

    full, reps = json.loads(CLAIMS.read_text()), json.loads(REPS.read_text())
    conf = _confirmation(full)
    follow = {**_confirmation(full, shift=7000), "budget": "followup",
              "budget_spec": json.loads(json.dumps(BUDGETS["followup"].to_dict()))}
    follow["claims"] = [c for c in follow["claims"] if c["name"] in FOLLOWUP_CLAIMS]
    kw = {"claims_name": "f.json", "replications_name": "r.json"}
    once = build_evidence(full, reps, **kw, confirmations=((conf, "c.json"),))
    both = build_evidence(full, reps, **kw, confirmations=((follow, "u.json"), (conf, "c.json")))  # any order
    assert both == build_evidence(full, reps, **kw, confirmations=((conf, "c.json"), (follow, "u.json")))
    before = {c["name"]: c for c in once["claims"]}
    for c in both["claims"]:
        if c["name"] in FOLLOWUP_CLAIMS:
            old = before[c["name"]]
            assert c["source"] == "u.json" and c["seeds"] == [7000 + s for s in range(5)]
            assert c["superseded_confirmation"]["source"] == "c.json"
            assert c["superseded_confirmation"]["seeds"] == old["seeds"] == [1000 + s for s in range(5)]
            assert c["exploratory_result"] == old["exploratory_result"]
        else:
            assert c == before[c["name"]]
    assert both["suite"]["confirmations"][1] == {**both["suite"]["confirmations"][1], "source": "u.json",
                                                 "follows": "c.json"}
    with pytest.raises(NormlabError, match="u.json: a follow-up of the confirm budget's confirmation; give that"):
        build_evidence(full, reps, **kw, confirmations=((follow, "u.json"),))
    with pytest.raises(NormlabError, match="is confirmed by c.json already; give one confirmation per claim"):
        build_evidence(full, reps, **kw, confirmations=((conf, "c.json"), (follow, "u.json"),
                                                        (_confirmation(full, shift=8000), "d.json")))
