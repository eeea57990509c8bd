"""Write ``SWEEP_DIR/report.html`` (self-contained: inline CSS, plots as base64 PNG) and ``SWEEP_DIR/report.md``
(with ``report_*.png`` next to it).

A report is the sections of ``SECTIONS``, in that order. Each entry names a builder: a function of the sweep's
analysis (a ``SweepReport``) returning its sections (normlab.report.document: a title and blocks, written once),
none when its data is absent. ``to_html`` and ``to_markdown`` render the whole document. To add a section, write a
module with such a builder and name it in ``SECTIONS`` where it belongs."""

from __future__ import annotations

import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from normlab.io import atomic_path, check_file_slot, check_inside, write_text
from normlab.plotting import quiet_drawing
from normlab.report import equal_flops, lrsection, plots, probes, ranking, reproduce, scaling_section, sections
from normlab.report import sequential as seqsection
from normlab.report import sequential_section, surgery_columns
from normlab.report.analysis import SweepReport, load
from normlab.report.document import Document, Section, to_html, to_markdown
from normlab.report.ranking import markdown_table, ranking_rows, ranks_nothing, table_cells

SectionBuilder = Callable[[SweepReport], list[Section]]


def _learning_rate(rep: SweepReport) -> list[Section]:
    return lrsection.sections(rep.grid, plots.variant_colors(rep))


SECTIONS: tuple[tuple[str, SectionBuilder], ...] = (
    ("summary", sections.summary),
    ("run", sections.run),  # a report of one run directory
    ("learning rate", _learning_rate),  # grid, paired differences, collapse, instability signals
    ("sequential", sequential_section.sections),  # seeds until decided, replications
    ("ranking", ranking.sections),
    ("curves", sections.curves),
    ("equal flops", equal_flops.sections),  # variant vs baseline at equal steps and equal FLOPs (docs/advise.md)
    ("probes", probes.sections),  # per variant, the stored in-context probes (diag.probes) beside chance
    ("scaling", scaling_section.sections),  # a sweep over model sizes (docs/scaling.md)
    ("diagnostics", sections.diagnostics),
    ("extrapolation", sections.extrapolation),
    ("calibration", sections.calibration),
    ("label-free", surgery_columns.label_free_sections),  # normlab report --label-free
    ("setup", reproduce.setup),
    ("reproduce", reproduce.reproduce),
)


def document(rep: SweepReport, builders: tuple[tuple[str, SectionBuilder], ...] = SECTIONS) -> Document:
    """The report of ``rep`` as one document: a title, a generated-at line and every builder's sections."""
    title = rep.meta.get("title") or f"normlab compare: {rep.meta.get('sweep_name', rep.sweep_dir.name)}"
    stamp = time.strftime("%Y-%m-%d %H:%M", time.localtime())
    sub = f"generated {stamp} by normlab report · Python {platform.python_version()}"
    return Document(title, sub, [s for _, build in builders for s in build(rep)])


def build(rep: SweepReport) -> tuple[str, str, dict[str, bytes]]:
    """HTML text, Markdown text and ``{png file name: bytes}``."""
    doc = document(rep)
    return to_html(doc), to_markdown(doc), doc.figures()


def write_report(sweep_dir: str | Path, *, baseline: str | None = None, rep: SweepReport | None = None
                 ) -> dict[str, Any]:
    """Write report.html, report.md and report_*.png into ``sweep_dir`` (of ``rep``, default: the sweep's own
    report); return paths, the ranking and the learning-rate section as plain values."""
    rep = rep if rep is not None else load(sweep_dir, baseline)
    with quiet_drawing():
        text_html, text_md, figs = build(rep)
    d = Path(sweep_dir)
    for name in ["report.html", "report.md", *figs]:  # every slot checked before anything is written
        check_file_slot(check_inside(d, d / name))
    for old in d.glob("report_*.png"):
        if old.name not in figs:
            old.unlink(missing_ok=True)
    for name, png in figs.items():
        with atomic_path(d / name) as tmp:
            tmp.write_bytes(png)
    write_text(d / "report.html", text_html)
    write_text(d / "report.md", text_md)
    return {"html": str(d / "report.html"), "md": str(d / "report.md"), "ranking": ranking_rows(rep),
            "summary": rep.summary, "report": rep, "lr": lrsection.rows_json(rep.grid) if rep.grid else None,
            "sequential": seqsection.sequential_block(d), "replication": seqsection.replication_block(d)}


__all__ = ["SECTIONS", "SectionBuilder", "build", "document", "markdown_table", "ranking_rows", "ranks_nothing",
           "table_cells", "write_report"]
