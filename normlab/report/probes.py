"""The report's "In-context probes" section: per variant, the probes each completed run stored with
``diag.probes: true`` (``RUN/probes.json``, normlab.eval.probes.store_probes: induction after Olsson et al. 2022,
associative recall after Ba et al. 2016 / Arora et al. 2023), as mean ± the 95% Student-t half-width over seeds
(normlab.stats.mean_ci, n - 1 degrees of freedom), each beside its chance level. Exploratory: no comparison here is
part of a sweep's declared family. Torch-free; reads the run directories only.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from normlab.errors import NormlabError
from normlab.io import read_json
from normlab.report.document import Note, Section, Table
from normlab.rundir.files import PROBES_FILE
from normlab.stats.intervals import mean_ci

TITLE = "In-context probes"
HEAD = ["variant", "seeds", "first copy (nats)", "second copy (nats)", "induction gain", "chance first copy",
        "recall accuracy", "chance recall"]


def read_probes(run_dir: Path) -> dict[str, Any] | None:
    """A run's stored probes (``probes.json``), or None when absent, unreadable or not a probes record."""
    try:
        rec = read_json(run_dir / PROBES_FILE, "probes") if (run_dir / PROBES_FILE).is_file() else None
    except NormlabError:
        return None
    return rec if isinstance(rec, dict) and ("error" in rec or {"induction", "recall"} <= rec.keys()) else None


def _run_dir(rep: Any, info: Any) -> Path:
    return info.path or Path(rep.sweep_dir) / "runs" / info.row["run_id"]


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _groups(rep: Any) -> list[tuple[str, list[Any]]]:
    """``(label, runs)`` per variant in the report's order; a variant trained at several learning rates is one row
    per learning rate (``name @ lr X``)."""
    out: list[tuple[str, list[Any]]] = []
    for v in rep.variants:
        lrs = list(dict.fromkeys((r.row.get("axes") or {}).get("train.lr") for r in v.runs))
        if len(lrs) <= 1:
            out.append((v.name, list(v.runs)))
        else:
            out += [(f"{v.name} @ lr {lr:g}" if _num(lr) else f"{v.name} @ lr {lr}",
                     [r for r in v.runs if (r.row.get("axes") or {}).get("train.lr") == lr]) for lr in lrs]
    return out


def _ci(values: list[float]) -> dict[str, Any]:
    c = mean_ci(values)
    return {"mean": c.mean, "half": c.half, "n": c.n}


def _levels(values: list[float]) -> float | list[float]:
    """One chance level when every run of a variant has it, else the distinct ones (runs with other symbol sets)."""
    distinct = sorted(set(values))
    return distinct[0] if len(distinct) == 1 else distinct


def rows(rep: Any) -> tuple[list[dict[str, Any]], list[str]]:
    """Per variant (``_groups``) with at least one stored probe: ``{variant, n, first_copy_loss, second_copy_loss,
    induction_gain, accuracy: {mean, half, n}, chance_first_copy_loss, chance_accuracy, symbols, settings}``; and the
    notes on completed runs without usable probes (``run id: why``)."""
    out, missing = [], []
    for label, runs in _groups(rep):
        recs = []
        for info in runs:
            if info.row.get("status") != "completed":
                continue
            rec = read_probes(_run_dir(rep, info))
            if rec is None:
                continue  # not asked for (diag.probes off), or unreadable
            if "error" in rec:
                missing.append(f"{info.row['run_id']}: {rec['error']}")
                continue
            ind, rcl = rec["induction"], rec["recall"]
            keys = (ind.get("first_copy_loss"), ind.get("second_copy_loss"), ind.get("induction_gain"),
                    rcl.get("accuracy"), ind.get("chance_first_copy_loss"), rcl.get("chance_accuracy"))
            if not all(_num(x) for x in keys):
                missing.append(f"{info.row['run_id']}: a probe value is not a finite number")
                continue
            recs.append(rec)
        if not recs:
            continue
        ind = [r["induction"] for r in recs]
        rcl = [r["recall"] for r in recs]
        out.append({"variant": label, "n": len(recs),
                    **{k: _ci([x[k] for x in ind]) for k in ("first_copy_loss", "second_copy_loss",
                                                              "induction_gain")},
                    "accuracy": _ci([x["accuracy"] for x in rcl]),
                    "chance_first_copy_loss": _levels([x["chance_first_copy_loss"] for x in ind]),
                    "chance_accuracy": _levels([x["chance_accuracy"] for x in rcl]),
                    "symbols": _levels([x["symbols"] for x in ind]),
                    "settings": recs[0].get("settings"), "length": ind[0].get("length"), "pairs": rcl[0].get("pairs"),
                    "sequences": ind[0].get("sequences"), "seed": ind[0].get("seed")})
    return out, missing


def _pm(c: dict[str, Any], fmt: str = ".3f") -> str:
    return f"{c['mean']:{fmt}}" + (f" ± {c['half']:{fmt}}" if c["half"] is not None else " (1 seed)")


def _chance_loss(row: dict[str, Any]) -> str:
    c, k = row["chance_first_copy_loss"], row["symbols"]
    if isinstance(c, list):
        return " / ".join(f"{x:.3f}" for x in c)
    return f"ln {k} = {c:.3f}"


def _chance_acc(row: dict[str, Any]) -> str:
    c = row["chance_accuracy"]
    if isinstance(c, list):
        return " / ".join(f"{x:.4f}" for x in c)
    return f"1/{round(1 / c)} = {c:.4f}" if c > 0 else f"{c:.4f}"


def cells(table: list[dict[str, Any]]) -> list[list[str]]:
    return [[r["variant"], str(r["n"]), _pm(r["first_copy_loss"]), _pm(r["second_copy_loss"]),
             _pm(r["induction_gain"]), _chance_loss(r), _pm(r["accuracy"]), _chance_acc(r)] for r in table]


def _binomial_sd(row: dict[str, Any]) -> float:
    """The SD of a recall accuracy at chance over the probe's queries: ``sqrt(c (1 - c) / sequences)``."""
    c = row["chance_accuracy"]
    c = c[0] if isinstance(c, list) else c
    return math.sqrt(c * (1 - c) / row["sequences"])


def note(table: list[dict[str, Any]]) -> str:
    r = table[0]
    return (f"From each completed run's {PROBES_FILE} (diag.probes: true; normlab probe RUN reproduces it). "
            f"Induction: {r['sequences']} random sequences of {r['length']} tokens (seed {r['seed']}), each repeated "
            "once; the first copy cannot be predicted (chance: ln K nats for K token ids), the gain is first − second "
            f"copy loss (0: no induction; ln K: perfect copying). Associative recall: {r['pairs']} key-value pairs "
            "and a query; accuracy of the query's value (chance: 1 / the number of values). Token ids: the run's "
            "training-split ids (K). Mean ± the 95% Student-t half-width over seeds (n − 1 degrees of freedom): "
            "every run is probed on the same sequences, so the interval is over training seeds and leaves out the "
            f"probe set's own sampling error (at chance, {r['sequences']} recall queries: binomial SD "
            f"{_binomial_sd(r):.3f}); exploratory.")


def sections(rep: Any) -> list[Section]:
    """The report's "In-context probes" section, or none when no run of ``rep`` stored probes."""
    table, missing = rows(rep)
    if not table and not missing:
        return []
    blocks: list[Any] = []
    if table:
        blocks += [Table(HEAD, cells(table), left=(0,)), Note(note(table))]
    if missing:
        blocks.append(Note("Not measured: " + "; ".join(missing)))
    return [Section(TITLE, blocks)]
