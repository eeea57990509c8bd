"""The report's ranking table ("Ranking", or "Every variant × learning rate" on a learning-rate grid): one row per
variant with the mean final validation bits/byte and its 95% Student-t interval over completed seeds. The same
cells feed the HTML and Markdown report, ``normlab compare``'s terminal table and its JSON."""

from __future__ import annotations

from typing import Any

from normlab.markdown import md_table
from normlab.report import plots
from normlab.report.analysis import SweepReport, ci_text
from normlab.report.document import Break, Figure, Note, Section, Table

SAMPLED = ("Sampled val bits/byte is what training measured on a fixed sample of the validation split "
           "(train.eval_batches windows); normlab eval RUN_DIR scores the whole split.")
HTML_NOTE = ("Ranked by the mean final sampled validation bits/byte over completed seeds; ± is the half-width of the "
             "95% Student-t interval (n − 1 degrees of freedom). Diverged seeds are counted, not averaged. " + SAMPLED)
MD_NOTE = ("Ranked by the mean final sampled validation bits/byte over completed seeds; ± is the half-width of the "
           "95% Student-t interval. Diverged seeds are counted, not averaged. " + SAMPLED)


def ranking_rows(rep: SweepReport) -> list[dict[str, Any]]:
    """The ranking table as plain values (JSON output, terminal table, tests)."""
    out = []
    for v in rep.variants:
        out.append({
            "rank": v.rank, "variant": v.name,
            "val_bpb_mean": v.ci.mean if v.ci else None,
            "val_bpb_ci95": v.ci.half if v.ci else None,
            "best_val_bpb_mean": v.best_ci.mean if v.best_ci else None,
            "gap_to_floor": v.gap, "entropy_floor_bpb": v.floor,
            "completed": len(v.finals), "seeds": v.n_seeds, "diverged": len(v.diverged),
            "tokens_per_s": v.tokens_per_s, "params": v.params,
            "welch_p_vs_best": v.vs_best.p if v.vs_best else None,
            "unigram_bpb": v.unigram, "did_not_learn": v.not_learned,  # seeds; a variant with any is never ranked
        })
    return out


def _has_floor(rep: SweepReport) -> bool:
    return any(v.floor is not None for v in rep.variants)


def ranks_nothing(rep: SweepReport) -> bool:
    """A learning-rate grid whose summary ranks no variant (none has a finished grid that learned,
    ``lrsection.summary``): the per-cell table then shows no rank and no highlighted #1 either."""
    grid = rep.grid
    return bool(grid is not None and grid.is_grid
                and not any(g.sensitivity is not None and g.rank is not None for g in grid.groups))


def table_cells(rep: SweepReport) -> tuple[list[str], list[list[str]]]:
    """Header and string cells of the ranking table (shared by HTML, Markdown and the terminal); no rank where the
    summary ranks nothing (``ranks_nothing``)."""
    unranked = ranks_nothing(rep)
    head = ["#", "variant", "sampled val bits/byte (mean ± 95% CI)", "best sampled val bits/byte"]
    if _has_floor(rep):
        head.append("gap to floor")
    head += ["seeds ok", "diverged", "tokens/s", "params"]
    rows = []
    for v in rep.variants:
        val = ci_text(v.ci) + (f" (did not learn in {v.not_learned}/{len(v.finals)})" if v.not_learned else "")
        cells = [str(v.rank or "–") if not unranked else "–", v.name, val,
                 f"{v.best_ci.mean:.4f}" if v.best_ci else "–"]
        if _has_floor(rep):
            cells.append(f"{v.gap:.4f}" if v.gap is not None else "–")
        cells += [f"{len(v.finals)}/{v.n_seeds}", str(len(v.diverged)),
                  f"{v.tokens_per_s:,.0f}" if v.tokens_per_s else "–", f"{v.params:,}" if v.params else "–"]
        rows.append(cells)
    return head, rows


def markdown_table(rep: SweepReport) -> str:
    head, rows = table_cells(rep)
    return md_table(head, rows, ["---:" if i != 1 else ":---" for i in range(len(head))])


def sections(rep: SweepReport) -> list[Section]:
    """The ranking table (the best variant highlighted, diverged ones marked) and the final-loss figure."""
    head, rows = table_cells(rep)
    unranked = ranks_nothing(rep)
    classes = ["best" if v.rank == 1 and not unranked else ("div" if v.ci is None else "") for v in rep.variants]
    title = "Every variant × learning rate" if rep.grid and rep.grid.is_grid else "Ranking"
    png = plots.ranking_png(rep, plots.variant_colors(rep))
    return [Section(title, [
        Table(head, rows, left={1}, row_class=classes, class_every_cell=True, row_lines=True),
        Note(HTML_NOTE, only="html"), Note(MD_NOTE, only="md"), Break(),
        Figure("report_ranking.png", "Final validation bits/byte per variant", png)])]
