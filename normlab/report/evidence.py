"""The evidence ``normlab advise`` reads, packaged: a summary of the stored claims results and their replications.

``normlab/evidence/claims.json`` ships inside the package (an installed wheel has no docs/), generated from the
results the docs hold (``docs/claims-full-*.json``, written by ``normlab claims``; ``docs/claims-confirm-*.json``,
the revised claims measured on a fresh seed block by ``normlab claims --budget confirm``;
``docs/claims-followup-*.json``, ``normlab claims --budget followup``; and
``docs/replications-*.json``, the demo's declared replications as docs/compare.md tabulates them) by::

    python -m normlab.report.evidence docs/claims-full-2026-11-28.json docs/replications-2026-11-26.json \\
        normlab/evidence/claims.json --confirm docs/claims-confirm-2026-11-28.json \\
        --confirm docs/claims-followup-2026-11-28.json

Each claim's record is its confirmatory measurement: a claim exploratory in the main run (judged on seeds a
revision of its definition saw) takes its record from the confirmation run where it is confirmatory there, with
the exploratory result beside it (``exploratory_result``); a claim exploratory everywhere keeps its main record. A
follow-up (``normlab claims --budget followup``: more seeds on another fresh block, declared before its runs, for the
claims two fresh confirmations disagreed on) supersedes the confirmation it follows for its claims, whose record is
kept beside (``superseded_confirmation``). A claim exploratory on a confirmation's block as well (a revision saw
those seeds too) is not confirmed by it; that block's result is kept beside its record (``exploratory_elsewhere``).
``tests/report/test_evidence.py`` rebuilds it from those files and fails when the packaged copy differs. Torch-free.
"""

from __future__ import annotations

import argparse
import sys
from importlib import resources
from pathlib import Path
from typing import Any

from normlab.errors import NormlabError, clip, printable
from normlab.experiments.claims.budgets import confirmations_problem
from normlab.experiments.claims.docs import seed_span
from normlab.experiments.claims.execution import judge
from normlab.experiments.claims.specs import claim_seeds
from normlab.io import dumps, loads_json, read_json, write_text

FORMAT = "normlab-evidence-v1"
CLAIM_FIELDS = ("name", "claim", "paper", "metric", "verdict", "measured", "ci", "p", "p_adj", "test", "direction",
                "n", "seeds", "scale", "observable", "reason", "practical_margin", "tolerance", "current_definition",
                "exploratory", "source")
"""The fields of each claims-suite record that advise reads (the per-seed values, details and run paths stay in
docs/)."""


def _check_claims(doc: dict[str, Any], name: str) -> None:
    if doc.get("format") != "normlab-claims-v1":
        raise NormlabError(f"{name}: not a normlab claims results file (format {doc.get('format')!r})")


def _records(judged: dict[str, Any], name: str) -> dict[str, dict[str, Any]]:
    """Claim name -> its record (``CLAIM_FIELDS``) from a document judged by the current rules (``judge``: Holm
    over the document's family, margins, observability, revisions and the seeds they saw), ``source`` its file."""
    return {c["name"]: {**{k: c.get(k) for k in CLAIM_FIELDS}, "source": name} for c in judged["claims"]}


def _summary(record: dict[str, Any]) -> dict[str, Any]:
    """The fields of a record kept beside the one that replaced it (an exploratory result, a superseded
    confirmation)."""
    return {k: record[k] for k in ("verdict", "measured", "ci", "p_adj", "n", "seeds", "source")}


