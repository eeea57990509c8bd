"""The replications ``normlab advise`` reads (``docs/replications-*.json``, format ``normlab-replications-v1``),
generated from a sweep directory that declared a primary family, and from its replications on other corpora where
it has them (``normlab compare ... --replicate-on SOURCE``): per declared comparison that bears on a claim
(``CLAIMS``), the decision on the sweep's own corpus and on each replication's, from the same code the report's
"Replication" section uses (``normlab.report.sequential.decisions_of`` and ``replication_block``: paired t over
seeds, Holm over the family, the replication's power at Holm's first level from its own spread), and the shape of
the compared runs (``shape``: width, depth, heads, context, steps, training tokens; ``scale``: the claims pages'
text of it). For the demo, and for the sweep ``normlab advise`` writes for its next question::

    python -m normlab.demo                  # or: normlab compare --preset quick --replicate-on english
    python -m normlab.report.replication_evidence runs/demo-quick-XXXXXXXX docs/replications-2026-11-26.json \\
        --command "normlab compare --preset quick"
    normlab advise && normlab compare advise-sweep.yaml --out runs/advise
    python -m normlab.report.replication_evidence runs/advise docs/replications-advise-DATE.json \\
        --command "normlab compare advise-sweep.yaml"

Torch-free.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from normlab.decide.vocab import DECIDED, HIGHER, LOWER
from normlab.errors import NormlabError, printable
from normlab.io import dumps, write_text
from normlab.report.analysis import load
from normlab.report.sequential import decisions_of, per_seed_differences, replication_block

FORMAT = "normlab-replications-v1"
CLAIMS: dict[tuple[str, str], tuple[str, str]] = {
    ("Peri-LN", "lr_sensitivity"): ("peri-lr-sensitivity", LOWER),
    ("Pre-LN + QK-norm", "lr_sensitivity"): ("qk-lr-sensitivity", LOWER),
    ("Post-LN", "lr_sensitivity"): ("postln-lr-sensitivity", HIGHER),
}
"""``(variant, primary metric)`` against Pre-LN -> ``(claim, the reading on the claim's side)`` (docs/claims.md:
Peri-LN and QK-norm lower Pre-LN's learning-rate sensitivity, Post-LN raises it)."""


def _entry(claim: str, side: str, c: dict[str, Any], corpus: str, command: str,
           shapes: dict[str, list[dict[str, int]]]) -> dict[str, Any]:
    seeds = sorted(int(s) for s in c["per_seed"])
    reading = c["decision"]
    shape = list({json.dumps(x, sort_keys=True): x for v in (c["baseline"], c["variant"])
                  for x in shapes.get(v, [])}.values())
    return {"claim": claim, "corpus": corpus, "seeds": seeds, "contrast": f"{c['variant']} - {c['baseline']}",
            "estimate": c["diff"], "half_width": c["ci95"], "p_adj": c.get("p_holm"), "reading": reading,
            "claim_side": None if reading not in DECIDED else reading == side, "command": command,
            **({"scale": scale_text(shape), "shape": shape} if shape else {})}


def scale_text(shapes: list[dict[str, int]]) -> str:
    """``"width 128, 4 blocks, 600 steps, 1.23M tokens"`` per shape (``; ``-joined), the claims pages' form (tokens =
    steps x batch x grad_accum x context)."""
    def count(n: int) -> str:
        return f"{n / 1e6:.3g}M" if n >= 1e6 else f"{n / 1e3:.3g}k"
    return "; ".join(f"width {s['width']}, {s['depth']} blocks, {s['steps']} steps, {count(s['tokens'])} tokens"
                     for s in shapes)


def _shapes(sweep_dir: Path) -> dict[str, list[dict[str, int]]]:
    """Per variant, the distinct model and training shapes of its stored runs (width, depth, heads, context, steps,
    training tokens), read from the configs the store recorded."""
    seen: dict[str, dict[str, dict[str, int]]] = {}
    for v in load(sweep_dir).variants:  # a learning-rate grid's cells: its variant is the run's ``variant`` axis
        for r in v.runs:
            cfg = r.row.get("config") or {}
            m, t = cfg.get("model") or {}, cfg.get("train") or {}
            try:
                x = {k: int(m[k]) for k in ("width", "depth", "heads", "context")} | {"steps": int(t["steps"])}
                x["tokens"] = x["steps"] * int(t["batch_size"]) * int(t.get("grad_accum", 1)) * x["context"]
            except (KeyError, TypeError, ValueError):
                continue
            name = (r.row.get("axes") or {}).get("variant") or v.name
            seen.setdefault(name, {})[json.dumps(x, sort_keys=True)] = x
    return {name: list(xs.values()) for name, xs in seen.items()}


def _corpus(sweep_dir: Path) -> str:
    rep = load(sweep_dir)
    sources = {(r.row.get("config") or {}).get("data", {}).get("source") for v in rep.variants for r in v.runs}
    if len(sources) != 1 or None in sources:
        raise NormlabError(f"{sweep_dir}: its runs do not share one data.source ({sorted(map(str, sources))})")
    return sources.pop()


def build_replications(sweep_dir: Path, command: str) -> dict[str, Any]:
    """The replications document of ``sweep_dir`` (module docstring); ``command``: the command that ran it."""
    if not (sweep_dir / "results.sqlite").is_file():
        raise NormlabError(f"{sweep_dir}: not a sweep directory (no results.sqlite)")
    _, orig = decisions_of(sweep_dir)
    blocks = replication_block(sweep_dir)
    per_seed = ({c["variant"]: c["original"]["per_seed"] for c in blocks[0]["comparisons"]} if blocks else
                per_seed_differences(sweep_dir))
    corpus, shapes, out = _corpus(sweep_dir), _shapes(sweep_dir), []
    for c in orig:
        key = (c["variant"], c["metric"])
        if c["baseline"] != "Pre-LN" or key not in CLAIMS:
            continue
        claim, side = CLAIMS[key]
        out.append(_entry(claim, side, {**c, "per_seed": per_seed.get(c["variant"], {})}, corpus, command, shapes))
    if not out:
        raise NormlabError(f"{sweep_dir}: no declared comparison against Pre-LN bears on a claim "
                           f"({', '.join(f'{v} on {m}' for v, m in CLAIMS)})")
    for rep in blocks:
        _, rdec = decisions_of(sweep_dir / rep["dir"])
        p_holm = {d["variant"]: d.get("p_holm") for d in rdec}
        for c in rep["comparisons"]:
            key = (c["variant"], c["metric"])
            if c["baseline"] != "Pre-LN" or key not in CLAIMS:
                continue
            claim, side = CLAIMS[key]
            r = {**c["replication"], "variant": c["variant"], "baseline": c["baseline"],
                 "p_holm": p_holm.get(c["variant"])}
            out.append(_entry(claim, side, r, rep["source"], f"{command} --replicate-on {rep['source']}", shapes)
                       | {"power": c["power"]})
    out.sort(key=lambda e: (list(dict.fromkeys(v for v, _ in CLAIMS.values())).index(e["claim"]), e["corpus"] !=
                            corpus))
    head = (f"generated by `python -m normlab.report.replication_evidence RUN_DIR OUT --command \"{command}\"` "
            f"from the sweep directory `{sweep_dir.name}` (not stored in the repository; ")
    return {"format": FORMAT,
            "source": head + (f"`{command} --replicate-on SOURCE` reproduces it) and its replications: the report's "
                              "declared decisions (paired t over seeds, Holm over the family) on each corpus; power: "
                              "the replication's power at Holm's first level from its own spread" if blocks else
                              f"`{command}` reproduces it): the report's declared decisions (paired t over seeds, Holm "
                              "over the family); no replication on another corpus"),
            "replications": out}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m normlab.report.replication_evidence")
    ap.add_argument("sweep_dir", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--command", required=True, help="the command that ran the sweep, recorded in each entry")
    a = ap.parse_args(argv)
    try:
        doc = build_replications(a.sweep_dir, a.command)
        write_text(a.out, dumps(doc, indent=2) + "\n")  # strict JSON (non-finite as null), temp file then rename
    except NormlabError as e:
        print(f"error: {printable(e)}", file=sys.stderr)
        return 2
    except OSError as e:  # an output path that is a directory or under a file
        print(f"error: {printable(a.out)}: {printable(e.strerror or e)}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
