"""The claims suite's budgets (normlab.experiments.claims.budgets): the confirm budget is the full budget on a seed
block no revision saw, over every revised claim; each budget's measurement settings are its own fields."""

import dataclasses
from pathlib import Path

import pytest

from normlab.errors import NormlabError
from normlab.experiments.claims.budgets import BUDGETS, CONFIRM_CLAIMS, get_budget
from normlab.experiments.claims.specs import CLAIMS, confirms


def test_confirm_is_the_full_budget_on_a_fresh_seed_block():
    full, confirm = BUDGETS["full"], get_budget("confirm")
    differ = {f.name for f in dataclasses.fields(full) if getattr(full, f.name) != getattr(confirm, f.name)}
    assert differ == {"name", "seed_base", "claims"}  # the same models, steps, measurements: only the seeds move
    assert confirm.seed_list(5) == [6000, 6001, 6002, 6003, 6004]
    assert full.seed_list(5) == [0, 1, 2, 3, 4]


DECISION_LAYER = "2026-12-07"  # the date of the decision layer's rule changes (normlab/evidence/revisions.yaml)


def test_confirm_runs_every_revised_claim_on_seeds_no_revision_saw():
    """Declared before its runs: every claim revised after a verdict on seeds 0-4, whatever that verdict (a
    selection by verdict would be a forking path); none of its seeds was seen by a revision, so its verdicts are
    confirmatory, while the same claims on the full budget's seeds are not. A claim revised again after the
    confirmation's results (postln-warmup's split-outcome rule, after seeds 6000-6004) is exploratory there too, and
    on the follow-up's block (its seeds 7000-7007 were stored when that rule was revised), where the others are
    confirmatory."""
    # the claims revised before the confirmation (the decision layer's rule changes came after it: REJUDGE_CLAIMS)
    revised = {c.name for c in CLAIMS if any(r.date < DECISION_LAYER for r in c.revised)}
    assert set(CONFIRM_CLAIMS) == revised and len(CONFIRM_CLAIMS) == len(revised) == 17
    confirm, full, followup = get_budget("confirm"), BUDGETS["full"], BUDGETS["followup"]
    after = {c.name for c in CLAIMS if any(set(r.seeds_seen) & set(confirm.seed_list(5)) for r in c.revised)}
    assert after == {"postln-warmup", "cod-growth", "peri-massive", "peri-variance-magnitude", "hadamard-w4",
                     "peri-quant", "mano-rank"}
    for c in CLAIMS:
        if c.revised:
            assert confirms(c.revised, confirm.seed_list(c.seeds or confirm.seeds)) == (c.name not in after)
            assert not confirms(c.revised, full.seed_list(c.seeds or full.seeds))
            # postln-warmup's rule was revised while the follow-up ran, after its seeds 7000-7007 were stored;
            # mano-rank's family (the TOSTs joined it) after the follow-up's results
            assert confirms(c.revised, followup.seed_list(followup.seeds)) == (
                c.name not in ("postln-warmup", "mano-rank"))


def test_rejudge_runs_the_claims_the_decision_layer_changed_on_seeds_no_revision_saw():
    """Declared before its runs: every claim whose stored verdict the decision layer's rules changed, or which they
    cannot judge from stored details (a state claim without its at-init value), on the fresh block 9100-9104: no
    revision saw it and no other shipped question uses it, so its verdicts are confirmatory."""
    from normlab.experiments.claims.budgets import REJUDGE_CLAIMS

    rejudge = get_budget("rejudge")
    assert rejudge.seed_list(rejudge.seeds) == list(range(9100, 9105)) and rejudge.claims == REJUDGE_CLAIMS
    specs = {c.name: c for c in CLAIMS}
    assert all(any(r.date == DECISION_LAYER for r in specs[n].revised) for n in REJUDGE_CLAIMS)
    assert all(confirms(specs[n].revised, rejudge.seed_list(5)) for n in REJUDGE_CLAIMS)
    used = set()
    for b in BUDGETS.values():
        if b.name != "rejudge":
            used |= set(b.seed_list(max(b.seeds, 12)))
    assert not used & set(rejudge.seed_list(5))


