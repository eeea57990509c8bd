"""The report's "Seeds until decided" section (a sweep run with a sequential plan: every look, its boundaries and
each comparison's statistic) and one "Replication on SOURCE" section per replication (each primary conclusion on
both data sources and the verdict). The looks, decisions and verdicts come from normlab.report.sequential; this
module only renders them."""

from __future__ import annotations

from typing import Any

from normlab.report.analysis import SweepReport
from normlab.report.document import Note, Section, Table
from normlab.report.sequential import replication_block, sequential_block

REPLICATION_NOTE = ("The same declared design on a second data source; each primary conclusion side by side. "
                    "Power: of the replication's paired t-test at Holm's first level (alpha / m) to detect the "
                    "original estimate, from the replication's own spread; below 0.8 an undecided replication "
                    "reads 'underpowered', not 'not replicated'.")  # Markdown only


def _est_text(e: dict[str, Any]) -> str:
    if e.get("diff") is None:
        return "–"
    return f"{e['diff']:+.3f}" + (f" ± {e['ci95']:.3f}" if e.get("ci95") is not None else "") + f" (n={e['n']})"


def sequential_cells(block: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """One row per look: seeds, information fraction, boundaries, and each comparison's z (✓: decided there)."""
    head = ["look", "seeds", "fraction", "boundary |z| (first Holm step)", "nominal p", "boundary (last step)",
            *[f"z {c['variant']}" for c in block["decisions"]]]
    rows = []
    for lk in block["looks"]:
        zs = [("–" if c["z"] is None else f"{c['z']:+.2f}") + (" ✓" if c["decided_at_look"] == lk["look"] else "")
              for c in lk["comparisons"]]
        rows.append([str(lk["look"]), str(lk["seeds"]), f"{lk['fraction']:.2f}", f"{lk['boundary_first']:.3f}",
                     f"{lk['nominal_p_first']:.2g}", f"{lk['boundary_last']:.3f}", *zs])
    return head, rows


def sequential_text(block: dict[str, Any]) -> str:
    """The plan, why it stopped, the seeds spent and each decision, as one paragraph."""
    p = block["plan"]
    why = {"decided": "every primary comparison was decided",
           "undecidable": "every primary comparison was decided or cannot be (a model did not learn: more seeds "
                          "cannot undo that)",
           "max_seeds": "the seed cap was reached",
           "budget": "the time budget could not fit another round", "interrupted": "it was interrupted",
           "failed": "a run failed"}.get(block["stopped"], block["stopped"])
    return (f"Seeds until decided on {p['primary']} vs {p['baseline']}: looks at {p['looks']} seeds, "
            f"{p['spending']} alpha spending at family-wise alpha = {p['alpha']:g} over {len(block['decisions'])} "
            f"comparison(s) ({p['multiplicity']}; the boundary applies to the paired t statistic's normal-quantile "
            f"transform, calibrated by simulating that statistic under the null). "
            f"Stopped after {len(block['looks'])} look(s), {block['seeds_spent']} seeds spent: {why}. "
            + "; ".join(f"{c['variant']}: {c['decision']}"
                        + (f" at look {c['decided_at_look']}" if c.get("decided_at_look") else "")
                        for c in block["decisions"]) + ".")


def replication_cells(rep: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """One row per primary comparison: estimate and decision on each source, the replication's power, the verdict."""
    head = ["comparison", "metric", "original", "decision", f"on {rep['source']}", "decision",
            "power (Holm's first level)", "verdict"]
    rows = [[f"{c['variant']} − {c['baseline']}", c["metric"], _est_text(c["original"]), c["original"]["decision"],
             _est_text(c["replication"]), c["replication"]["decision"],
             "–" if c.get("power") is None else f"{c['power']:.2f} at {c['power_level']:.3g}" + (
                 f" ({c['power_range'][0]:.2f}-{c['power_range'][1]:.2f} over the SD's 95% interval)"
                 if c.get("power_range") and None not in c["power_range"] else ""), c["verdict"]]
            for c in rep["comparisons"]]
    return head, rows


def sections(rep: SweepReport) -> list[Section]:
    out: list[Section] = []
    block = sequential_block(rep.sweep_dir)
    if block:
        out.append(Section("Seeds until decided", [Note(sequential_text(block)), Table(*sequential_cells(block))]))
    for r in replication_block(rep.sweep_dir):
        out.append(Section(f"Replication on {r['source']}",
                           [Note(REPLICATION_NOTE, only="md"), Table(*replication_cells(r))]))
    return out