def build_evidence(claims: dict[str, Any], replications: dict[str, Any], *, claims_name: str,
                   replications_name: str, confirmations: tuple[tuple[dict[str, Any], str], ...] = (),
                   more_replications: tuple[tuple[dict[str, Any], str], ...] = ()) -> dict[str, Any]:
    """The packaged evidence from a claims results document (``normlab-claims-v1``) and a replications document
    (``normlab-replications-v1``); ``*_name``: the file names recorded as the sources. ``confirmations``: (claims
    results document, file name) of runs on fresh seed blocks (``--budget confirm``, ``--budget followup``): a claim
    exploratory in ``claims`` and confirmatory in one of them takes that record, each document judged as its own
    family; a follow-up's record supersedes the record of the confirmation it follows (kept as
    ``superseded_confirmation``). Two confirmations of one claim otherwise are refused. A confirmatory claim the
    main run does not hold (declared after it, first measured on that block: ``--budget frontier``) is added with
    its record there, after the main run's claims. ``more_replications``:
    (replications document, file name) of further declared sweeps (the one ``normlab advise`` writes for its next
    question), their entries after ``replications``'; one seed block of one claim on one corpus given twice is
    refused (the same runs would count as two replications)."""
    _check_claims(claims, claims_name)
    budget_spec = claims.get("budget_spec") or {}
    names = {c["name"] for c in claims["claims"]}
    reps: list[dict[str, Any]] = []
    seen: dict[tuple[str, str, tuple[int, ...]], str] = {}
    for doc, name in ((replications, replications_name), *more_replications):
        if doc.get("format") != "normlab-replications-v1":
            raise NormlabError(f"{name}: not a normlab replications file")
        unknown = sorted({r["claim"] for r in doc["replications"]} - names)
        if unknown:
            raise NormlabError(f"{name}: replications of claims not in {claims_name}: {', '.join(unknown)}")
        for r in doc["replications"]:
            key = (r["claim"], r["corpus"], tuple(r["seeds"]))
            if key in seen:
                raise NormlabError(f"{name}: {r['claim']} on {r['corpus']}, seeds {seed_span(r['seeds'])} is in "
                                   f"{seen[key]} already; give each replication once")
            seen[key] = name
        reps += doc["replications"]
    judged = judge(claims)  # the verdicts of the current rules, as docs/claims.md renders them (one rule, every path)
    records = _records(judged, claims_name)
    confirmed = []
    for doc, name in confirmations:
        _check_claims(doc, name)
    why = confirmations_problem(budget_spec, list(confirmations), claims_name)  # the check the rendered page makes
    if why:
        raise NormlabError(why)
    budgets = {doc["budget"]: name for doc, name in confirmations}
    # a follow-up (its budget ``follows`` another confirmation's, declared before its runs) is applied after the
    # confirmation it follows, and only its claims' records are replaced
    order = sorted(confirmations, key=lambda dn: bool(dn[0]["budget_spec"].get("follows")))
    own: list[str] = []  # claims the main run does not hold, in the order their run lists them
    for doc, name in order:
        follows = doc["budget_spec"].get("follows")
        doc_judged = judge(doc)
        for cname, rec in _records(doc_judged, name).items():
            main = records.get(cname)
            if main is None and cname not in own and not rec["exploratory"] and rec["current_definition"]:
                # a claim first measured on this block (declared after the main run, before any run of its own)
                records[cname] = rec
                own.append(cname)
                continue
            if main is not None and rec["exploratory"] and rec["current_definition"]:
                # a revision saw these seeds too: not confirmed here, but its result stays beside the record
                main.setdefault("exploratory_elsewhere", []).append(_summary(rec))
                continue
            if main is None or rec["exploratory"] or not rec["current_definition"]:
                continue  # not confirmed here (a revision came after these results)
            before = main.get("exploratory_result")
            if before is not None and not (follows and main["source"] == budgets[follows]):
                raise NormlabError(f"{name}: {cname} is confirmed by {main['source']} already; give one "
                                   "confirmation per claim (choosing between two by their verdicts is a forking path)")
            if before is None and not main["exploratory"]:
                continue  # confirmatory in the main run already
            records[cname] = {**rec, "exploratory_result": before if before is not None else _summary(main),
                              **({"superseded_confirmation": _summary(main)} if before is not None else {}),
                              **({"exploratory_elsewhere": main["exploratory_elsewhere"]}
                                 if main.get("exploratory_elsewhere") else {})}
        seeds = sorted({s for c in doc["claims"] for s in claim_seeds(doc, c)})
        confirmed.append({"source": name, "budget": doc.get("budget"), "seeds": seeds,
                          "family_size": doc_judged.get("family_size"), "command": doc.get("command"),
                          **({"follows": budgets[follows]} if follows else {})})
    return {
        "format": FORMAT,
        "sources": {"claims": claims_name, "replications": replications_name,
                    **({"more_replications": [n for _, n in more_replications]} if more_replications else {}),
                    **({"confirmations": [n for _, n in order]} if confirmations else {})},
        "suite": {"budget": claims.get("budget"), "corpus": budget_spec.get("source"), "seeds": claims.get("seeds"),
                  "context": budget_spec.get("context"), "heads": budget_spec.get("heads"),
                  "batch_size": budget_spec.get("batch_size"),
                  "correction": judged.get("correction"), "family_size": judged.get("family_size"),
                  "command": claims.get("command"), **({"confirmations": confirmed} if confirmed else {})},
        "claims": [records[c["name"]] for c in claims["claims"]] + [records[n] for n in own],
        "replications": reps,
    }


def load_evidence() -> dict[str, Any]:
    """The packaged evidence (``normlab/evidence/claims.json``)."""
    text = resources.files("normlab").joinpath("evidence", "claims.json").read_text(encoding="utf-8")
    data = loads_json(text, "normlab/evidence/claims.json")  # the bounded reader (depth, digits)
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise NormlabError("normlab/evidence/claims.json is not normlab evidence; reinstall normlab")
    why = evidence_problem(data)
    if why:
        raise NormlabError(f"normlab/evidence/claims.json: {why}; reinstall normlab or rebuild it "
                           "(python -m normlab.report.evidence)")
    return data


def _ints(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in v)


