"""Rebuild a claims.json from a published docs/claims.md (its table, per-seed values and per-seed details, printed
to 4 significant digits), so ``normlab claims --render`` can judge stored results under the current rules without
the run directories. Used once for docs/claims-full-2026-11-24.json:

    git show 4262037:docs/claims.md > /tmp/page.md
    PYTHONPATH=. python scripts/claims_page_to_json.py /tmp/page.md docs/claims-full-2026-11-24.json
    normlab claims --render docs/claims-full-2026-11-24.json --docs

Claims whose measurement is unchanged since that run keep their values (their spec hash is today's: a practical
margin or the Holm family is a rule applied now). Two are recomputed from the stored per-seed details as the
current measurement computes them: the learning-rate sensitivity claims' collapse flags per learning rate (from
the stored final bits/byte), ``peri-variance`` (slope_end - slope_init of each model, from the stored
slopes) and ``postln-warmup`` (collapse: diverged or within 0.5 bits/byte of the unigram bits/byte of the training
split, from the stored final bits/byte). ``dyt-vs-ln`` cannot be (its grid runs were never trained): its entry is
the earlier measurement, without a spec hash, so the page marks it as measured under an earlier definition.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from normlab.config import config_from_dict
from normlab.experiments.claims.budgets import BUDGETS
from normlab.experiments.claims.execution import spec_fields
from normlab.experiments.claims.measures import Context, unigram_bpb
from normlab.experiments.claims.specs import CLAIMS
from normlab.experiments.claims.variants import variant_config
from normlab.io import write_json


def num(s: str) -> float | None:
    s = s.strip()
    return None if s == "n/a" else float(s)


def parse(text: str) -> dict:
    lines = text.splitlines()
    head = re.search(r"Budget \*\*(\w+)\*\*, (\d+) seeds, written (.+?) by", text)
    command = next(ln.strip() for ln in lines if ln.startswith("    normlab claims"))
    mach = re.search(r"Machine: (.+?), (\d+) cores, Python (\S+), torch (\S+); load average at the end \[(.+?)\]", text)
    wall = re.search(r"Wall time ([\d.]+) min \((\d+) runs trained, (\d+) reused\)", text)
    rows = {}
    for ln in lines:
        m = re.match(r"\| \d+ \| .*\(`([a-z0-9-]+)`\) \| (.*)$", ln)
        if m:
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", m.group(2))]
            rows[m.group(1)] = {"scale": cells[2]}
    claims = {}
    for block in re.split(r"^### `", text, flags=re.MULTILINE)[1:]:
        name = block.split("`", 1)[0]
        vals = re.search(r"^Per-seed values: (.+?); 95% CI", block, re.MULTILINE)
        det = re.search(r"^Per-seed details: (.+)\.$", block, re.MULTILINE)
        values = [num(x) for x in vals.group(1).split(", ")] if vals and vals.group(1) != "none" else []
        details = [{} for _ in values]
        if det:
            for part in det.group(1).split("; "):
                key, xs = part.split(" = ", 1)
                for d, x in zip(details, xs.split(", ")):
                    d[key] = num(x)
        claims[name] = (values, details)
    return {"budget": head.group(1), "seeds": int(head.group(2)), "written": head.group(3), "command": command,
            "machine": {"platform": mach.group(1), "cpu_count": int(mach.group(2)), "python": mach.group(3),
                        "torch": mach.group(4), "loadavg_at_end": [float(x) for x in mach.group(5).split(", ")]},
            "elapsed_s": float(wall.group(1)) * 60, "trained_runs": int(wall.group(2)),
            "reused_runs": int(wall.group(3)), "rows": rows, "claims": claims}


def main(src: str, dest: str) -> None:
    page = parse(Path(src).read_text())
    budget = BUDGETS[page["budget"]]
    out = []
    for c in CLAIMS:
        if c.name not in page["claims"]:
            continue
        values, details = page["claims"][c.name]
        entry = {"name": c.name, "claim": c.claim, "paper": c.paper, "metric": c.metric, "expected": c.expected,
                 "direction": c.direction, "null": c.null, "margin": c.margin, "tolerance": c.tolerance,
                 "seeds": list(range(len(values))), "runs": [], "scale": page["rows"][c.name]["scale"],
                 **spec_fields(c)}
        if c.name == "peri-variance":
            for d in details:
                d["growth_last_block_diff"] = d["growth_pre"] - d["growth_peri"]
                d["pre_slope_change"] = d["slope_end_pre"] - d["slope_init_pre"]
                d["peri_slope_change"] = d["slope_end_peri"] - d["slope_init_peri"]
            values = [d["pre_slope_change"] - d["peri_slope_change"] for d in details]
            entry["note"] = ("recomputed from the stored per-seed slopes (4 digits) of the 2026-11-24 run: value = "
                             "(slope_end - slope_init) of Pre-LN minus that of Peri-LN; growth_last_block_diff is "
                             "the earlier metric's value.")
        elif c.name == "postln-warmup":
            a, b, within = c.args
            level = unigram_bpb(Context(budget), config_from_dict(variant_config(a, budget, 0)))
            new_vals = []
            for d in details:
                d[f"bpb_{a}"], d[f"bpb_{b}"] = d.pop(f"bpb_{a}"), d.pop(f"bpb_{b}")
                d["unigram_bpb"], d["collapse_above_bpb"] = level, level - within
                for v in (a, b):
                    d[f"collapsed_{v}"] = int(d[f"bpb_{v}"] >= level - within)
                new_vals.append(None if d[f"collapsed_{a}"] or d[f"collapsed_{b}"] else d[f"bpb_{a}"] - d[f"bpb_{b}"])
            values = new_vals
            entry["note"] = (f"recomputed from the stored final bits/byte of the 2026-11-24 run: a run collapsed when "
                             f"its final bits/byte is at least {level - within:.4f} (the unigram bits/byte of the "
                             f"training split, {level:.4f}, less {within}); none of these runs diverged.")
        elif c.measure == "sens_diff":
            from normlab.experiments.claims.measures_lr import COLLAPSE_WITHIN

            level = unigram_bpb(Context(budget), config_from_dict(variant_config(c.args[0], budget, 0, budget.lr)))
            for d in details:
                d["unigram_bpb"] = level
                for v in c.args:
                    for lr in budget.grid_lrs:
                        x = d.get(f"bpb_{v}.{lr:g}")
                        d[f"bpb_{v}@{lr:g}"] = x
                        d[f"collapsed_{v}@{lr:g}"] = int(x is None or x >= level - COLLAPSE_WITHIN)
            entry["note"] = (f"the collapse flags per learning rate were added from the stored final bits/byte (a run "
                             f"collapsed when it diverged or ended at {level - COLLAPSE_WITHIN:.4f} bits/byte or "
                             "more, the unigram level less 0.5), as the current measurement records them.")
        elif c.name == "dyt-vs-ln":
            entry["spec_hash"] = None
            entry["note"] = ("the stored measurement is the earlier definition (both models at lr 3e-3, not each at "
                             "its best of the grid); the grid runs were not trained, so this row is that measurement "
                             "judged under the current rules. It will change with the full run.")
        xs = [v for v in values if v is not None]
        from normlab.experiments.claims.stats import verdict

        v = verdict(values, c.direction, null=c.null, margin=c.margin, tolerance=c.tolerance)
        entry.update(values=values, details=details, measured=v["measured"], ci=v["ci"], n=len(xs),
                     verdict=v["verdict"], reason=v["reason"])
        out.append(entry)
    report = {"format": "normlab-claims-v1", "budget": page["budget"], "budget_spec": budget.to_dict(),
              "seeds": page["seeds"], "out": "runs/claims-full", "command": page["command"],
              "machine": page["machine"], "elapsed_s": page["elapsed_s"], "trained_runs": page["trained_runs"],
              "reused_runs": page["reused_runs"], "retrained": {}, "claims": out,
              "note": (f"Stored results of the from-scratch full run written {page['written']} (240 runs trained, "
                       "24 claims, 5 seeds; the page of that run is in git: `git show 4262037:docs/claims.md`), "
                       "rebuilt from that page's per-seed values and details (4 significant digits) by "
                       "scripts/claims_page_to_json.py into docs/claims-full-2026-11-24.json.")}
    write_json(Path(dest), report)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
