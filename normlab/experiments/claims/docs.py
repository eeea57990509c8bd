"""docs/claims.md from a claims report (``normlab claims --budget full``, ``--docs``, or ``--render CLAIMS_JSON``):
the verdict table with the raw 95% interval and the Holm-adjusted p beside it, the scale of each claim, the
pre-registered specifications (each claim's spec hash, which ``tests/experiments/claims/test_specs.py`` compares with
``specs.spec_hash``), the "Definitions revised" section (every ``Revision`` of every claim, from
normlab/evidence/revisions.yaml: date, what changed, why, the verdict before), and per claim its meaning, source,
deviations, per-seed values and details. Every number on the page comes from the report; the definitions hold none.
"""

from __future__ import annotations

import datetime
import re
from pathlib import Path
from typing import Any

from normlab.errors import NormlabError, printable
from normlab.experiments.claims.specs import CLAIMS, claim_seeds, grid_claim_names, spec_hash
from normlab.io import write_text
from normlab.markdown import md_code, md_fence
from normlab.rundir.readers import open_config


def _fmt(v: float | None) -> str:
    if v is None:
        return "n/a"
    a = abs(v)
    return f"{v:.2e}" if (a != 0 and (a < 1e-3 or a >= 1e4)) else f"{v:.4f}"


def measured_text(c: dict) -> str:
    if c["measured"] is None:
        return "n/a"
    if c.get("direction") == "exact":
        return f"{_fmt(c['measured'])} (max)"
    if c["ci"] is None:
        return f"{_fmt(c['measured'])} (n={c['n']})"
    half = (c["ci"][1] - c["ci"][0]) / 2
    return f"{_fmt(c['measured'])} ± {_fmt(half)}"


def claim_scale(c: dict, base: Path | str) -> str:
    """Model width, blocks, steps and training tokens of the runs behind claim ``c`` (one seed's run directories,
    relative to the claims directory ``base``, a grid variant's at every learning rate, read from their
    ``config.yaml``; tokens = steps x batch x grad_accum x context); ``n/a`` without runs. Measured once, when the
    claim is measured, and stored in its ``scale`` field: a rendered page reads the stored value, never the runs."""
    shapes: dict[tuple, None] = {}
    first = ((c.get("runs") or [{}])[0] or {}).values()  # variant -> run dir, or lr -> run dir for a grid variant
    for run_dir in [d for v in first for d in (v.values() if isinstance(v, dict) else [v])]:
        try:
            cfg = open_config(Path(base) / run_dir)
        except NormlabError:
            continue
        m, t = cfg.model, cfg.train
        tokens = t.steps * t.batch_size * t.grad_accum * m.context
        shapes[(m.width, m.depth, t.steps, tokens)] = None
    if not shapes:
        return "n/a"
    return "; ".join(f"width {w}, {d} blocks, {s} steps, {_count(tok)} tokens" for w, d, s, tok in shapes)


def _count(n: int) -> str:
    return f"{n / 1e6:.3g}M" if n >= 1e6 else f"{n / 1e3:.3g}k"


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


HASH_ROW = re.compile(r"^\| `([a-z0-9-]+)` \| `([0-9a-f]{12})` \|")
"""A row of the "Pre-registered specifications" table of docs/claims.md: claim name and its recorded spec hash."""


def recorded_hashes(text: str) -> dict[str, str]:
    """Claim name -> spec hash recorded in a docs/claims.md text (its "Pre-registered specifications" table)."""
    return {m.group(1): m.group(2) for m in map(HASH_ROW.match, text.splitlines()) if m}


def _p(x: float | None) -> str:
    return "–" if x is None else f"{x:.2g}"


def beside_text(c: dict) -> str:
    """The means over seeds of the details a claim shows beside its value (``Claim.beside``), e.g. the at-init
    value of a measure that compares the end of training with initialisation; "" when none."""
    parts = []
    for k in c.get("beside") or []:
        xs = [float(d[k]) for d in c.get("details") or [] if isinstance(d, dict) and isinstance(d.get(k), (int, float))]
        if xs:
            parts.append(f"{k} {_fmt(sum(xs) / len(xs))}")
    return f" (beside it, means: {'; '.join(parts)})" if parts else ""


