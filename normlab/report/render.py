"""Write ``SWEEP_DIR/report.html`` (self-contained: inline CSS, plots as base64 PNG) and ``SWEEP_DIR/report.md``
(with ``report_*.png`` next to it). Sections appear only when their data exists."""

from __future__ import annotations

import base64
import html
import platform
import time
from pathlib import Path
from typing import Any

import yaml

from normlab.errors import NormlabError
from normlab.io import MAX_YAML_BYTES, atomic_path, check_file_slot, check_inside, read_text, write_text
from normlab.report import lrsection, plots
from normlab.report import sequential as seqsection
from normlab.report.analysis import SweepReport, VariantResult, ci_text, diagnostics, load
from normlab.report.equal_flops import section as equal_flops_section
from normlab.markdown import md_code, md_escape, md_fence, md_table
from normlab.report.scaling_section import section as scaling_section
from normlab.run.files import CONFIG_FILE
from normlab.safety import shell_quote

CSS = """
body{font-family:-apple-system,"Segoe UI",Roboto,"DejaVu Sans",Helvetica,Arial,sans-serif;margin:0;color:#1d232a;
background:#f6f7f9}
main{max-width:1120px;margin:0 auto;padding:24px 32px 48px;background:#fff;min-height:100vh}
h1{font-size:26px;margin:4px 0 2px}
h2{font-size:19px;margin:30px 0 8px;border-bottom:1px solid #e3e6ea;padding-bottom:4px}
h3{font-size:15px;margin:18px 0 6px}
.sub{color:#5b6470;font-size:13px;margin-bottom:14px}
table{border-collapse:collapse;font-size:13px;margin:8px 0 4px}
th,td{border-bottom:1px solid #e3e6ea;padding:5px 10px;text-align:right;white-space:nowrap}
th{background:#f0f2f5;font-weight:600}
td.l,th.l{text-align:left}
tr.best td{background:#eaf6ec;font-weight:600}
tr.div td{color:#a33}
ul.summary li{margin:4px 0;line-height:1.45}
img{max-width:100%;height:auto;display:block;margin:8px 0}
code,pre{font-family:"DejaVu Sans Mono",Menlo,Consolas,monospace;font-size:12px}
pre{background:#f4f5f7;padding:8px 10px;overflow-x:auto;border-radius:4px;margin:6px 0}
details{margin:4px 0}summary{cursor:pointer;font-size:13px}
.note{color:#5b6470;font-size:12px}
.grid{display:flex;flex-wrap:wrap;gap:10px}.grid>div{flex:1 1 480px}
"""


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
    head = ["#", "variant", "val bits/byte (mean ± 95% CI)", "best val bpb"]
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


def _setup(rep: SweepReport) -> list[tuple[str, str]]:
    if not rep.runs:
        return []
    configs = [r.row["config"] for r in rep.runs]

    def val(section: str, key: str) -> str:
        vals = []
        for c in configs:
            v = c.get(section, {}).get(key)
            if v not in vals:
                vals.append(v)
        return str(vals[0]) if len(vals) == 1 else "varies (" + ", ".join(map(str, vals)) + ")"

    c = configs[0]
    steps, bs, ctx, acc = (c["train"].get("steps"), c["train"].get("batch_size"), c["model"].get("context"),
                           c["train"].get("grad_accum", 1))
    same_tokens = all((x["train"].get("steps"), x["train"].get("batch_size"), x["model"].get("context"),
                       x["train"].get("grad_accum", 1)) == (steps, bs, ctx, acc) for x in configs)
    tokens = f" = {steps * bs * ctx * acc:,} tokens per run" if same_tokens and None not in (steps, bs, ctx) else ""
    seeds = sorted({r.row["seed"] for r in rep.runs})
    items = [
        ("corpus", f"{val('data', 'source')} ({val('data', 'tokenizer')} tokenizer)"),
        ("model", f"width {val('model', 'width')}, depth {val('model', 'depth')}, heads {val('model', 'heads')}, "
                  f"context {val('model', 'context')}, {val('model', 'activation')} MLP, "
                  f"{val('model', 'positions')} positions"),
        ("training", f"{val('train', 'steps')} steps × batch {val('train', 'batch_size')} × context{tokens}; "
                     f"lr {val('train', 'lr')}, warm-up {val('train', 'warmup_steps')} steps; validation on "
                     f"{val('train', 'eval_batches')} batches every {val('train', 'eval_every')} steps"),
        ("seeds", ", ".join(map(str, seeds))),
    ]
    if rep.meta.get("workers"):
        items.append(("execution", f"{rep.meta['workers']} worker processes × {rep.meta.get('threads', '?')} torch "
                                   f"threads on {rep.meta.get('cores', '?')} cores; wall time of the last compare "
                                   f"call {float(rep.meta.get('wall_s', 0)):.0f} s"))
    items.append(("sweep", f"'{rep.meta.get('sweep_name')}' (hash {rep.meta.get('sweep_hash')}), {rep.sweep_dir}"))
    return items


