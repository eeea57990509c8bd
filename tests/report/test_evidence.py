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


def test_packaged_evidence_equals_the_rebuild_from_docs():
    want = build_evidence(json.loads(CLAIMS.read_text()), json.loads(REPS.read_text()), claims_name=CLAIMS.name,
                          replications_name=REPS.name)
    assert load_evidence() == json.loads(json.dumps(want)), (
        "normlab/evidence/claims.json is stale: python -m normlab.report.evidence docs/claims-full-2026-11-28.json "
        "docs/replications-2026-11-26.json normlab/evidence/claims.json")


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