def verdict_cell(c: dict) -> str:
    cell = f"**{c['verdict']}**"
    if c.get("raw_verdict") and c["raw_verdict"] != c["verdict"]:
        cell += f" (unadjusted: {c['raw_verdict']})"
    if not c.get("current_definition", True):
        cell += " ⚠ earlier definition"
    if c.get("exploratory"):
        cell += " ⚑ exploratory"
    return cell


def seed_span(seeds: list[int]) -> str:
    """``0-4`` for a contiguous block, else the seeds comma-separated."""
    seeds = sorted(seeds)
    if seeds and seeds == list(range(seeds[0], seeds[-1] + 1)) and len(seeds) > 1:
        return f"{seeds[0]}-{seeds[-1]}"
    return ", ".join(map(str, seeds))


def revisions_lines(claims: list) -> list[str]:
    """The "Definitions revised" section: every revision of every claim (``claims``: ``specs.Claim`` objects)."""
    out = ["## Definitions revised", "",
           "Every change of a claim's metric, recipe, test or margin after a verdict was published, with the "
           "verdict before it (from normlab/evidence/revisions.yaml; `normlab claims` prints them too). "
           "A definition chosen after seeing a verdict is a forking path: a revised claim judged on any seed its "
           "revision saw (*seeds seen*: the seeds of the results it was made after) has its verdict marked ⚑ "
           "*exploratory* in the table (runs that shaped a design cannot confirm it; `normlab advise` counts none "
           "of them as decided). Judged on seeds no revision saw, the same definition is confirmatory: "
           "`normlab claims --budget confirm` measures every revised claim on the fresh block 6000-6004 "
           "(docs/claims-confirm.md), and `normlab claims --budget followup` the claims whose verdicts differed "
           "between two such 5-seed blocks on 12 seeds of the fresh block 7000-7011 (docs/claims-followup.md).", ""]
    rows = [(c.name, r) for c in claims for r in c.revised]
    if not rows:
        return out + ["None.", ""]
    out += ["| claim | date | what changed | why | verdict before | seeds seen |", "|---|---|---|---|---|---|"]
    for name, r in sorted(rows, key=lambda x: (x[1].date, x[1].time, x[0])):
        cells = [f"`{name}`", f"{r.date} {r.time} UTC" if r.time else r.date, r.what, r.why, r.verdict_before,
                 seed_span(list(r.seeds_seen))]
        out.append("| " + " | ".join(x.replace("|", "\\|") for x in cells) + " |")
    return out + [""]


def spec_lines(claims: list, measured: dict[str, str | None] | None = None) -> list[str]:
    """The "Pre-registered specifications" section: per claim the spec hash its published result was measured under
    (``measured``: name -> the result's ``spec_hash``; "–" when it predates hashes), which
    ``tests/experiments/claims/test_specs.py`` compares with the current ``specs.spec_hash``, and the current hash
    beside it."""
    measured = measured if measured is not None else {c.name: spec_hash(c) for c in claims}
    out = ["## Pre-registered specifications", "",
           "Each claim's measure, margin, test, seeds and recipe are data in its definition "
           "(normlab/experiments/claims/defs/NAME.yaml); the hash covers all of them (and each variant's overrides "
           "with the full budget's fields), not the prose. The first hash is the one the result on this page was "
           "measured under; `tests/experiments/claims/test_specs.py` fails when a claim's current hash differs "
           "from it and "
           "normlab/evidence/revisions.yaml has no revision of the claim from it (`hash_before`): a definition "
           "cannot change silently. Re-rendering this page from stored results keeps the hashes those results "
           "were measured under.", "",
           "| claim | measured under | current spec hash | test | seeds | practical margin | revisions |",
           "|---|---|---|---|---|---|---|"]
    for c in claims:
        got = measured.get(c.name)
        out.append(f"| `{c.name}` | {f'`{got}`' if got else '–'} | `{spec_hash(c)}` | {c.test} | "
                   f"{c.seeds or 'budget'} | {'–' if c.practical_margin is None else f'{c.practical_margin:g}'} | "
                   f"{len(c.revised)} |")
    return out + [""]