def _overrides_text(v: VariantResult) -> str:
    ov = v.runs[0].row["overrides"] if v.runs else {}
    return ", ".join(f"{k}={yaml.safe_dump(x, default_flow_style=True).strip().removesuffix('...').strip()}"
                     for k, x in ov.items()) or "(base config)"


def _config_yaml(rep: SweepReport, v: VariantResult) -> str:
    r = v.runs[0]
    path = (r.path or rep.sweep_dir / "runs" / r.row["run_id"]) / CONFIG_FILE
    try:
        return read_text(path, "config", MAX_YAML_BYTES)
    except NormlabError:
        return yaml.safe_dump(r.row["config"], sort_keys=False)


def _commands(rep: SweepReport) -> tuple[str, list[tuple[str, str, str]]]:
    d = rep.sweep_dir
    if rep.meta.get("title"):  # run directories: the report command itself
        paths = list(dict.fromkeys(str(r.path) for r in rep.runs if r.path))
        whole = "normlab report " + " ".join(map(shell_quote, paths)) + f" --out {shell_quote(d)}"
    else:
        whole = f"normlab compare {shell_quote(d / 'sweep.yaml')} --out {shell_quote(d)}"
    per_run = []
    for v in rep.variants:
        for r in v.runs:
            rid = r.row["run_id"]
            cfg = (r.path or d / "runs" / rid) / CONFIG_FILE
            per_run.append((v.name, rid, f"normlab train {shell_quote(cfg)} --out {shell_quote(f'runs/repro-{rid}')}"))
    return whole, per_run


