"""Reports from saved artifacts (results store + run directories): ``write_report(SWEEP_DIR)`` writes
``report.html`` (self-contained) and ``report.md`` (+ ``report_*.png``). The training loop never imports this."""

from normlab.report.analysis import SweepReport, load
from normlab.report.ranking import markdown_table, ranking_rows, table_cells
from normlab.report.render import write_report

__all__ = ["SweepReport", "load", "markdown_table", "ranking_rows", "table_cells", "write_report"]
