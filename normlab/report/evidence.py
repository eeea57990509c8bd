"""The evidence ``normlab advise`` reads, packaged: a summary of the stored claims results and their replications.

``normlab/evidence/claims.json`` ships inside the package (an installed wheel has no docs/), generated from the
results the docs hold (``docs/claims-full-*.json``, written by ``normlab claims``, and ``docs/replications-*.json``,
the demo's declared replications as docs/compare.md tabulates them) by::

    python -m normlab.report.evidence docs/claims-full-2026-11-28.json docs/replications-2026-11-26.json \\
        normlab/evidence/claims.json

``tests/report/test_evidence.py`` rebuilds it from those files and fails when the packaged copy differs. Torch-free.
"""

from __future__ import annotations

import json
import sys
from importlib import resources
from pathlib import Path
from typing import Any

from normlab.errors import NormlabError
from normlab.experiments.claims.execution import judge
from normlab.io import read_json

FORMAT = "normlab-evidence-v1"
CLAIM_FIELDS = ("name", "claim", "paper", "metric", "verdict", "measured", "ci", "p", "p_adj", "test", "direction",
                "n", "seeds", "scale", "observable", "reason", "practical_margin", "tolerance", "current_definition",
                "exploratory")
"""The fields of each claims-suite record that advise reads (the per-seed values, details and run paths stay in
docs/)."""


def build_evidence(claims: dict[str, Any], replications: dict[str, Any], *, claims_name: str,
                   replications_name: str) -> dict[str, Any]:
    """The packaged evidence from a claims results document (``normlab-claims-v1``), judged by the current rules
    (``judge``: Holm over the family, margins, observability, revisions), and a replications document
    (``normlab-replications-v1``); ``*_name``: the file names recorded as the sources."""
    if claims.get("format") != "normlab-claims-v1":
        raise NormlabError(f"{claims_name}: not a normlab claims results file (format {claims.get('format')!r})")
    if replications.get("format") != "normlab-replications-v1":
        raise NormlabError(f"{replications_name}: not a normlab replications file")
    spec = claims.get("budget_spec") or {}
    names = {c["name"] for c in claims["claims"]}
    reps = replications["replications"]
    unknown = sorted({r["claim"] for r in reps} - names)
    if unknown:
        raise NormlabError(f"{replications_name}: replications of claims not in {claims_name}: {', '.join(unknown)}")

    claims = judge(claims)  # the verdicts of the current rules, as docs/claims.md renders them (one rule, every path)
    return {
        "format": FORMAT,
        "sources": {"claims": claims_name, "replications": replications_name},
        "suite": {"budget": claims.get("budget"), "corpus": spec.get("source"), "seeds": claims.get("seeds"),
                  "context": spec.get("context"), "heads": spec.get("heads"), "batch_size": spec.get("batch_size"),
                  "correction": claims.get("correction"), "family_size": claims.get("family_size"),
                  "command": claims.get("command")},
        "claims": [{k: c.get(k) for k in CLAIM_FIELDS} for c in claims["claims"]],
        "replications": reps,
    }


def load_evidence() -> dict[str, Any]:
    """The packaged evidence (``normlab/evidence/claims.json``)."""
    text = resources.files("normlab").joinpath("evidence", "claims.json").read_text(encoding="utf-8")
    data = json.loads(text)
    if data.get("format") != FORMAT:
        raise NormlabError("normlab/evidence/claims.json is not normlab evidence; reinstall normlab")
    return data


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print("usage: python -m normlab.report.evidence CLAIMS.json REPLICATIONS.json OUT.json", file=sys.stderr)
        return 2
    claims, reps, out = map(Path, argv)
    data = build_evidence(read_json(claims), read_json(reps), claims_name=claims.name, replications_name=reps.name)
    out.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