def build(rep: SweepReport) -> tuple[str, str, dict[str, bytes]]:
    """HTML text, Markdown text and ``{png file name: bytes}``."""
    cmap = plots.colors(plots.variant_order(rep))
    figs: dict[str, bytes] = {}
    caps: dict[str, str] = {}

    def add(name: str, png: bytes | None, caption: str) -> None:
        if png:
            figs[name] = png
            caps[name] = caption

    grid = rep.grid
    grid_names = [g.name for g in grid.groups] if grid else []
    gmap = plots.colors(grid_names) if grid and grid.is_grid else cmap
    for name, (png, cap) in (lrsection.figures(grid, gmap).items() if grid else ()):
        add(name, png, cap)
    add("report_ranking.png", plots.ranking_png(rep, cmap), "Final validation bits/byte per variant")
    single = rep.runs[0] if len(rep.runs) == 1 else None
    if single is not None:
        add("report_run.png", plots.run_curves_png(single), "Training and validation curves, every logged step")
    add("report_curves.png", plots.curves_png(rep, cmap), "Validation and training curves")
    sections, diag_table = diagnostics(rep)
    for s in sections:
        add(f"report_diag_{s.category}.png", plots.diag_png(s, cmap), s.title)
    add("report_extrapolation.png", plots.extrapolation_png(rep, cmap), "Length extrapolation")
    scaling = scaling_section(rep)  # a sweep over model sizes (docs/scaling.md); None otherwise
    if scaling:
        figs.update(scaling.figs)
    calib = _calibration_rows(rep)
    whole, per_run = _commands(rep)
    head, rows = table_cells(rep)
    title = rep.meta.get("title") or f"normlab compare: {rep.meta.get('sweep_name', rep.sweep_dir.name)}"
    stamp = time.strftime("%Y-%m-%d %H:%M", time.localtime())
    sub = f"generated {stamp} by normlab report · Python {platform.python_version()}"

    # ---------------------------------------------------------------- HTML
    e = html.escape
    h: list[str] = [f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{e(title)}</title>"
                    f"<style>{CSS}</style></head><body><main>", f"<h1>{e(title)}</h1><div class='sub'>{e(sub)}</div>"]
    h.append("<h2>Summary</h2><ul class='summary'>" + "".join(f"<li>{e(s)}</li>" for s in rep.summary) + "</ul>")
    def img(n: str) -> str:
        if n not in figs:
            return ""
        return f"<img alt='{e(caps[n])}' src='data:image/png;base64,{base64.b64encode(figs[n]).decode()}'>"

    if single is not None:
        h.append("<h2>Run</h2>" + img("report_run.png") + "<table>" + "".join(
            f"<tr><th class='l'>{e(k)}</th><td class='l'>{e(v)}</td></tr>" for k, v in _run_items(single)) + "</table>")
    if grid:
        h += lrsection.html_section(grid, img)
    h += seqsection.html_sections(rep.sweep_dir)  # seeds until decided, replications (normlab.report.sequential)
    ranking_title = "Every variant × learning rate" if grid and grid.is_grid else "Ranking"
    h.append(f"<h2>{ranking_title}</h2><table><tr>" + "".join(f"<th class='{'l' if i == 1 else ''}'>{e(c)}</th>"
                                                    for i, c in enumerate(head)) + "</tr>")
    for v, cells in zip(rep.variants, rows):
        cls = "best" if v.rank == 1 and not ranks_nothing(rep) else ("div" if v.ci is None else "")
        h.append(f"<tr class='{cls}'>" + "".join(f"<td class='{'l' if i == 1 else ''}'>{e(c)}</td>"
                                                 for i, c in enumerate(cells)) + "</tr>")
    h.append("</table><div class='note'>Ranked by the mean final validation bits/byte over completed seeds; "
             "± is the half-width of the 95% Student-t interval (n − 1 degrees of freedom). Diverged seeds are "
             "counted, not averaged.</div>")
    h.append(img("report_ranking.png"))
    if "report_curves.png" in figs:
        h.append("<h2>Validation curves</h2>" + img("report_curves.png"))
    flops = equal_flops_section(rep)  # variant vs baseline at equal steps and equal training FLOPs (docs/advise.md)
    if flops:
        h.append(flops[0])
    if scaling:
        h.append(scaling.html)
    if sections or diag_table:
        h.append("<h2>Diagnostics</h2><div class='note'>Means over seeds; from each run's diagnostics.json "
                 "(normlab diagnose) and training-time diag/ metrics.</div><div class='grid'>")
        for s in sections:
            h.append(f"<div><h3>{e(s.title)}</h3>{img(f'report_diag_{s.category}.png')}</div>")
        h.append("</div>")
        if diag_table:
            h.append(_html_matrix(diag_table, rep))
    if "report_extrapolation.png" in figs:
        h.append("<h2>Length extrapolation</h2>" + img("report_extrapolation.png"))
    if calib:
        h.append("<h2>Calibration</h2><table><tr><th class='l'>variant</th><th>ECE before</th><th>ECE after</th>"
                 "<th>temperature</th><th>runs</th></tr>")
        h += [f"<tr><td class='l'>{e(n)}</td>" + "".join(f"<td>{e(c)}</td>" for c in cs) + "</tr>" for n, *cs in calib]
        h.append("</table>")
    from normlab.report.surgery_columns import label_free_section  # normlab report --label-free

    label_free = label_free_section(rep)
    if label_free:
        h.append(label_free[0])
    h.append("<h2>Setup</h2><table>" + "".join(f"<tr><th class='l'>{e(k)}</th><td class='l'>{e(v)}</td></tr>"
                                               for k, v in _setup(rep)) + "</table>")
    whole_note = ("This report (the same runs):" if rep.meta.get("title") else
                  "The whole sweep (resumes, skips finished runs):")
    h.append(f"<h2>Reproduce</h2><p>{whole_note}</p><pre>{e(whole)}</pre>"
             "<p>One run (its config.yaml holds every key, defaults included):</p><table>"
             "<tr><th class='l'>variant</th><th class='l'>command</th></tr>")
    h += [f"<tr><td class='l'>{e(n)}</td><td class='l'><code>{e(c)}</code></td></tr>" for n, _, c in per_run]
    h.append("</table><h3>Configs</h3>")
    for v in rep.variants:
        h.append(f"<details><summary><b>{e(v.name)}</b>: {e(_overrides_text(v))}</summary>"
                 f"<pre>{e(_config_yaml(rep, v))}</pre></details>")
    h.append("</main></body></html>")

    # ---------------------------------------------------------------- Markdown
    md: list[str] = [f"# {md_escape(title)}", "", f"_{md_escape(sub)}_", "", "## Summary", ""] + [
        f"- {md_escape(s)}" for s in rep.summary]

    def mdimg(n: str) -> list[str]:
        return [f"![{md_escape(caps[n])}]({n})", ""] if n in figs else []

    md.append("")
    if single is not None:
        md += ["## Run", ""] + mdimg("report_run.png") + [f"- **{md_escape(k)}**: {md_escape(v)}"
                                                           for k, v in _run_items(single)] + [""]
    if grid:
        md += lrsection.md_section(grid, mdimg)
    md += seqsection.md_sections(rep.sweep_dir, md_escape)
    md += [f"## {ranking_title}", "", markdown_table(rep), "",
           "Ranked by the mean final validation bits/byte over completed seeds; ± is the half-width of the 95% "
           "Student-t interval. Diverged seeds are counted, not averaged.", ""]
    md += mdimg("report_ranking.png")
    if "report_curves.png" in figs:
        md += ["## Validation curves", ""] + mdimg("report_curves.png")
    if flops:
        md += flops[1]
    if scaling:
        md += scaling.md
    if sections or diag_table:
        md += ["## Diagnostics", ""]
        for s in sections:
            md += [f"### {md_escape(s.title)}", ""] + mdimg(f"report_diag_{s.category}.png")
        if diag_table:
            md += [_md_matrix(diag_table, rep), ""]
    if "report_extrapolation.png" in figs:
        md += ["## Length extrapolation", ""] + mdimg("report_extrapolation.png")
    if calib:
        md += ["## Calibration", "", "| variant | ECE before | ECE after | temperature | runs |",
               "| :--- | ---: | ---: | ---: | ---: |"]
        md += ["| " + " | ".join(md_escape(c) for c in [n, *cs]) + " |" for n, *cs in calib] + [""]
    if label_free:
        md += [label_free[1]]
    md += ["## Setup", ""] + [f"- **{k}**: {md_escape(v)}" for k, v in _setup(rep)]
    md += ["", "## Reproduce", "", md_escape(whole_note), "", *md_fence(whole), "",
           "One run:", "", "| variant | command |", "| :--- | :--- |"]
    md += [f"| {md_escape(n)} | {md_code(c, in_table=True)} |" for n, _, c in per_run]
    md += ["", "### Configs", ""]
    for v in rep.variants:
        md += [f"<details><summary>{md_escape(v.name)}: {md_escape(_overrides_text(v))}</summary>", "",
               *md_fence(_config_yaml(rep, v), "yaml"), "", "</details>", ""]
    return "\n".join(h), "\n".join(md) + "\n", figs


