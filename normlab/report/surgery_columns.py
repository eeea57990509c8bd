"""Surgery columns and sections of the sweep report (``normlab report SWEEP_DIR --quantize --label-free``).

- ``measure_sweep``: for every completed run of a sweep, compute (or reuse) ``quant_robustness.json`` and / or
  ``label_free.json`` in its run directory (normlab.surgery.robustness);
- ``robustness_rows``: per variant, the mean bits/byte increase under W4 RTN and W4 + Hadamard, as rows of the
  report's diagnostics table (next to the massive-activation ratio);
- ``label_free_sections``: per variant the mean MaNo, Matrix Nuclear-Norm and loss, and across all runs the
  Spearman and Pearson correlation of each score with the loss on the same tokens.
"""

from __future__ import annotations

from pathlib import Path
from statistics import mean
from typing import Any, Callable

from normlab.errors import NormlabError
from normlab.experiments.store import Store
from normlab.io import read_json
from normlab.report.document import Note, Paragraph, Section, Table
from normlab.surgery.robustness import LABEL_FREE_FILE, QUANT_FILE, label_free, pearson, quant_robustness, spearman

W4_RTN = "W4 RTN Δbits/byte"
W4_HAD = "W4 + Hadamard Δbits/byte"


def measure_sweep(sweep_dir: str | Path, *, quantize: bool, label_free_scores: bool, max_tokens: int = 8192,
                  log: Callable[[str], None] = lambda s: None) -> int:
    """Measure every completed run of the sweep; returns how many runs were visited."""
    sweep_dir = Path(sweep_dir)
    rows = [r for r in Store(sweep_dir / "results.sqlite").runs() if r["status"] == "completed"]
    for i, r in enumerate(rows, 1):
        run_dir = sweep_dir / "runs" / r["run_id"]
        if quantize:
            q = quant_robustness(run_dir, max_tokens=max_tokens)
            had = "n/a" if q["w4_hadamard"] is None else f"{q['w4_hadamard']:+.4f}"
            log(f"[{i}/{len(rows)}] {r['variant']} seed {r['seed']}: W4 RTN {q['w4_rtn']:+.4f}, W4+Hadamard {had}")
        if label_free_scores:
            lf = label_free(run_dir, max_tokens=max_tokens)
            log(f"[{i}/{len(rows)}] {r['variant']} seed {r['seed']}: MaNo {lf['mano']:.5f}, "
                f"MNN {lf['matrix_nuclear_norm']:.4f}, loss {lf['loss']:.4f}")
    return len(rows)


def _read(run_dir: Path, name: str) -> dict[str, Any] | None:
    try:
        d = read_json(run_dir / name)  # a regular file under the size cap; None when missing or refused
    except NormlabError:
        return None
    return d if isinstance(d, dict) else None


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def robustness_rows(rep) -> dict[str, dict[str, float]]:
    """``{column label: {variant: mean over its runs}}`` from the runs' ``quant_robustness.json``."""
    out: dict[str, dict[str, float]] = {}
    for v in rep.variants:
        qs = [_read(rep.sweep_dir / "runs" / r.row["run_id"], QUANT_FILE) for r in v.runs]
        qs = [q for q in qs if q]
        for label, key in ((W4_RTN, "w4_rtn"), (W4_HAD, "w4_hadamard")):
            xs = [q[key] for q in qs if _num(q.get(key))]
            if xs:
                out.setdefault(label, {})[v.name] = mean(xs)
    return out


def label_free_data(rep) -> dict[str, Any] | None:
    """Per-variant means and the correlations across runs, or None when no run has ``label_free.json``."""
    points = []
    for v in rep.variants:
        for r in v.runs:
            d = _read(rep.sweep_dir / "runs" / r.row["run_id"], LABEL_FREE_FILE)
            if d and all(_num(d.get(k)) for k in ("mano", "matrix_nuclear_norm", "loss")):
                points.append((v.name, d))
    if not points:
        return None
    rows = []
    for v in rep.variants:
        ds = [d for n, d in points if n == v.name]
        if ds:
            rows.append({"variant": v.name, "runs": len(ds), **{k: mean(d[k] for d in ds)
                                                                 for k in ("mano", "matrix_nuclear_norm", "loss")}})
    loss = [d["loss"] for _, d in points]
    corr = {
        k: {"spearman": spearman([d[k] for _, d in points], loss), "pearson": pearson([d[k] for _, d in points], loss)}
        for k in ("mano", "matrix_nuclear_norm")
    }
    return {"rows": rows, "correlation": corr, "n_runs": len(points)}


def _c(x: float | None) -> str:
    return "n/a (fewer than 3 runs)" if x is None else f"{x:+.3f}"


NOTE = ("MaNo (Xie et al. 2024; softmax-normalised logits, p = 4) and the Matrix Nuclear-Norm (Li et al. 2024; "
        "hidden states before the LM head) use no labels; loss = validation nats/token on the same tokens "
        "(normlab report --label-free). Correlations are over all runs of the sweep.")


def label_free_sections(rep) -> list[Section]:
    """The "Label-free metrics" section (per-variant means, the correlations with the loss), or none."""
    d = label_free_data(rep)
    if d is None:
        return []
    c = d["correlation"]
    corr_line = (f"Across {d['n_runs']} runs: MaNo vs loss Spearman {_c(c['mano']['spearman'])}, Pearson "
                 f"{_c(c['mano']['pearson'])}; Matrix Nuclear-Norm vs loss Spearman "
                 f"{_c(c['matrix_nuclear_norm']['spearman'])}, Pearson {_c(c['matrix_nuclear_norm']['pearson'])}.")
    rows = [[r["variant"], f"{r['mano']:.5f}", f"{r['matrix_nuclear_norm']:.4f}", f"{r['loss']:.4f}", str(r["runs"])]
            for r in d["rows"]]
    table = Table(["variant", "MaNo", "Matrix Nuclear-Norm", "val loss", "runs"], rows, left={0})
    return [Section("Label-free metrics", [table, Paragraph(corr_line), Note(NOTE)])]
