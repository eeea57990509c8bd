"""Claims as pre-registered specifications (issue 26): the family's Holm adjustment against a hand example, the
verdict rules (practical margin, observability, split outcomes with Clopper-Pearson), and the spec hashes recorded
in docs/claims.md (a changed definition without a revised: entry fails)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import binomtest, ttest_1samp

from normlab.errors import NormlabError
from normlab.experiments.claims.budgets import FRONTIER_CLAIMS
from normlab.experiments.claims.docs import recorded_hashes, spec_lines, unrevised_changes
from normlab.experiments.claims.specs import CLAIMS, Revision, spec_hash
from normlab.decide.verdicts import collapse_rates, judge_family, tost
from normlab.decide.vocab import NOT_DECIDED_DNL, PRESENT_AT_INIT

FRONTIER = "docs/claims-frontier-2026-12-08.json"  # the frontier budget's run (normlab claims --budget frontier)
STATE_CLAIMS = {"cod-growth", "cod-lns", "peri-massive", "peri-variance-magnitude"}
"""The claims that declare ``at_init`` (judged on their change from initialisation, normlab.decide)."""

DOCS = Path(__file__).resolve().parents[3] / "docs" / "claims.md"


def entry(values, direction="greater", test="t", **kw):
    return {"values": values, "details": kw.pop("details", []), "direction": direction, "null": kw.pop("null", 0.0),
            "margin": kw.pop("margin", None), "tolerance": kw.pop("tolerance", None), "test": test,
            "practical_margin": kw.pop("practical_margin", None), "observable": kw.pop("observable", ""),
            "args": kw.pop("args", []), "must_learn": kw.pop("must_learn", []), "unigram_bpb": kw.pop("unigram", None)}


def test_holm_over_a_claims_family_matches_a_hand_example():
    fam = [entry([0.9, 1.1, 1.0, 1.2, 0.8]),                  # strong
           entry([0.0026, 0.0028, 0.0094, 0.0130, 0.0039]),   # peri-quant's stored deltas: p 0.039 alone
           entry([-0.2, 0.1, 0.3, -0.1, 0.2]),                # noise
           entry([1e-5] * 3, direction="exact", test="exact", tolerance=1e-4)]   # no test: not in the family
    raw = [ttest_1samp(e["values"], 0.0).pvalue for e in fam[:3]]
    # Holm by hand: sort, multiply by m, m-1, ..., keep the running maximum, cap at 1 (m = 3 tests)
    order = sorted(range(3), key=lambda i: raw[i])
    hand, running = [0.0] * 3, 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (3 - rank) * raw[i]))
        hand[i] = running
    out = judge_family(fam)
    assert [o["p"] for o in out[:3]] == pytest.approx(raw, rel=1e-9)
    assert [o["p_adj"] for o in out[:3]] == pytest.approx(hand, rel=1e-9)
    assert out[3]["p"] is None and out[3]["p_adj"] is None and out[3]["verdict"] == "held"
    assert raw[1] == pytest.approx(0.038, abs=1e-3) and hand[1] == pytest.approx(2 * raw[1])
    # held before the correction, not after: the verdict uses the adjusted p, the raw one is kept beside it
    assert out[1]["raw_verdict"] == "held" and out[1]["verdict"] == "inconclusive"
    assert out[0]["verdict"] == "held" and out[2]["verdict"] == "inconclusive"


def test_practical_margin_and_not_observable_are_their_own_verdicts():
    small = [0.0026, 0.0028, 0.0094, 0.0130, 0.0039, 0.003, 0.004, 0.005, 0.006, 0.004]  # decided, but tiny
    out = judge_family([entry(small, practical_margin=0.01), entry(small)])
    assert out[0]["p_adj"] < 0.05 and out[0]["verdict"] == "within margin"
    assert out[1]["verdict"] == "held"
    # the stored peri-variance slopes: the value is decided positive, but Pre-LN's slope did not steepen
    pre_change = [0.0051, 0.0200, -0.0080, -0.0145, 0.0087]
    vals = [0.0452, 0.0575, 0.0388, 0.0341, 0.0466]
    e = entry(vals, observable="pre_slope_change", details=[{"pre_slope_change": x} for x in pre_change])
    got = judge_family([e])[0]
    assert got["verdict"] == "not observable at this scale" and got["observable_ci"][0] < 0 < got["observable_ci"][1]
    e["details"] = [{"pre_slope_change": x + 0.05} for x in pre_change]
    assert judge_family([e])[0]["verdict"] == "held"


def test_a_claim_about_a_model_that_did_not_learn_is_not_observable_and_counts_as_p_one():
    """``must_learn``: a seed whose loss is not below unigram - 0.1 (normlab.stats.learning) makes the claim "not
    observable at this scale", named in the reason (k of n; a missing value counted apart), and it enters the Holm
    family as p = 1 (reference: statsmodels' Holm over the other p and 1); a nats/byte loss is converted by 1/ln 2;
    without a unigram level the check is not made and the reason says so."""
    import math

    from statsmodels.stats.multitest import multipletests

    from normlab.stats.learning import DID_NOT_LEARN_MARGIN

    level = 4.67
    good = [{"best_a": 3.4 + 0.01 * i, "best_b": 3.5} for i in range(5)]
    vals = [-0.10, -0.09, -0.11, -0.10, -0.12]  # decided: a better than b
    other = [0.1, 0.12, 0.11, 0.13, 0.09]
    e = entry(vals, direction="less", details=good, must_learn=["best_a", "best_b"], unigram=level)
    got = judge_family([e])[0]
    assert got["verdict"] == "held" and "did not learn" not in got["reason"]
    assert {m: (r["k"], r["n"]) for m, r in got["did_not_learn"].items()} == {"best_a": (0, 5), "best_b": (0, 5)}
    edge = level - DID_NOT_LEARN_MARGIN
    e["details"] = [{**d, "best_b": x} for d, x in zip(good, [3.5, edge, edge - 1e-9, float("nan"), 4.9])]
    got, rest = judge_family([e, entry(other)])
    assert got["verdict"] == NOT_DECIDED_DNL and got["raw_verdict"] == "held"
    # at the edge, above it, NaN (diverged) and 4.9 fail; edge - 1e-9 learned
    assert got["did_not_learn"]["best_b"]["k"] == 3 and got["did_not_learn"]["best_b"]["n"] == 5
    assert got["did_not_learn"]["best_b"]["states"] == ["learned", "did not learn", "learned", "diverged",
                                                        "did not learn"]
    assert "best_b did not learn in 3 of 5 seeds" in got["reason"]
    ref = multipletests([1.0, ttest_1samp(other, 0).pvalue], method="holm")[1]
    assert got["p"] == pytest.approx(ttest_1samp(vals, 0).pvalue, rel=1e-9)  # the raw p is kept
    assert [got["p_adj"], rest["p_adj"]] == pytest.approx(list(ref), rel=1e-9)
    # losses in nats/byte: 3.2 nats = 4.62 bits/byte, above 4.57: did not learn; 3.1 nats = 4.47 bits/byte learned
    nats = entry(vals, direction="less", details=[{"loss.a": x} for x in (3.1, 3.1, 3.2, 3.1, 3.1)],
                 must_learn=["loss.a"], unigram=level)
    nats["learn_unit"] = "nats/byte"
    assert 3.2 / math.log(2) >= edge > 3.1 / math.log(2)
    assert judge_family([nats])[0]["did_not_learn"]["loss.a"]["k"] == 1
    e["unigram_bpb"] = None  # no unigram level recorded: the reason says the check was not made
    got = judge_family([e])[0]
    assert "did-not-learn check not made" in got["reason"] and got["verdict"] == "held"


def test_split_outcomes_use_collapse_rates_with_clopper_pearson():
    # postln-warmup's stored seeds: Post-LN collapsed once (4.49 bits/byte), Pre-LN never
    det = [{"collapsed_post": int(i == 4), "collapsed_pre": 0} for i in range(5)]
    vals = [-0.8974, -0.8119, -0.4123, -0.6606, None]   # None: a seed where one run collapsed
    got = judge_family([entry(vals, test="collapse", args=["post", "pre"], details=det)])[0]
    cp = binomtest(1, 5).proportion_ci(confidence_level=0.95, method="exact")
    assert got["collapse"]["post"]["ci"] == pytest.approx([cp.low, cp.high], rel=1e-9)
    assert got["collapse"]["pre"]["ci"][0] == 0.0
    assert got["p"] == pytest.approx(ttest_1samp(vals[:4], 0.0).pvalue, rel=1e-9)
    # better when it trains, but it collapsed more often (1/5 vs 0/5): the survivors cannot refute the claim
    assert got["verdict"] == "inconclusive" and "intervals overlap" in got["reason"]
    assert got["raw_verdict"] == "inconclusive" and "post collapsed more often" in got["reason"]
    same = [{"collapsed_post": int(i == 4), "collapsed_pre": int(i == 4)} for i in range(5)]  # 1/5 each: refuted
    got = judge_family([entry(vals, test="collapse", args=["post", "pre"], details=same)])[0]
    assert got["verdict"] == "not held" and "more often" not in got["reason"]
    worse = judge_family([entry([0.9, 0.8, 0.7, 0.85, None], test="collapse", args=["post", "pre"],
                                details=det)])[0]
    assert worse["verdict"] == "held"  # decided worse given no collapse: held whatever the collapse rates
    # no collapse record (details without the flags or the bits/byte they are read from): never judged on the
    # survivors alone
    bare = judge_family([entry(vals, test="collapse", args=["post", "pre"], details=[{}] * 5)])[0]
    assert bare["verdict"] == bare["raw_verdict"] == "inconclusive" and "no collapse record of post" in bare["reason"]
    det = [{"collapsed_post": 1, "collapsed_pre": 0} for _ in range(8)]
    got = judge_family([entry([None] * 8, test="collapse", args=["post", "pre"], details=det)])[0]
    assert got["verdict"] == "held" and got["collapse"]["post"]["k"] == 8


@pytest.mark.parametrize("k,n", [(0, 5), (1, 5), (3, 7), (10, 10), (4, 25)])
def test_collapse_rates_match_scipy_binomtest(k, n):
    det = [{"collapsed_a": int(i < k)} for i in range(n)]
    r = collapse_rates(det, ["a"])["a"]
    ref = binomtest(k, n).proportion_ci(confidence_level=0.95, method="exact")
    assert (r["k"], r["n"]) == (k, n) and r["ci"] == pytest.approx([ref.low, ref.high], rel=1e-9, abs=1e-12)


def test_every_claim_matches_the_hash_recorded_in_docs_or_carries_a_revision():
    recorded = recorded_hashes(DOCS.read_text())
    assert recorded, "docs/claims.md records no spec hashes"
    assert unrevised_changes(CLAIMS, recorded) == []


def test_a_spec_change_without_a_revision_is_caught():
    c = next(c for c in CLAIMS if c.name == "cod-growth")
    recorded = {c.name: spec_hash(c)}
    changed = dataclasses.replace(c, null=0.01)                     # a new threshold, silently
    assert spec_hash(changed) != spec_hash(c)
    assert len(unrevised_changes([changed], recorded)) == 1
    revised = dataclasses.replace(changed, revised=(Revision("2026-11-25", "null 0.01", "test", "held (0.06)",
                                                             spec_hash(c), (0,)),))
    assert unrevised_changes([revised], recorded) == []
    assert spec_hash(dataclasses.replace(c, meaning="reworded")) == spec_hash(c)   # prose is not the definition
    rows = recorded_hashes("\n".join(spec_lines([c])))
    assert rows == {c.name: spec_hash(c)}


def _rendered(src: str, out: Path, *confirmations: str) -> dict:
    """``normlab claims --render SRC [--confirmation C ...] --docs`` into ``out``: the judged report."""
    import json

    from normlab.experiments.claims.docs import write_docs
    from normlab.experiments.claims.execution import judge

    stored = json.loads((DOCS.parent.parent / src).read_text())
    report = judge({**stored, "rendered_from": src})
    confs = tuple((judge({**json.loads((DOCS.parent.parent / c).read_text()), "rendered_from": c}), Path(c).name)
                  for c in confirmations)
    report["render_command"] = f"normlab claims --render {src}" + "".join(
        f" --confirmation {c}" for c in confirmations) + " --docs"
    write_docs(report, out, confs)
    return report


def _body(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if not ln.startswith("Budget **")]  # the writing date aside


def test_docs_claims_md_is_what_render_writes_from_the_stored_results(tmp_path):
    """docs/claims.md is reproducible: `normlab claims --render docs/claims-full-2026-11-28.json --confirmation
    docs/claims-confirm-2026-11-28.json --confirmation docs/claims-followup-2026-11-28.json --confirmation
    docs/claims-rejudge-2026-12-07.json --confirmation docs/claims-frontier-2026-12-08.json --docs` writes it (the
    line with the writing date aside). The stored run is a from-scratch full run, every claim under its current
    definition (the revisions listed on the page were made after the earlier run, below)."""
    report = _rendered("docs/claims-full-2026-11-28.json", tmp_path / "claims.md",
                       "docs/claims-confirm-2026-11-28.json", "docs/claims-followup-2026-11-28.json",
                       "docs/claims-rejudge-2026-12-07.json", FRONTIER)
    assert _body((tmp_path / "claims.md").read_text()) == _body(DOCS.read_text())
    assert "## Measured again under the decision layer" in DOCS.read_text()
    # the claims declared after this run, measured on their own block: listed with their verdicts and hashes
    own = DOCS.read_text().split("## Measured on their own seed block (frontier)")[1].split("\n## ")[0]
    assert all(f"(`{n}`)" in own for n in FRONTIER_CLAIMS) and "Claims not in this run" not in DOCS.read_text()
    by = {c["name"]: c for c in report["claims"]}
    # the state claims were measured before they declared at_init (their hash changed with it, revisions.yaml)
    assert {c["name"] for c in report["claims"] if not c["current_definition"]} == STATE_CLAIMS
    assert "## Re-judged under the decision layer" in DOCS.read_text()
    # DyT with alpha0 set for the width learned in every seed: its claims are judged, no longer 'not observable'
    for name in ("dyt-vs-ln", "mano-rank", "mnn-rank"):
        assert all(v["k"] == 0 for v in by[name]["did_not_learn"].values()) and by[name]["verdict"] != (
            "not observable at this scale")
    assert [c["name"] for c in report["claims"] if c["verdict"] == "not observable at this scale"] == [
        "peri-variance", "stablemax-collapse", "residual-sink-clipping"]
    assert by["cod-growth"]["verdict"] == PRESENT_AT_INIT
    assert by["cod-growth"]["beside"] == ["slope_init_pre"]  # the slope is already there at initialisation
    assert by["peri-quant"]["verdict"] == "within margin" and by["peri-quant"]["tost"]["within"]
    # the full run is on seeds 0-4, which every revision saw: a revised claim is exploratory there (marked on the
    # page and in the packaged evidence), and one never revised is not
    revised = {c.name for c in CLAIMS if c.revised}
    assert {c["name"] for c in report["claims"] if c["exploratory"]} == revised and len(revised) == 23
    rows = {ln.split("(`")[1].split("`)")[0]: ln for ln in DOCS.read_text().splitlines()
            if ln.startswith("| ") and "(`" in ln.split("|")[2]}
    assert all(("⚑ exploratory" in rows[n]) == (n in revised) for n in by)


def test_docs_claims_confirm_md_is_what_render_writes_and_confirms_every_revised_claim(tmp_path):
    """docs/claims-confirm.md is `normlab claims --render docs/claims-confirm-2026-11-28.json --docs
    docs/claims-confirm.md`; that run measured every revised claim (and no other) on seeds 6000-6004 under its
    current definition, none of them exploratory there (no revision saw those seeds), one Holm family of 17."""
    report = _rendered("docs/claims-confirm-2026-11-28.json", tmp_path / "confirm.md")
    assert _body((tmp_path / "confirm.md").read_text().replace(
        "--render docs/claims-confirm-2026-11-28.json --docs", "--render docs/claims-confirm-2026-11-28.json --docs "
        "docs/claims-confirm.md")) == _body((DOCS.parent / "claims-confirm.md").read_text())
    from normlab.experiments.claims.budgets import CONFIRM_CLAIMS

    assert {c["name"] for c in report["claims"]} == set(CONFIRM_CLAIMS)
    assert all(c["seeds"] == [6000, 6001, 6002, 6003, 6004] for c in report["claims"])
    assert {c["name"] for c in report["claims"] if not c["current_definition"]} == STATE_CLAIMS - {"cod-lns"}
    # one family: the 17 claims' tests and the TOST of each practical margin
    assert report["family_size"] == 17 + sum(c.get("tost") is not None for c in report["claims"])
    assert report["budget"] == "confirm"
    # the first confirmation (seeds 1000-1004, moved off the quick preset's block before the run above) is kept and
    # named on the page; its verdicts equal those of seeds 0-4, and the page's note lists where the two blocks differ
    import json

    from normlab.experiments.claims.execution import judge

    first = judge(json.loads((DOCS.parent / "claims-confirm-seeds1000-2026-11-28.json").read_text()))
    full = {c["name"]: c["verdict"] for c in judge(json.loads(STORED.read_text()))["claims"]}
    assert all(c["seeds"] == [1000, 1001, 1002, 1003, 1004] for c in first["claims"])
    # equal but for mano-rank: held there, inconclusive on 0-4 in the suite's one family (its TOSTs joined it)
    assert [c["name"] for c in first["claims"] if c["verdict"] != full[c["name"]]] == ["mano-rank"]
    differ = sorted(c["name"] for c, d in zip(first["claims"], report["claims"]) if c["verdict"] != d["verdict"])
    # postln-warmup: inconclusive in both, under the rule; peri-quant: within margin on 1000-1004, not shown within
    # it on 6000-6004 once its TOST is adjusted with the family (revised 2026-12-07, after both)
    assert differ == ["lssar-extrapolation", "mano-rank", "peri-quant"]
    # the stored note (written then) names the two that differed then and postln-warmup, revised after both runs
    assert all(f"`{n}`" in report["note"] for n in ["lssar-extrapolation", "mano-rank", "postln-warmup"])
    assert "claims-confirm-seeds1000" in report["note"] and "followup" in report["note"]
    # revised after these seeds: postln-warmup (2026-11-28) and the decision layer's rule changes (2026-12-07)
    assert {c["name"] for c in report["claims"] if c["exploratory"]} == {
        "postln-warmup", *(STATE_CLAIMS - {"cod-lns"}), "hadamard-w4", "peri-quant", "mano-rank"}


def test_docs_claims_rejudge_md_is_what_render_writes_on_the_fresh_block(tmp_path):
    """docs/claims-rejudge.md is `normlab claims --render docs/claims-rejudge-2026-12-07.json --docs
    docs/claims-rejudge.md`; that run measured exactly the claims the decision layer re-judged, on seeds 9100-9104,
    under their current definitions, after the revisions it answers (their time), none exploratory there, with
    every model's final loss recorded for the guard and the state claims' at-init values."""
    import json

    from normlab.experiments.claims.budgets import REJUDGE_CLAIMS

    report = _rendered("docs/claims-rejudge-2026-12-07.json", tmp_path / "rejudge.md")
    assert _body((tmp_path / "rejudge.md").read_text().replace(
        "--render docs/claims-rejudge-2026-12-07.json --docs", "--render docs/claims-rejudge-2026-12-07.json "
        "--docs docs/claims-rejudge.md")) == _body((DOCS.parent / "claims-rejudge.md").read_text())
    assert sorted(c["name"] for c in report["claims"]) == sorted(REJUDGE_CLAIMS)
    assert all(c["seeds"] == list(range(9100, 9105)) and c["current_definition"] and not c["exploratory"]
               for c in report["claims"])
    stored = json.loads((DOCS.parent / "claims-rejudge-2026-12-07.json").read_text())
    assert all("learn_bpb" in d for c in stored["claims"] for d in c["details"] if isinstance(d, dict))
    by = {c["name"]: c for c in report["claims"]}
    assert all(d.get("diff_init") is not None for d in by["cod-lns"]["details"])
    assert by["cod-lns"]["verdict"] == by["cod-growth"]["verdict"] == PRESENT_AT_INIT
    last = max((r.date, r.time) for c in CLAIMS if c.name in REJUDGE_CLAIMS for r in c.revised)
    assert last[0] == stored["finished_utc"][:10] and stored["finished_utc"][11:] > last[1]


def test_docs_claims_frontier_md_is_what_render_writes_on_its_own_block(tmp_path):
    """docs/claims-frontier.md is `normlab claims --render docs/claims-frontier-2026-12-08.json --docs
    docs/claims-frontier.md`; that run measured exactly the frontier claims (declared before it: their definitions
    have no revision) on seeds 23000-23004, one Holm family, none exploratory, every model's final loss recorded
    for the guard; hc-vs-pre-flops' HC trained fewer steps than Pre-LN, the same tokens per step."""
    import json

    from normlab.experiments.claims.specs import get_claim

    report = _rendered(FRONTIER, tmp_path / "frontier.md")
    assert _body((tmp_path / "frontier.md").read_text().replace(
        f"--render {FRONTIER} --docs", f"--render {FRONTIER} --docs docs/claims-frontier.md")) == _body(
        (DOCS.parent / "claims-frontier.md").read_text())
    assert sorted(c["name"] for c in report["claims"]) == sorted(FRONTIER_CLAIMS)
    assert all(c["seeds"] == list(range(23000, 23005)) and c["current_definition"] and not c["exploratory"]
               for c in report["claims"])
    assert not any(get_claim(n).revised for n in FRONTIER_CLAIMS)
    stored = json.loads((DOCS.parent / FRONTIER.split("/")[1]).read_text())
    assert all("learn_bpb" in d for c in stored["claims"] for d in c["details"] if isinstance(d, dict))
    assert report["family_size"] >= len(FRONTIER_CLAIMS)


def test_docs_claims_followup_md_is_what_render_writes_on_twelve_fresh_seeds(tmp_path):
    """docs/claims-followup.md is `normlab claims --render docs/claims-followup-2026-11-28.json --docs
    docs/claims-followup.md`; that run measured exactly the follow-up's claims on the 12 seeds 7000-7011, under
    their current definitions, one Holm family of 3, the two whose definitions were fixed before the run
    confirmatory; it finished after the last revision of its claims (its finished_utc)."""
    import json

    from normlab.experiments.claims.budgets import BUDGETS, FOLLOWUP_CLAIMS, confirmation_problem

    report = _rendered("docs/claims-followup-2026-11-28.json", tmp_path / "followup.md")
    assert _body((tmp_path / "followup.md").read_text().replace(
        "--render docs/claims-followup-2026-11-28.json --docs", "--render docs/claims-followup-2026-11-28.json "
        "--docs docs/claims-followup.md")) == _body((DOCS.parent / "claims-followup.md").read_text())
    assert sorted(c["name"] for c in report["claims"]) == sorted(FOLLOWUP_CLAIMS)
    assert all(c["seeds"] == list(range(7000, 7012)) and c["current_definition"] for c in report["claims"])
    # postln-warmup's rule was revised while this run trained, after its seeds 7000-7007 were stored: exploratory
    assert [c["name"] for c in report["claims"] if c["exploratory"]] == ["postln-warmup", "mano-rank"]
    assert report["family_size"] == 3 + sum(c.get("tost") is not None for c in report["claims"])
    assert report["budget"] == "followup"
    stored = json.loads((DOCS.parent / "claims-followup-2026-11-28.json").read_text())
    assert confirmation_problem(BUDGETS["full"].to_dict(), stored, "full", "followup") is None
    # docs/findings.md's sensitivity: in the confirmation's family of 17, the follow-up's p-values in place of its
    # three, mano-rank's Holm p is 0.10 (inconclusive) where its own declared family (3 claims and postln-warmup's
    # TOST) gives 0.018 (held)
    from normlab.experiments.claims.execution import judge

    conf = json.loads((DOCS.parent / "claims-confirm-2026-11-28.json").read_text())
    mine = {c["name"]: c for c in stored["claims"]}
    merged = {c["name"]: c for c in judge({**conf, "claims": [mine.get(c["name"], c) for c in conf["claims"]]})[
        "claims"]}
    own = {c["name"]: c for c in report["claims"]}
    assert round(own["mano-rank"]["p_adj"], 3) == 0.018 and own["mano-rank"]["verdict"] == "held"
    assert round(merged["mano-rank"]["p_adj"], 2) == 0.10 and merged["mano-rank"]["verdict"] == "inconclusive"
    assert merged["lssar-extrapolation"]["verdict"] == "held"
    # docs/findings.md's postln-warmup figures: 3 of 12 Post-LN runs collapsed, 0 of Pre-LN; of the nine that trained,
    # eight trained 0.77 bits/byte better and one ended at 4.47 bits/byte (under the collapse line, not collapsed)
    post = own["postln-warmup"]
    assert [(r["k"], r["n"]) for r in post["collapse"].values()] == [(3, 12), (0, 12)]
    better = [v for v in post["values"] if v is not None and v < 0]
    assert len(better) == 8 and round(-sum(better) / 8, 2) == 0.77
    worse = [d for d, v in zip(post["details"], post["values"]) if v is not None and v > 0]
    assert len(worse) == 1 and round(worse[0]["bpb_deep_post_nowarm"], 2) == 4.47
    # the follow-up finished after the last revision of its claims made before it (the decision layer's, made
    # later, are listed with the verdicts before them)
    last = max((r.date, r.time) for c in CLAIMS if c.name in FOLLOWUP_CLAIMS for r in c.revised
               if r.date <= stored["finished_utc"][:10])
    assert last[0] == stored["finished_utc"][:10] and stored["finished_utc"][11:] > last[1]


def test_the_earlier_full_run_is_judged_under_the_current_rules(tmp_path):
    """The from-scratch full run of 2026-11-26, measured before eight definitions were revised, re-judged under the
    current rules from its stored details: the two claims whose observability rule was added after it are judged
    by that rule, and the did-not-learn note reads the unigram level from the report's other claims."""
    report = _rendered("docs/claims-full-2026-11-26.json", tmp_path / "claims.md")
    assert "Claims marked ⚠ *earlier definition*" in (tmp_path / "claims.md").read_text()
    by = {c["name"]: c for c in report["claims"]}
    assert by["peri-variance"]["verdict"] == "not observable at this scale"
    assert by["peri-quant"]["verdict"] == "within margin" and by["peri-quant"]["raw_verdict"] == "inconclusive"
    assert not by["dyt-vs-ln"]["current_definition"]  # the stored run used the 7B alpha0, not the width-set one
    # state claims: tested on the change from initialisation (normlab.decide); cod-growth's slope is already
    # there at initialisation and training does not change it: present at initialisation, not a training effect
    assert by["cod-growth"]["verdict"] == PRESENT_AT_INIT and by["cod-growth"]["beside"]
    init = [d["slope_init_pre"] for d in by["cod-growth"]["details"]]
    assert by["cod-growth"]["p"] == pytest.approx(
        ttest_1samp([v - i for v, i in zip(by["cod-growth"]["values"], init)], 0).pvalue, rel=1e-9)
    # peri-variance-magnitude: Peri-LN's variance is orders of magnitude above Pre-LN's at initialisation; the
    # end gap (negative) is that offset, and training moves the ratio towards the claim in every seed
    mag = by["peri-variance-magnitude"]
    assert mag["verdict"] == "held" and mag["beside"] == ["magnitude_init"]
    assert all(d["magnitude_change"] > 0 for d in mag["details"]) and mag["at_init"]["end"][0] < 0
    for name in ("stablemax-collapse", "residual-sink-clipping"):  # all-zero measures: the phenomenon is absent
        assert set(by[name]["values"]) == {0.0}
        assert by[name]["verdict"] == "not observable at this scale" and not by[name]["current_definition"]
    # the did-not-learn rule: DyT's best-of-grid loss within 0.1 of the unigram level in 3 of 5 seeds (4.74 vs
    # 4.67), and the shallow DyT run the rank claims order did not learn in 3 of 5 seeds either: 'not observable
    # at this scale', p = 1 in the family (listed revisions; the verdicts before were not held, held, inconclusive)
    dyt = by["dyt-vs-ln"]
    assert dyt["verdict"] == NOT_DECIDED_DNL and dyt["raw_verdict"] == "not held"
    assert "best_grid_dyt did not learn in 3 of 5 seeds" in dyt["reason"] and dyt["p_adj"] == 1.0
    assert (dyt["did_not_learn"]["best_grid_dyt"]["k"], dyt["did_not_learn"]["best_grid_dyt"]["n"]) == (3, 5)
    assert dyt["did_not_learn"]["best_grid_ln_untied"]["k"] == 0
    for name in ("mano-rank", "mnn-rank"):
        assert by[name]["verdict"] == NOT_DECIDED_DNL and not by[name]["current_definition"]
        assert (by[name]["did_not_learn"]["loss.dyt"]["k"], by[name]["did_not_learn"]["loss.dyt"]["n"]) == (3, 5)
    assert "did not learn" not in by["mixln-lr-best"]["reason"]
    assert [c["name"] for c in report["claims"] if c["verdict"] == "not observable at this scale"] == [
        "peri-variance", "stablemax-collapse", "residual-sink-clipping"]
    assert [c["name"] for c in report["claims"] if c["verdict"] == NOT_DECIDED_DNL] == [
        "dyt-vs-ln", "mano-rank", "mnn-rank"]
    # postln-warmup's collapse rule changed after the run (0.5 -> the one rule's 0.1, a listed revision): re-judged
    # from its stored bits/byte, the Post-LN seed at 4.55 (0.12 below the unigram 4.67) no longer counts as collapsed
    pw = by["postln-warmup"]
    assert [d["collapsed_deep_post_nowarm"] for d in pw["details"]] == [0] * 5 and None not in pw["values"]
    assert pw["verdict"] == "inconclusive" and not pw["current_definition"]
    # within margin is a TOST adjusted with the family: peri-quant's survives Holm, hadamard-w4's does not
    assert by["peri-quant"]["verdict"] == "within margin" and by["peri-quant"]["tost"]["within"]
    assert by["hadamard-w4"]["verdict"] == "inconclusive" and by["hadamard-w4"]["tost"]["p"] <= 0.05 < by[
        "hadamard-w4"]["tost"]["p_adj"]
    # not under their current definition: the state claims, postln-warmup, the two all-zero ones, and the three
    # DyT claims (alpha0 now set for the width)
    assert sum(not c["current_definition"] for c in report["claims"]) == 10


def test_render_bad_input(tmp_path):
    from tests.helpers import assert_bad_input, run_inproc

    assert_bad_input(run_inproc("claims", "--render", str(tmp_path / "none.json"), cache=tmp_path / "c"),
                     "no such file")
    (tmp_path / "x.json").write_text('{"claims": []}')
    assert_bad_input(run_inproc("claims", "--render", str(tmp_path / "x.json"), cache=tmp_path / "c"),
                     "is not a claims.json")
    (tmp_path / "y.json").write_text("[1, 2")
    p = run_inproc("claims", "--render", str(tmp_path / "y.json"), cache=tmp_path / "c")
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1


def test_a_claims_own_seed_count_is_honoured(tmp_path):
    """``Claim.seeds`` is data: a claim pre-registered with 1 seed is measured on 1, one without on the budget's."""
    from normlab.experiments.claims import get_budget, run_suite

    exact = next(c for c in CLAIMS if c.name == "exact-conversion")
    claims = [dataclasses.replace(exact, seeds=1), dataclasses.replace(exact, name="exact-budget-seeds")]
    rep = run_suite(claims, get_budget("tiny"), tmp_path / "out", log=lambda s: None)
    by = {c["name"]: c for c in rep["claims"]}
    assert len(by["exact-conversion"]["values"]) == 1 and by["exact-conversion"]["spec_seeds"] == 1
    assert len(by["exact-budget-seeds"]["values"]) == get_budget("tiny").seeds == rep["seeds"] == 2
    assert rep["trained_runs"] == 2 and by["exact-conversion"]["verdict"] == "held"


def test_split_outcomes_are_judged_by_the_one_collapse_rule_from_the_stored_bits_per_byte():
    """A stored claim's collapse flags and values are recomputed by normlab.stats.learning.collapsed (diverged, or
    at or above the unigram level minus 0.1) from the recorded bits/byte: a seed 0.12 below the unigram level that
    the earlier 0.5 rule counted as collapsed trains, and its difference enters the test."""
    u = 4.67
    post = [3.0, 3.1, 2.9, 3.2, u - 0.12]
    pre = [3.5, 3.6, 3.4, 3.3, 3.45]
    det = [{"unigram_bpb": u, "bpb_post": a, "bpb_pre": b, "collapsed_post": int(a >= u - 0.5), "collapsed_pre": 0}
           for a, b in zip(post, pre)]
    old = [a - b if a < u - 0.5 else None for a, b in zip(post, pre)]
    got = judge_family([entry(old, test="collapse", args=["post", "pre"], details=det)])[0]
    assert [d["collapsed_post"] for d in got["details"]] == [0] * 5
    assert got["values"] == pytest.approx([a - b for a, b in zip(post, pre)])
    assert got["p"] == pytest.approx(ttest_1samp(np.subtract(post, pre), 0.0).pvalue, rel=1e-9)
    assert got["collapse"]["post"]["k"] == 0
    diverged = [{**det[0], "bpb_post": None}]  # a diverged run (no finite loss) stays collapsed
    assert judge_family([entry([None], test="collapse", args=["post", "pre"], details=diverged)])[0][
        "collapse"]["post"]["k"] == 1


def test_within_margin_is_an_equivalence_test_tost():
    """'within margin' only when both one-sided tests reject at the family's level, i.e. the 90% interval lies
    inside ± the margin (reference: two one-sided scipy t-tests): a null with a ±0.5 interval is not within 0.01."""
    rng = np.random.default_rng(0)
    wide = list(rng.normal(0.0, 1.0, 5))
    wide = [x - np.mean(wide) + 0.001 for x in wide]  # mean 0.001, inside the margin; the interval is about ±1
    got = judge_family([entry(wide, practical_margin=0.01)])[0]
    assert got["verdict"] != "within margin" and "not shown within margin" in got["reason"]
    tight = [0.001, 0.002, 0.0, 0.0015, 0.0005]
    got = judge_family([entry(tight, practical_margin=0.01)])[0]
    lo = ttest_1samp(tight, -0.01, alternative="greater").pvalue
    hi = ttest_1samp(tight, 0.01, alternative="less").pvalue
    assert got["verdict"] == "within margin" and got["tost"]["p"] == pytest.approx(max(lo, hi), rel=1e-9)
    c = tost(tight, 0.0, 0.01)
    ci = ttest_1samp(tight, 0.0).confidence_interval(0.90)
    assert c["ci"] == pytest.approx([ci.low, ci.high], rel=1e-9) and c["within"]
    # the synthetic null of the issue: interval ±0.5 around 0, margin 0.01
    null = [0.0 + 0.5 * s for s in (-1.2, 0.9, 0.1, -0.4, 0.6)]
    null = [x - np.mean(null) for x in null]
    e = tost(null, 0.0, 0.01)
    assert not e["within"] and e["p"] > 0.4
    assert judge_family([entry(null, practical_margin=0.01)])[0]["verdict"] == "inconclusive"


def test_a_claim_whose_test_cannot_be_computed_counts_as_p_one_in_the_family():
    """Holm over the claims with a significance test: one without two finite values stays in the family as p = 1
    (m = 3, not 2); a claim with no significance test (exact) is not a member."""
    from statsmodels.stats.multitest import multipletests

    a, b = [0.1, 0.12, 0.11, 0.13], [0.5, 0.4, 0.45, 0.47]
    got = judge_family([entry(a), entry(b), entry([0.3]), entry([0.0], test="exact", direction="exact",
                                                                 tolerance=1.0)])
    ref = multipletests([ttest_1samp(a, 0).pvalue, ttest_1samp(b, 0).pvalue, 1.0], method="holm")[1]
    assert [g["p_adj"] for g in got[:2]] == pytest.approx(list(ref[:2]), rel=1e-9)
    assert got[2]["p_adj"] is None and got[3]["p_adj"] is None


# ---------------------------------------------------------------- the definitions: one YAML per claim, loaded
SPEC_DIR = Path(__file__).resolve().parents[3] / "normlab" / "experiments" / "claims"
STORED = DOCS.parent / "claims-full-2026-11-28.json"  # the run docs/claims.md renders
EARLIER = DOCS.parent / "claims-full-2026-11-26.json"  # the run before the revisions
NOT_IN_SOURCE = {
    "date": r"\b20\d\d-[01]\d-[0-3]\d\b",
    "commit hash": r"\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b",
    "value ± half-width": r"\d\s*±\s*\d",
    "p-value": r"\b(?:Holm )?p(?: =| <)? 0\.\d",
    "an outcome's seed count": r"\b\d+ of \d+ seeds\b",
    "a verdict with its value": r"\b(?:held|inconclusive|within margin)\s*\(\s*[+-]?\d",
    "a run's result": r"\b(?:full|quick) run of\b",
}
"""What results look like in prose: dates, commit hashes, measured values with intervals, p-values, "k of n seeds",
"held (+0.136)", "the full run of ...". Definitions and the code that reads them hold none of them."""


def test_every_definition_file_loads_and_is_registered_in_the_suites_order():
    import yaml

    from normlab.experiments.claims.specs import CLAIM_NAMES, claim_from_dict, get_claim, load_claims

    files = sorted(SPEC_DIR.glob("defs/*.yaml"))
    order = yaml.safe_load((SPEC_DIR / "suite.yaml").read_text())["claims"]
    assert sorted(f.stem for f in files) == sorted(order) == sorted(CLAIM_NAMES) and order == CLAIM_NAMES
    for f in files:
        c = claim_from_dict(yaml.safe_load(f.read_text()), f.name)
        assert c.name == f.stem and get_claim(c.name).definition() == c.definition()
    assert [c.name for c in load_claims()] == CLAIM_NAMES


def test_spec_hashes_equal_the_stored_results_or_carry_a_revision_from_them():
    """A stored full run keys each result on its spec hash: the run docs/claims.md renders has every current
    definition's; the earlier run has them too, except for the claims revised since, each of which has a revision
    from exactly that hash."""
    import json

    current = {c["name"]: c["spec_hash"] for c in json.loads(STORED.read_text())["claims"]}
    from normlab.experiments.claims.specs import get_claim

    # measured under every current definition but the state claims', each revised from exactly that hash
    assert {n for n, h in current.items() if h != spec_hash(get_claim(n))} == STATE_CLAIMS
    assert all(any(r.hash_before == current[n] for r in get_claim(n).revised) for n in STATE_CLAIMS)
    stored = {c["name"]: c["spec_hash"] for c in json.loads(EARLIER.read_text())["claims"]}
    # every claim but those declared after both stored runs, before any run of their own (the frontier budget's)
    assert set(stored) == set(current) == {c.name for c in CLAIMS} - set(FRONTIER_CLAIMS)
    frontier = {c["name"]: c["spec_hash"] for c in json.loads((DOCS.parent / FRONTIER.split("/")[1]).read_text())[
        "claims"]}
    assert set(frontier) == set(FRONTIER_CLAIMS) and all(h == spec_hash(get_claim(n)) for n, h in frontier.items())
    measured = [c for c in CLAIMS if c.name in stored]
    changed = {c.name for c in measured if spec_hash(c) != stored[c.name]}
    assert changed == {c.name for c in measured if any(r.hash_before == stored[c.name] for r in c.revised)}
    assert changed == {"cod-growth", "peri-variance-magnitude", "postln-warmup", "stablemax-collapse",
                       "residual-sink-clipping", "dyt-vs-ln", "mano-rank", "mnn-rank", "cod-lns", "peri-massive"}
    # and the hashes docs/claims.md records as "measured under" are those of the runs it renders
    assert recorded_hashes(DOCS.read_text()) == {**current, **frontier}


def test_definitions_hold_no_dates_commit_hashes_or_measured_numbers():
    import re

    sources = [*sorted(SPEC_DIR.glob("defs/*.yaml")), SPEC_DIR / "suite.yaml",
               *(SPEC_DIR / f for f in ("specs.py", "variants.py", "budgets.py", "measure_registry.py", "measures.py",
                                         "measures_lr.py", "measures_surgery.py", "measures_literature.py", "docs.py"))]
    found = [f"{p.name}:{i}: {what}: {line.strip()[:80]}" for p in sources
             for i, line in enumerate(p.read_text().splitlines(), 1)
             for what, pat in NOT_IN_SOURCE.items() if re.search(pat, line)]
    assert found == []
    # the patterns catch what the earlier specification held
    for bad in ("in the full run of 2026-11-26 its best-of-grid loss", "(commit 6132de0)", "-0.279 ± 0.390 bits/byte",
                "undecided (Holm p 0.215)", "in 3 of 5 seeds it did not learn", "held (+0.136)"):
        assert any(re.search(p, bad) for p in NOT_IN_SOURCE.values()), bad


@pytest.mark.parametrize("change,message", [
    ({"colour": "red"}, "unknown key 'colour'"),
    ({"question": {"metric": "m", "expected": "> 0", "direction": "greatr"}}, "direction must be one of"),
    ({"question": {"metric": "m", "expected": "> 0", "direction": "greater", "margn": 1}}, "did you mean 'margin'"),
    ({"variants": ["deep_pri"]}, "unknown variant 'deep_pri'"),
    ({"measure": {"name": "growth", "args": [True]}}, "args must be a list"),
    ({"question": {"metric": "m", "expected": "> 0", "direction": "greater", "no_effect": "0.05"}},
     "no_effect must be a finite number"),
    ({"question": {"metric": "m", "expected": "> 0", "direction": "greater", "learn_unit": "nats"}},
     "learn_unit must be one of"),
])
def test_a_bad_definition_is_one_line_naming_the_file_and_what_is_allowed(change, message):
    import yaml

    from normlab.experiments.claims.specs import claim_from_dict

    good = yaml.safe_load((SPEC_DIR / "defs" / "cod-growth.yaml").read_text())
    with pytest.raises(NormlabError, match=message) as e:
        claim_from_dict({**good, **change}, "defs/x.yaml")
    assert str(e.value).startswith("defs/x.yaml") and "\n" not in str(e.value)


def test_revisions_are_history_apart_from_the_definitions():
    """Every claim's revisions come from normlab/evidence/revisions.yaml (dated, with the verdict before), never
    from its definition; the page lists them all."""
    import yaml

    rows = yaml.safe_load((SPEC_DIR.parent.parent / "evidence" / "revisions.yaml").read_text())
    assert sorted((r["claim"], r["date"], r["verdict_before"]) for r in rows) == sorted(
        (c.name, r.date, r.verdict_before) for c in CLAIMS for r in c.revised)
    assert all("revised" not in (SPEC_DIR / "defs" / f"{c.name}.yaml").read_text() for c in CLAIMS)
    from normlab.experiments.claims.docs import revisions_lines

    assert len([ln for ln in revisions_lines(CLAIMS) if ln.startswith("| `")]) == len(rows)


def test_a_revised_claim_is_exploratory_only_on_seeds_a_revision_saw(monkeypatch):
    """judge() marks a claim exploratory exactly when one of its revisions was made after results on a seed it is
    judged on (Revision.seeds_seen): the stored full run moved to the block 9000-9004 has no exploratory claim; a
    revision that saw seed 9002 makes its claim exploratory there again; a report from before claims stored their
    seeds is read as seeds seed_base .. seed_base + n - 1."""
    import json

    import normlab.experiments.claims.execution as execution
    from normlab.experiments.claims.execution import judge
    from normlab.experiments.claims.specs import claim_seeds

    stored = json.loads(STORED.read_text())
    fresh = {**stored, "claims": [{**c, "seeds": [9000 + s for s in c["seeds"]]} for c in stored["claims"]]}
    judged = judge(fresh)
    assert not any(c["exploratory"] for c in judged["claims"])
    assert [c["verdict"] for c in judged["claims"]] == [c["verdict"] for c in judge(stored)["claims"]]
    seen = Revision("2026-12-01", "a later change", "a reason", "held", seeds_seen=(9002,))
    cod = next(c for c in CLAIMS if c.name == "cod-growth")
    patched = dataclasses.replace(cod, revised=(*cod.revised, seen))
    monkeypatch.setattr(execution, "CLAIMS", [patched if c.name == "cod-growth" else c for c in CLAIMS])
    again = {c["name"]: c["exploratory"] for c in judge(fresh)["claims"]}
    assert again["cod-growth"] and sum(again.values()) == 1
    old = {"seeds": 3, "budget_spec": {"seed_base": 5000}}
    assert claim_seeds(old, {"name": "x"}) == [5000, 5001, 5002]
    assert claim_seeds(old, {"seeds": [7, 9]}) == [7, 9]
    # unknown seeds confirm nothing: a report without them judges every revised claim exploratory
    from normlab.experiments.claims.specs import confirms

    assert claim_seeds({}, {"name": "x"}) == [] and not confirms(cod.revised, []) and confirms((), [])
    unknown = {**stored, "seeds": 0, "claims": [{k: v for k, v in c.items() if k != "seeds"} for c in stored["claims"]]}
    assert {c["name"] for c in judge(unknown)["claims"] if c["exploratory"]} == {c.name for c in CLAIMS if c.revised}


def test_every_revision_lists_the_seeds_of_the_stored_results_it_came_after():
    """``seeds_seen`` is written by hand: every stored claims result in docs/ dated on or before a revision of one
    of its claims (the date in its file name) has that claim's seeds in the revision's ``seeds_seen``, so a result
    that shaped a revision can never confirm it."""
    import json
    import re

    checked = set()
    for f in sorted(DOCS.parent.glob("claims-*-20??-??-??.json")):
        date = re.search(r"(\d{4}-\d{2}-\d{2})\.json$", f.name).group(1)
        stored = json.loads(f.read_text())
        finished = stored.get("finished_utc")  # "YYYY-MM-DD HH:MM" where recorded
        revised = {c.name: c.revised for c in CLAIMS}
        for c in stored["claims"]:
            for r in revised.get(c["name"], ()):
                after = r.date > date or (r.date == date and not (r.time and finished and finished.startswith(date)
                                                                  and finished[11:] > r.time))
                if after:  # the revision may have seen this result: its seeds must be listed
                    assert set(c["seeds"]) <= set(r.seeds_seen), (f.name, c["name"], r.date)
                    checked.add((f.name, c["name"]))
    # postln-warmup's rule revision of 2026-11-28 came after the full run and both confirmations of that day
    assert {(f, "postln-warmup") for f in ("claims-full-2026-11-28.json", "claims-confirm-2026-11-28.json",
                                          "claims-confirm-seeds1000-2026-11-28.json")} <= checked


@pytest.mark.parametrize("time", ["10", "24:00", "9:05", "10:60", "noon", 0, 614, None])  # YAML reads 10:14 as 614
def test_a_revision_time_is_hh_mm_or_none(time):
    with pytest.raises(NormlabError, match="allowed: HH:MM \\(UTC\\) as a quoted string, or none") as e:
        Revision("2026-12-01", "what", "why", "held", seeds_seen=(0,), time=time)
    assert "\n" not in str(e.value)
    assert Revision("2026-12-01", "w", "y", "held", seeds_seen=(0,), time="23:59").to_dict()["time"] == "23:59"
    assert "time" not in Revision("2026-12-01", "w", "y", "held", seeds_seen=(0,)).to_dict()


@pytest.mark.parametrize("seen", [(), [], ["0"], [-1], [True], None])
def test_a_revision_without_the_seeds_it_saw_is_refused(seen):
    with pytest.raises(NormlabError, match="needs seeds_seen, a non-empty list of the seeds") as e:
        Revision("2026-12-01", "what", "why", "held", seeds_seen=seen)
    assert "\n" not in str(e.value)