def _run_items(run: Any) -> list[tuple[str, str]]:
    """summary.json of one run as (key, text) pairs (numbers rounded; nested values as compact JSON)."""
    import json

    out = []
    for k, v in (run.summary or {}).items():
        if isinstance(v, float):
            out.append((k, f"{v:.6g}"))
        elif isinstance(v, (dict, list)):
            out.append((k, json.dumps(v, default=str)[:300]))
        else:
            out.append((k, str(v)))
    return out


def _calibration_rows(rep: SweepReport) -> list[list[str]]:
    from statistics import mean

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


def _matrix_cols(table: dict[str, dict[str, float]], rep: SweepReport) -> tuple[list[str], list[str]]:
    names = [v.name for v in rep.variants if any(v.name in col for col in table.values())]
    return list(table), names


def _html_matrix(table: dict[str, dict[str, float]], rep: SweepReport) -> str:
    cols, names = _matrix_cols(table, rep)
    e = html.escape
    out = ["<table><tr><th class='l'>variant</th>" + "".join(f"<th>{e(c)}</th>" for c in cols) + "</tr>"]
    for n in names:
        out.append(f"<tr><td class='l'>{e(n)}</td>" + "".join(
            f"<td>{table[c][n]:.4g}</td>" if n in table[c] else "<td>–</td>" for c in cols) + "</tr>")
    return "".join(out) + "</table>"


def _md_matrix(table: dict[str, dict[str, float]], rep: SweepReport) -> str:
    cols, names = _matrix_cols(table, rep)
    rows = [[n, *(f"{table[c][n]:.4g}" if n in table[c] else "–" for c in cols)] for n in names]
    return md_table(["variant", *cols], rows, [":---"] + ["---:"] * len(cols))


def write_report(sweep_dir: str | Path, *, baseline: str | None = None, rep: SweepReport | None = None
                 ) -> dict[str, Any]:
    """Write report.html, report.md and report_*.png into ``sweep_dir`` (of ``rep``, default: the sweep's own
    report); return paths, the ranking and the learning-rate section as plain values."""
    rep = rep if rep is not None else load(sweep_dir, baseline)
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