def _first(load: Any) -> float:
    """The 1-minute figure of a stored load average (a list of three, or one number in older reports)."""
    return float(load[0] if isinstance(load, (list, tuple)) else load)


def confirmation_lines(report: dict, confirmation: dict, source: str) -> list[str]:
    """The "Confirmed on a fresh seed block" section of the main page: for every claim exploratory in ``report``
    (both judged reports) that ``confirmation`` measured, its verdict there beside the exploratory one; a claim the
    confirmation judges exploratory too (a revision saw those seeds) is listed as not confirmed."""
    conf = {c["name"]: c for c in confirmation["claims"]}
    rows = [(c, conf[c["name"]]) for c in report["claims"] if c.get("exploratory") and c["name"] in conf]
    if not rows:
        return []
    seeds = sorted({s for c in confirmation["claims"] for s in claim_seeds(confirmation, c)})
    rejudge = confirmation.get("budget") == "rejudge"
    title = "## Measured again under the decision layer" if rejudge else "## Confirmed on a fresh seed block"
    why = ("the claims whose verdict the decision layer's rules changed or could not judge from stored details "
           "(above, 'Re-judged under the decision layer')" if rejudge else "The claims marked ⚑ above")
    page = "docs/claims-rejudge.md" if rejudge else "docs/claims-confirm.md"
    out = [title, "",
           f"{why[0].upper() + why[1:]}, measured again by {md_code(str(confirmation.get('command')))} on seeds "
           f"{seed_span(seeds)}, which no revision saw, with the definitions of this page fixed before those runs "
           f"({md_code(source)}; {page}, its own page). These verdicts are confirmatory: Holm's "
           f"correction over that run's family of {confirmation.get('family_size', 'n/a')} tests (its claims with a "
           "test and the TOSTs of their practical margins). "
           "`normlab advise` reads them (normlab/evidence/claims.json), but for a claim a follow-up on a larger "
           "fresh block supersedes (below, where given).", "",
           *([str(confirmation["note"]), ""] if confirmation.get("note") else []),
           "| claim | exploratory (seeds " + seed_span(sorted({s for c, _ in rows for s in claim_seeds(report, c)}))
           + ") | confirmatory: measured (raw 95% CI) | Holm p | confirmatory verdict |",
           "|---|---|---|---|---|"]
    for c, k in rows:
        cells = [f"`{c['name']}`", f"{c['verdict']}, {measured_text(c)}", measured_text(k), _p(k.get("p_adj")),
                 verdict_cell(k) if not k.get("exploratory") else f"{verdict_cell(k)} (not confirmed)"]
        out.append("| " + " | ".join(x.replace("|", "\\|") for x in cells) + " |")
    return out + [""]


