"""The report's closing sections: "Setup" (corpus, model, training, seeds, execution, the sweep) and "Reproduce"
(the command for the whole sweep or report, one ``normlab train`` command per run, each variant's config.yaml)."""

from __future__ import annotations

import yaml

from normlab.errors import NormlabError
from normlab.io import MAX_YAML_BYTES, read_text
from normlab.report.analysis import SweepReport, VariantResult
from normlab.report.document import Break, Code, Details, Fields, Paragraph, Preformatted, Section, Subheading, Table
from normlab.rundir.files import CONFIG_FILE
from normlab.safety import shell_quote


def setup_items(rep: SweepReport) -> list[tuple[str, str]]:
    """``(what, text)`` pairs; a value that differs between runs reads ``varies (a, b)``."""
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


def setup(rep: SweepReport) -> list[Section]:
    return [Section("Setup", [Fields(setup_items(rep))])]


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


def commands(rep: SweepReport) -> tuple[str, list[tuple[str, str, str]]]:
    """The command for the whole sweep (or report), and ``(variant, run id, normlab train command)`` per run."""
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


def reproduce(rep: SweepReport) -> list[Section]:
    whole, per_run = commands(rep)
    whole_note = ("This report (the same runs):" if rep.meta.get("title") else
                  "The whole sweep (resumes, skips finished runs):")
    blocks: list = [
        Paragraph(whole_note), Preformatted(whole),
        Paragraph("One run (its config.yaml holds every key, defaults included):", only="html"),
        Paragraph("One run:", only="md"),
        Table(["variant", "command"], [[n, Code(c)] for n, _, c in per_run], left={0, 1}, row_lines=True),
        Subheading("Configs")]
    for v in rep.variants:
        blocks += [Break(), Details(v.name, _overrides_text(v), _config_yaml(rep, v), "yaml")]
    return [Section("Reproduce", blocks)]