def _record_problem(r: Any, where: str) -> str | None:
    """What is wrong with a result kept beside a record (``_summary``'s fields advise reads), or None."""
    if not isinstance(r, dict):
        return f"{where} must be an object"
    if not _ints(r.get("seeds")):
        return f"{where}.seeds must be a list of integers, got {clip(r.get('seeds'), 60)}"
    for k in ("verdict", "source"):
        if not isinstance(r.get(k), str):
            return f"{where}.{k} must be a string, got {clip(r.get(k), 60)}"
    return None


def evidence_problem(data: dict[str, Any]) -> str | None:
    """The first field of an evidence document (``build_evidence``'s shape) that ``normlab advise`` cannot read,
    named with what it must be, or None: the top-level sections, each claim's name and verdict, the results kept
    beside it (``exploratory_result``, ``superseded_confirmation``, each of ``exploratory_elsewhere``) and each
    replication's claim and seeds."""
    for k in ("sources", "suite"):
        if not isinstance(data.get(k), dict):
            return f"{k} must be an object, got {clip(data.get(k), 60)}"
    if not isinstance(data["sources"].get("replications"), str):
        return f"sources.replications must be a string, got {clip(data['sources'].get('replications'), 60)}"
    more = data["sources"].get("more_replications", [])
    if not (isinstance(more, list) and all(isinstance(x, str) for x in more)):
        return f"sources.more_replications must be a list of strings, got {clip(more, 60)}"
    for k in ("claims", "replications"):
        if not (isinstance(data.get(k), list) and all(isinstance(x, dict) for x in data[k])):
            return f"{k} must be a list of objects, got {clip(data.get(k), 60)}"
    for i, c in enumerate(data["claims"]):
        for k in ("name", "verdict"):
            if not isinstance(c.get(k), str):
                return f"claims[{i}].{k} must be a string, got {clip(c.get(k), 60)}"
        for k in ("exploratory_result", "superseded_confirmation"):
            why = c.get(k) is not None and _record_problem(c[k], f"claims[{i}].{k}")
            if why:
                return why
        beside = c.get("exploratory_elsewhere") or []
        if not isinstance(beside, list):
            return f"claims[{i}].exploratory_elsewhere must be a list of objects, got {clip(beside, 60)}"
        for j, r in enumerate(beside):
            why = _record_problem(r, f"claims[{i}].exploratory_elsewhere[{j}]")
            if why:
                return why
    for i, r in enumerate(data["replications"]):
        if not isinstance(r.get("claim"), str):
            return f"replications[{i}].claim must be a string, got {clip(r.get('claim'), 60)}"
        if not (_ints(r.get("seeds")) and r["seeds"]):
            return f"replications[{i}].seeds must be a non-empty list of integers, got {clip(r.get('seeds'), 60)}"
        for k in ("corpus", "command", "contrast", "reading"):  # what advise prints of a replication
            if not isinstance(r.get(k), str):
                return f"replications[{i}].{k} must be a string, got {clip(r.get(k), 60)}"
        for k in ("estimate", "half_width"):
            if not (isinstance(r.get(k), (int, float)) and not isinstance(r.get(k), bool)):
                return f"replications[{i}].{k} must be a number, got {clip(r.get(k), 60)}"
        if r.get("scale") is not None and not isinstance(r["scale"], str):
            return f"replications[{i}].scale must be a string, got {clip(r['scale'], 60)}"
    return None


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m normlab.report.evidence",
                                 description="build the packaged evidence normlab advise reads")
    ap.add_argument("claims", type=Path)
    ap.add_argument("replications", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--confirm", type=Path, action="append", default=[], metavar="CLAIMS_JSON",
                    help="a claims run on a fresh seed block (normlab claims --budget confirm); repeatable")
    ap.add_argument("--replications", dest="more", type=Path, action="append", default=[], metavar="REPLICATIONS_JSON",
                    help="a further declared sweep's replications document (normlab.report.replication_evidence, "
                    "e.g. of the sweep normlab advise writes); repeatable")
    a = ap.parse_args(argv)
    try:
        data = build_evidence(read_json(a.claims), read_json(a.replications), claims_name=a.claims.name,
                              replications_name=a.replications.name,
                              confirmations=tuple((read_json(p), p.name) for p in a.confirm),
                              more_replications=tuple((read_json(p), p.name) for p in a.more))
        why = evidence_problem(data)
        if why:  # never write what advise would refuse to read
            raise NormlabError(f"the evidence built is not readable by normlab advise: {why}")
        write_text(a.out, dumps(data, indent=1, sort_keys=True) + "\n")  # strict JSON: a non-finite number as null
    except (NormlabError, OSError) as e:  # a missing or unreadable input, an unwritable output: one line
        print(f"error: {printable(e)}", file=sys.stderr)
        return 2
    except (KeyError, TypeError, AttributeError, ValueError, IndexError, OverflowError) as e:  # not the results
        print(f"error: an input is not normlab claims / replications results (missing or malformed: {printable(e)})",
              file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