def own_block_lines(report: dict, doc: dict, source: str) -> list[str]:
    """The "Measured on their own seed block" section of the main page: the claims a run on a fresh block
    (``--confirmation``: a registered budget such as ``frontier``) measured that ``report`` does not hold (claims
    declared after the main run, before any run of their own), each with its verdict there; judged on that block
    alone, Holm's correction over that run's family. Their spec hashes go to the page's specifications table."""
    main = {c["name"] for c in report["claims"]}
    rows = [c for c in doc["claims"] if c["name"] not in main]
    if not rows:
        return []
    seeds = sorted({s for c in doc["claims"] for s in claim_seeds(doc, c)})
    page = f"docs/claims-{doc.get('budget')}.md"
    out = [f"## Measured on their own seed block ({doc.get('budget')})", "",
           f"Claims declared after the run above and before any run of their own, measured by "
           f"{md_code(str(doc.get('command')))} on seeds {seed_span(seeds)}, which no other question used "
           f"({md_code(source)}; {page}, its own page with every per-seed value). Their verdicts are confirmatory: "
           f"Holm's correction over that run's family of {doc.get('family_size', 'n/a')} tests (its claims with a "
           "test and the TOSTs of their practical margins); `normlab advise` reads them "
           "(normlab/evidence/claims.json).", "",
           "| claim | paper | expected | measured (raw 95% CI) | p | Holm p | verdict |",
           "|---|---|---|---|---|---|---|"]
    defined = {c.name: c for c in CLAIMS}
    for c in rows:
        d = defined.get(c["name"])
        cells = [f"{d.claim if d else c.get('claim', '')} (`{c['name']}`)", d.paper if d else str(c.get("paper", "")),
                 str(c.get("expected", "")), measured_text(c),
                 _p(c.get("p")), _p(c.get("p_adj")),
                 verdict_cell(c) if not c.get("exploratory") else f"{verdict_cell(c)} (exploratory)"]
        out.append("| " + " | ".join(x.replace("|", "\\|") for x in cells) + " |")
    return out + [""]


def followup_lines(report: dict, confirmation: dict, followup: dict, source: str) -> list[str]:
    """The "Followed up on a larger fresh block" section: for every claim exploratory in ``report`` that the
    follow-up ``followup`` measured (a run whose budget follows ``confirmation``'s; all three judged reports), the
    exploratory verdict, the confirmation's and the follow-up's, which supersedes it."""
    conf = {c["name"]: c for c in confirmation["claims"]}
    fol = {c["name"]: c for c in followup["claims"]}
    rows = [(c, conf.get(c["name"]), fol[c["name"]]) for c in report["claims"]
            if c.get("exploratory") and c["name"] in fol]
    if not rows:
        return []

    def span(rep: dict, cs: list[dict]) -> str:
        return seed_span(sorted({s for c in cs if c is not None for s in claim_seeds(rep, c)}))

    out = ["## Followed up on a larger fresh block", "",
           f"The claims whose confirmatory verdicts differed between two fresh 5-seed blocks, measured again by "
           f"{md_code(str(followup.get('command')))} on {followup.get('seeds')} seeds, "
           f"{span(followup, [f for _, _, f in rows])} ({md_code(source)}; docs/claims-followup.md, its own page). "
           f"Holm's correction is over that run's family of {followup.get('family_size', 'n/a')}. The follow-up "
           "decides alone, its seeds not pooled with the blocks that prompted it, and its verdict supersedes the "
           "confirmation's (which claims it runs, and that it supersedes, were chosen after both blocks were seen; "
           "its own block is independent of that choice: normlab.experiments.claims.budgets); `normlab advise` "
           "reads it."
           + (" A claim whose verdict says *not confirmed* was revised after results on some of these seeds "
              "(Definitions revised): that verdict is exploratory, and advise reads no confirmatory one for it."
              if any(f.get("exploratory") for _, _, f in rows) else ""), "",
           *([str(followup["note"]), ""] if followup.get("note") else []),
           f"| claim | exploratory (seeds {span(report, [c for c, _, _ in rows])}) | confirmation (seeds "
           f"{span(confirmation, [k for _, k, _ in rows])}) | follow-up: measured (raw 95% CI) | Holm p | "
           "follow-up verdict |",
           "|---|---|---|---|---|---|"]
    for c, k, f in rows:
        cells = [f"`{c['name']}`", f"{c['verdict']}, {measured_text(c)}",
                 (f"{k['verdict']}{' (exploratory: revised after these seeds)' if k.get('exploratory') else ''}, "
                  f"{measured_text(k)}") if k is not None else "not measured", measured_text(f),
                 _p(f.get("p_adj")),
                 verdict_cell(f) if not f.get("exploratory") else f"{verdict_cell(f)} (not confirmed)"]
        out.append("| " + " | ".join(x.replace("|", "\\|") for x in cells) + " |")
    return out + [""]