def test_measurement_settings_are_budget_fields():
    """The post-hoc measurements' token counts and norm-removal steps, as the measures used them by budget name
    before they became fields (tiny 512 / 2, quick 8192 / 10, full 16384 / 30); scale kept quick's, which it fell
    back to; confirm, followup, rejudge and frontier measure as full."""
    got = {n: (b.measure_tokens, b.removal_steps) for n, b in BUDGETS.items()}
    assert got == {"tiny": (512, 2), "quick": (8192, 10), "full": (16384, 30), "scale": (8192, 10),
                   "confirm": (16384, 30), "followup": (16384, 30), "rejudge": (16384, 30),
                   "frontier": (16384, 30)}
    assert {"measure_tokens", "removal_steps"} <= set(BUDGETS["full"].to_dict())  # stored with the results


def test_an_unknown_budget_is_one_line_naming_the_allowed():
    with pytest.raises(NormlabError,
                       match="unknown budget 'huge'; allowed: tiny, quick, full, scale, confirm, followup"):
        get_budget("huge")


def test_a_confirmation_is_the_same_budget_on_other_seeds_and_old_specs_read_as_they_ran():
    """A stored spec from before the measurement fields existed reads as the measures then ran it (by name: tiny /
    quick / full, any other name quick's); tuples compare as the lists JSON stores."""
    import json

    from normlab.experiments.claims.budgets import confirmation_mismatch, stored_spec

    stored = json.loads(json.dumps(BUDGETS["full"].to_dict()))
    del stored["measure_tokens"], stored["removal_steps"]  # written before they were fields
    assert stored_spec(stored)["measure_tokens"] == 16384 and stored_spec(stored)["removal_steps"] == 30
    assert stored_spec({"name": "scale"})["measure_tokens"] == 8192
    assert confirmation_mismatch(stored, get_budget("confirm").to_dict(), "f.json", "c.json") is None
    why = confirmation_mismatch(stored, BUDGETS["quick"].to_dict(), "f.json", "c.json")
    assert why.startswith("c.json: a confirmation runs the main run's budget on other seeds; its deep_depth, ")
    assert "measure_tokens" in why and why.endswith("differ from f.json's")


def test_followup_runs_the_claims_two_fresh_confirmations_disagree_on_with_more_seeds_on_a_fresh_block():
    """``followup`` is ``confirm`` (the full budget's runs) on 12 seeds of its own block 7000-7011 and follows it;
    its claims are exactly those whose verdicts differ between the two stored 5-seed confirmation runs (1000-1004
    and 6000-6004), recomputed here from those files under the current rules; its seeds are fresh for them."""
    from normlab.experiments.claims.budgets import FOLLOWUP_CLAIMS, confirmation_mismatch
    from normlab.experiments.claims.execution import judge
    from normlab.io import read_json

    confirm, followup = BUDGETS["confirm"], get_budget("followup")
    differ = {f.name for f in dataclasses.fields(confirm) if getattr(confirm, f.name) != getattr(followup, f.name)}
    assert differ == {"name", "seeds", "seed_base", "claims", "follows"}
    assert followup.follows == "confirm" and followup.seed_list(followup.seeds) == list(range(7000, 7012))
    assert confirmation_mismatch(BUDGETS["full"].to_dict(), followup.to_dict(), "f.json", "u.json") is None
    docs = Path(__file__).resolve().parents[3] / "docs"
    first, second = (read_json(docs / f) for f in ("claims-confirm-seeds1000-2026-11-28.json",
                                                   "claims-confirm-2026-11-28.json"))
    verdicts = {c["name"]: c["verdict"] for c in first["claims"]}  # as stored: the verdicts published then
    disagree = [c["name"] for c in second["claims"] if verdicts[c["name"]] != c["verdict"]]
    assert sorted(disagree) == sorted(FOLLOWUP_CLAIMS) and len(FOLLOWUP_CLAIMS) == 3
    # under the rules since (postln-warmup's split-outcome revision, made after both) that one agrees: inconclusive
    now = [{c["name"]: c["verdict"] for c in judge(d)["claims"]} for d in (first, second)]
    assert [n for n in FOLLOWUP_CLAIMS if now[0][n] != now[1][n]] == ["lssar-extrapolation", "mano-rank"]
    specs = {c.name: c for c in CLAIMS}
    for name in FOLLOWUP_CLAIMS:
        c = specs[name]
        assert c.seeds is None  # the budget's 12 seeds, not a claim's own count
        assert c.revised and confirms(c.revised, followup.seed_list(followup.seeds)) == (
            name not in ("postln-warmup", "mano-rank"))
