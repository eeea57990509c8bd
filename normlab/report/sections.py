"""The report's sections on the variants' outcomes: summary, one run's summary, validation curves, diagnostics,
length extrapolation and calibration. Each builder takes the sweep's analysis and returns its sections (none when
the data is absent); normlab.report.render lists them in report order."""

from __future__ import annotations

import json
from statistics import mean
from typing import Any

from normlab.report import plots
from normlab.report.analysis import SweepReport, diagnostics as diagnostics_of
from normlab.report.document import Break, Bullets, Fields, Figure, Html, Panels, Section, Table

DIAG_NOTE = ("<div class='note'>Means over seeds; from each run's diagnostics.json (normlab diagnose) and "
             "training-time diag/ metrics.</div>")  # HTML only


def summary(rep: SweepReport) -> list[Section]:
    """The sentences stating what the numbers show (normlab.report.analysis)."""
    return [Section("Summary", [Bullets(rep.summary)])]


def _run_items(run: Any) -> list[tuple[str, str]]:
    """summary.json of one run as (key, text) pairs (numbers rounded; nested values as compact JSON)."""
    out = []
    for k, v in (run.summary or {}).items():
        if isinstance(v, float):
            out.append((k, f"{v:.6g}"))
        elif isinstance(v, (dict, list)):
            out.append((k, json.dumps(v, default=str)[:300]))
        else:
            out.append((k, str(v)))
    return out


def run(rep: SweepReport) -> list[Section]:
    """A report of one run: its curves and summary.json."""
    if len(rep.runs) != 1:
        return []
    single = rep.runs[0]
    png = plots.run_curves_png(single)
    return [Section("Run", [Figure("report_run.png", "Training and validation curves, every logged step", png),
                            Fields(_run_items(single))])]


def curves(rep: SweepReport) -> list[Section]:
    png = plots.curves_png(rep, plots.variant_colors(rep))
    return [Section("Validation curves", [Figure("report_curves.png", "Validation and training curves", png)])
            ] if png else []


def diagnostics(rep: SweepReport) -> list[Section]:
    """One panel per diagnostic category, then the per-variant table of scalar diagnostics."""
    found, table = diagnostics_of(rep)
    if not (found or table):
        return []
    cmap = plots.variant_colors(rep)
    panels = [(s.title, Figure(f"report_diag_{s.category}.png", s.title, plots.diag_png(s, cmap))) for s in found]
    blocks: list[Any] = [Html(DIAG_NOTE), Panels(panels)]
    if table:
        cols = list(table)
        names = [v.name for v in rep.variants if any(v.name in col for col in table.values())]
        rows = [[n, *(f"{table[c][n]:.4g}" if n in table[c] else "–" for c in cols)] for n in names]
        blocks += [Break(), Table(["variant", *cols], rows, left={0})]
    return [Section("Diagnostics", blocks)]


def extrapolation(rep: SweepReport) -> list[Section]:
    png = plots.extrapolation_png(rep, plots.variant_colors(rep))
    return [Section("Length extrapolation", [Figure("report_extrapolation.png", "Length extrapolation", png)])
            ] if png else []


def calibration_rows(rep: SweepReport) -> list[list[str]]:
    """Per variant with calibration.json: mean ECE before and after temperature scaling, the temperature, runs."""
    out = []
    for v in rep.variants:
        cs = [r.calibration for r in v.runs if r.calibration]
        if not cs:
            continue
        cell = []
        for k in ("ece_before", "ece_after", "temperature"):
            xs = [c[k] for c in cs if isinstance(c.get(k), (int, float)) and not isinstance(c.get(k), bool)]
            cell.append(f"{mean(xs):.4f}" if xs else "–")
        out.append([v.name, *cell, str(len(cs))])
    return out


def calibration(rep: SweepReport) -> list[Section]:
    rows = calibration_rows(rep)
    head = ["variant", "ECE before", "ECE after", "temperature", "runs"]
    return [Section("Calibration", [Table(head, rows, left={0}, row_lines=True)])] if rows else []