def rejudged_lines(reports: list[tuple[dict, str]]) -> list[str]:
    """The stored verdicts that the decision layer's rules change (old, new, why), per stored results file: each
    row is a claim whose stored ``verdict_stored`` differs from its verdict now (``judge`` of a rendered report)."""
    rows = []
    for rep, name in reports:
        for c in rep["claims"]:
            if c.get("verdict_stored") is None:
                continue
            why = c["reason"] + (f" (values re-measured: {c['remeasured']})" if c.get("remeasured") else "")
            cells = [f"`{c['name']}`", md_code(name), seed_span(list(c.get("seeds") or [])), c["verdict_stored"],
                     f"**{c['verdict']}**", why]
            rows.append("| " + " | ".join(x.replace("|", "\\|") for x in cells) + " |")
    if not rows:
        return []
    return ["## Re-judged under the decision layer", "",
            "Every stored result on this page judged again by the one decision layer (normlab.decide): one "
            "did-not-learn guard on every claim (every model it trains, not only those a definition listed), state "
            "claims tested on their change from initialisation, the TOST of every practical margin inside the "
            "family's Holm adjustment, and LR sensitivity with a collapsed run scored like a diverged one (stored "
            "per-learning-rate losses recomputed). The verdicts that changed, with the stored one and why "
            "(normlab/evidence/revisions.yaml lists each rule change with the verdict before it):", "",
            "| claim | results | seeds | stored verdict | verdict now | why |", "|---|---|---|---|---|---|",
            *rows, ""]


def write_docs(report: dict, path: Path, confirmations: tuple[tuple[dict, str], ...] = ()) -> None:
    """The claims page for the judged ``report``; with judged ``confirmations`` (report, file name: runs of its
    exploratory claims on fresh seed blocks, ``--confirmation``), their sections after the table: a plain
    confirmation's, then a follow-up's (a run whose budget ``follows`` the confirmation's) beside it."""
    GRID_CLAIMS = grid_claim_names()

    meaning = {c.name: c.meaning for c in CLAIMS}
    provenance = {c.name: ([f"Source: {c.source}."] if c.source else [])
                  + ([f"Deviations: {c.deviations}"] if c.deviations else []) for c in CLAIMS}
    b = report["budget_spec"]
    m = report["machine"]
    date = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    rendered = report.get("rendered_from")
    seeds = sorted({s for c in report["claims"] for s in claim_seeds(report, c)})
    lines = [
        "# Published claims re-measured at CPU scale",
        "",
        f"Budget **{report['budget']}**, {report['seeds']} seeds, written {date} by",
        "",
        *md_fence(str(report.get("render_command") or report["command"])),  # user paths: a fence they cannot close
        "",
        *([f"> Rendered from the stored results of this run ({rendered}, measured by "
           f"{md_code(str(report['command']))}): every claim was measured under its current definition.", ""]
          if rendered and all(c.get("current_definition", True) for c in report["claims"]) else []),
        *([f"> Re-rendered from stored results ({rendered}), measured by {md_code(str(report['command']))}: "
           "the verdicts are "
           "those of the current rules (the decision layer: one guard, state claims on their change from "
           "initialisation, Holm over one family with every TOST in it, observability, collapse rates) "
           "applied to the stored per-seed values. Claims marked ⚠ *earlier definition* were measured under a "
           "definition revised since (see Definitions revised); their row is the old measurement judged under "
           "the new rules, or, where the stored details allow, recomputed as the note in their section says. "
           "A from-scratch `normlab claims --budget full` run replaces this page.", ""]
          if rendered and not all(c.get("current_definition", True) for c in report["claims"]) else []),
        *([f"> These are **{report['budget']}-budget** results, not the full budget: `normlab claims --budget full` "
           "had not finished when this file was written. Re-run it (complete runs are reused) to replace this file.",
           ""] if report["budget"] in ("tiny", "quick") else []),
        *([f"> A confirmation run: the full budget's runs and measurements on the seed block {seed_span(seeds)}, "
           "which no revision saw, for the claims whose definition was revised after a verdict on seeds 0-4 "
           "(docs/claims.md marks those verdicts ⚑ exploratory). Declared before these runs "
           "(`normlab.experiments.claims.budgets.CONFIRM_CLAIMS`: every revised claim, whatever its verdict); "
           "Holm's correction is over this run's family. A claim still marked ⚑ here was revised after results on "
           "these seeds too.", ""] if report["budget"] == "confirm" else []),
        *([f"> A follow-up run: the full budget's runs and measurements on {report['seeds']} seeds of the fresh block "
           f"{seed_span(seeds)}, for the claims whose confirmatory verdicts differed between the two 5-seed blocks "
           "that measured the revised claims (1000-1004 and 6000-6004; docs/claims-confirm.md). Declared before "
           "these runs (`normlab.experiments.claims.budgets.FOLLOWUP_CLAIMS`); judged on this block alone, with "
           "Holm's correction over this run's family; for these claims its verdicts supersede the confirmation's "
           "(docs/claims.md).", ""] if report["budget"] == "followup" else []),
        *([f"> A re-measurement under the decision layer: the full budget's runs and measurements on the fresh seed "
           f"block {seed_span(seeds)}, for the claims whose verdict the decision layer's rules (normlab.decide: one "
           "guard, state claims on their change from initialisation, TOST inside the family, LR sensitivity with "
           "collapsed runs at L_init) changed on a stored result or could not judge from stored details. Declared "
           "before these runs (`normlab.experiments.claims.budgets.REJUDGE_CLAIMS`); judged on this block alone, "
           "with Holm's correction over this run's family; docs/claims.md shows these verdicts beside the stored "
           "ones.", ""] if report["budget"] == "rejudge" else []),
        f"Machine: {m['platform']}, {m['cpu_count']} cores, Python {m['python']}, torch {m['torch']}; load average "
        f"at the end {m['loadavg_at_end']}"
        + (" (the machine was shared with other jobs). " if _first(m["loadavg_at_end"]) > m["cpu_count"] else ". ")
        + f"Wall time {report['elapsed_s'] / 60:.1f} "
        f"min ({report['trained_runs']} runs trained, {report['reused_runs']} reused).",
        "",
        *([report["note"], ""] if report.get("note") else []),
        f"Setup: corpus {md_code(b['source'])} (bytes tokenizer), context {b['context']}, width {b['width']}, "
        f"{b['heads']} heads; "
        f"shallow models {b['depth']} blocks, depth studies {b['deep_depth']} blocks; {b['steps']} steps of batch "
        f"{b['batch_size']}, peak LR {b['lr']}, warm-up {b['warmup_steps']} steps (except where a claim says), AdamW. "
        f"One run per variant and seed (seeds {seed_span(seeds)} drive init and data order); runs are shared "
        "between claims.",
        "",
        *([f"Learning-rate sweep claims (Wortsman et al. 2023, arXiv:2309.14322): every grid variant is trained at "
           f"each peak LR in {', '.join(f'{x:g}' for x in b['grid_lrs'])}, {b['grid_depth']} blocks, {b['grid_steps']} "
           f"steps, warm-up {b['grid_warmup']} steps (except where a claim says); LR sensitivity = mean over the "
           "grid of min(L, L_init) - L* in bits/byte (a run that diverged or collapsed scores its loss at "
           "initialisation).", ""]
          if "grid_lrs" in b and any(c["name"] in GRID_CLAIMS for c in report["claims"]) else []),
        "Measured = mean over seeds ± half-width of the raw (unadjusted) 95% Student-t interval. p = two-sided "
        "one-sample t-test of the per-seed values against the no-effect value (equivalence claims: against the "
        "ends of the margin); **Holm p** = p adjusted with Holm's step-down over one family of "
        f"{report.get('family_size', 'n/a')} tests: every claim with a significance test and the TOST of every "
        "practical margin (normlab.stats.holm; one whose test cannot be computed counts as p = 1). Verdicts use "
        "the adjusted p: **held** when it is below 0.05 with the mean on the claimed side, **not held** on the "
        "other side, **inconclusive** otherwise; **within margin** when an equivalence test (TOST) shows the effect "
        "inside the claim's stated practical margin: its Holm-adjusted TOST p is below 0.05 (a mean inside the margin "
        "with a wider interval is not enough); "
        "**not decided: did not learn** when a model the claim trains did not learn or diverged in some seed (its "
        "final loss not below the unigram bits/byte minus 0.1, normlab.stats.learning; every model is checked, "
        "normlab.decide.guard), which then counts as p = 1 in the family; **present at initialisation** when a state "
        "claim (tested on its per-seed change from the run's own initialisation) has its end value on the claimed "
        "side but training did not move it there; **not observable at this scale** when the phenomenon the claim "
        "explains does not appear here (the claim's observability rule); none of these is 'not held'. "
        "Exactness claims: every seed within the tolerance (no test). Split outcomes "
        "(collapse): the collapse rate per model with its exact Clopper-Pearson interval, and the test of the loss "
        "given no collapse, which cannot make the claim 'not held' where the claimed model collapsed more often "
        "(inconclusive: the seeds that trained do not refute its failure half); a run collapsed when it diverged or "
        "ended at or above the unigram bits/byte minus 0.1 "
        "(normlab.stats.learning: the did-not-learn rule of the report, one threshold everywhere). The verdict "
        "without the correction is shown beside when it differs. A claim that does not "
        "hold at this scale is a finding about small models, not a refutation of the paper.",
        "",
        "Scale: the width, blocks, steps and training tokens of the runs behind each claim (from their "
        "config.yaml; tokens = steps x batch x context).",
        "",
        "| # | claim | paper | metric | scale | expected | measured (raw 95% CI) | p | Holm p | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    defined = {c.name: c for c in CLAIMS}  # prose (the claim's text, its paper) from the current definition
    for i, c in enumerate(report["claims"], 1):
        scale = c.get("scale") or claim_scale(c, report.get("out") or ".")  # older reports stored no scale
        d = defined.get(c["name"])
        cells = [str(i), f"{d.claim if d else c['claim']} (`{c['name']}`)", d.paper if d else c["paper"], c["metric"],
                 scale, c["expected"], measured_text(c) + beside_text(c), _p(c.get("p")), _p(c.get("p_adj")),
                 verdict_cell(c)]
        lines.append("| " + " | ".join(x.replace("|", "\\|") for x in cells) + " |")
    lines += ["", "Caveats: these are tiny byte-level models trained for a few hundred steps (validation bits/byte "
              "of roughly 3-4, far from converged; validation = a fixed sample of windows spread over the split), "
              "so every verdict is about this scale and budget; 95% intervals over "
              f"{report['seeds']} seeds are wide, and a claim can flip with more steps. Each claim follows its "
              "paper's recipe where the scale allows; each section below names its source and its deviations. The "
              "per-seed details show the underlying numbers (e.g. both bits/byte values, both slopes).", ""]
    lines += rejudged_lines([(report, str(report.get("rendered_from") or "this run")), *(
        (r, n) for r, n in confirmations)])
    plain = [(r, n) for r, n in confirmations if not (r.get("budget_spec") or {}).get("follows")]
    for conf, name in plain:
        lines += confirmation_lines(report, conf, name)
        lines += own_block_lines(report, conf, name)
    for fol, name in confirmations:
        follows = (fol.get("budget_spec") or {}).get("follows")
        base = next((r for r, _ in plain if r.get("budget") == follows), None)
        if follows and base is not None:
            lines += followup_lines(report, base, fol, name)
    own = [c for r, _ in plain for c in r["claims"] if c["name"] not in {x["name"] for x in report["claims"]}]
    shown = {c["name"] for c in (*report["claims"], *own)}   # a claim added since these results is not listed yet
    listed = [c for c in CLAIMS if c.name in shown]
    lines += revisions_lines(listed) + spec_lines(listed, {c["name"]: c.get("spec_hash")
                                                           for c in (*report["claims"], *own)})
    lines += ["## What each metric means, and the per-seed values", ""]
    for c in report["claims"]:
        vals = ", ".join(_fmt(v) for v in c["values"]) if c["values"] else "none"
        ci = f"[{_fmt(c['ci'][0])}, {_fmt(c['ci'][1])}]" if c["ci"] else "n/a"
        lines += [f"### `{c['name']}` — {c['verdict']}", "", meaning.get(c["name"], ""), "",
                  *(sum(([x, ""] for x in provenance.get(c["name"], [])), [])),
                  *([f"Note: {c['note']}", ""] if c.get("note") else []),
                  f"Per-seed values: {vals}; raw 95% CI {ci}; p {_p(c.get('p'))}, Holm p {_p(c.get('p_adj'))}; "
                  f"{c['reason']}.", ""]
        if c.get("collapse"):
            lines += ["Collapse per condition (collapsed seeds k/n, exact Clopper-Pearson 95% interval; mean final "
                      "bits/byte of the seeds that did not collapse): " + "; ".join(
                          f"`{v}` {r['k']}/{r['n']} [{r['ci'][0]:.2f}, {r['ci'][1]:.2f}], "
                          f"{_fmt(r.get('loss_no_collapse'))}" for v, r in c["collapse"].items()) + ".", ""]
        if c.get("observable"):
            oc = c.get("observable_ci")
            lines += [f"Observability ({c['observable']}, 95% CI): "
                      f"{'n/a' if not oc else f'[{_fmt(oc[0])}, {_fmt(oc[1])}]'}.", ""]
        details = [_flat(d) for d in c.get("details") or []]
        keys = sorted({k for d in details for k, v in d.items() if isinstance(v, (int, float))})
        if keys:
            lines.append("Per-seed details: " + "; ".join(
                f"{k} = " + ", ".join(_fmt(d.get(k)) if isinstance(d.get(k), (int, float)) else "n/a"
                                     for d in details) for k in keys) + ".")
            lines.append("")
    lines += [f"Raw results: {md_code(str(report['out']) + '/claims.json')} (per-seed values, details and run "
              "directories).", ""]
    missing = [c.name for c in CLAIMS if c.name not in shown]
    if missing:  # a run of part of the suite (--only, or a report stored before those claims existed)
        lines += [f"Claims not in this run: {', '.join(md_code(n) for n in missing)} (`normlab claims --only NAME` "
                  "measures them; complete runs are reused).", ""]
    # a stored name, metric or reason cannot drive a terminal that prints the page: control characters as escapes
    write_text(path, "\n".join(printable(x) for x in "\n".join(lines).split("\n")))


def unrevised_changes(claims: list, recorded: dict[str, str]) -> list[str]:
    """One line per claim whose spec hash differs from the hash ``recorded`` for it (docs/claims.md) without a
    ``Revision`` from that hash (``hash_before``): a definition changed silently. Claims not recorded yet (new
    ones) are not changes; recorded names that are no claim are reported too."""
    out = []
    names = {c.name for c in claims}
    for c in claims:
        old = recorded.get(c.name)
        if old is None or old == spec_hash(c):
            continue
        if not any(r.hash_before == old for r in c.revised):
            out.append(f"{c.name}: spec hash {spec_hash(c)} differs from the recorded {old} and no revised: entry "
                       f"has hash_before {old}; add a Revision (date, what changed, why, verdict before, "
                       f"hash_before='{old}')")
    out += [f"{n}: recorded in docs/claims.md but no such claim" for n in sorted(set(recorded) - names)]
    return out
