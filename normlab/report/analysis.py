"""Numbers for the report, from saved artifacts only: the results store and the run directories.

Ranking: per variant, the mean and 95% t-interval of the final validation bits-per-byte over its completed seeds
(diverged or unfinished seeds are counted, not averaged). Summary sentences are generated from these numbers
only. Decisions ("lower", "higher", "beyond noise") are made only on the sweep's declared primary family
(normlab.decide.decisions, ``primary_family``); the differences from the best variant of a ranking are
exploratory estimates (Welch interval, unadjusted p), never verdicts: that comparison is chosen by the data.

Optional per-run artifacts are read defensively (a missing, unreadable or differently shaped file is skipped):
``diagnostics.json`` (``normlab diagnose``), ``extrapolation.json`` (``{"results": [{factor, context, loss,
bpb}]}``; ``bits_per_byte`` in files written before the rename), ``calibration.json`` (``ece_before``,
``ece_after``, ``temperature``), and training-time
``diag/...`` metrics in the stored curves.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from statistics import mean
from typing import Any

import numpy as np

from normlab.errors import NormlabError
from normlab.experiments.design import changed_after_results, stored_design
from normlab.experiments.lrgrid import GridReport, analyze, grid_runs_from_rows
from normlab.experiments.store import Store
from normlab.experiments.sweepspec import stored_sweep
from normlab.io import read_json, read_yaml_file
from normlab.names import GRAD_NORM_PREFIXES, read_bpb
from normlab.report import lrsection
from normlab.report.surgery_columns import robustness_rows
from normlab.rundir import readers
from normlab.rundir.curves import Curve
from normlab.rundir.files import SUMMARY_FILE
from normlab.stats.intervals import MeanCI, Welch, mean_ci, t_ppf, welch, welch_diff
from normlab.stats.learning import DID_NOT_LEARN_MARGIN, did_not_learn

ALPHA = 0.05


def point_columns(pts: Any) -> tuple[np.ndarray, np.ndarray]:
    """``(steps, values)`` of a curve as int64 / float64 arrays in its own order, without a Python object per point
    (a ``Curve``'s columns are copied as they are)."""
    if isinstance(pts, Curve):
        return np.array(pts.steps, dtype=np.int64), np.array(pts.values, dtype=np.float64)
    n = len(pts)
    return (np.fromiter((p[0] for p in pts), dtype=np.int64, count=n),
            np.fromiter((p[1] for p in pts), dtype=np.float64, count=n))


def by_step(pts: Any) -> tuple[np.ndarray, np.ndarray]:
    """``(steps, values)`` of a curve with each step once, increasing, holding the value it had last (what
    ``dict(pts)`` keeps)."""
    s, v = point_columns(pts)
    order = np.argsort(s, kind="stable")
    s, v = s[order], v[order]
    last = np.ones(len(s), dtype=bool)
    last[:-1] = s[1:] != s[:-1]
    return s[last], v[last]


@dataclass
class RunInfo:
    row: dict[str, Any]
    # {key: points}: (step, value) pairs from the results store, or a Curve (columns) from a run directory's
    # metrics file (normlab.rundir.readers.read_curves)
    curves: dict[str, Any]
    diagnostics: dict[str, Any] | None = None
    extrapolation: list[dict[str, Any]] | None = None
    calibration: dict[str, Any] | None = None
    summary: dict[str, Any] | None = None
    path: Path | None = None  # the run directory when not SWEEP_DIR/runs/<run id> (normlab report RUN_DIR ...)


@dataclass
class VariantResult:
    """One ranking row."""

    name: str
    runs: list[RunInfo]
    finals: list[float]
    ci: MeanCI | None
    best_ci: MeanCI | None
    diverged: list[RunInfo]
    other: list[RunInfo]
    floor: float | None
    tokens_per_s: float | None
    params: int | None
    rank: int | None = None
    vs_best: Welch | None = None
    unigram: float | None = None  # the training split's unigram bits/byte (summary unigram_bpb), None if unknown
    not_learned: int = 0  # completed seeds whose final loss did not learn (normlab.stats.learning): never ranked

    @property
    def gap(self) -> float | None:
        return None if self.ci is None or self.floor is None else self.ci.mean - self.floor

    @property
    def n_seeds(self) -> int:
        return len(self.runs)


@dataclass
class SweepReport:
    sweep_dir: Path
    meta: dict[str, str]
    runs: list[RunInfo]
    variants: list[VariantResult]
    summary: list[str] = field(default_factory=list)
    grid: GridReport | None = None


def _read_json(path: Path) -> Any:
    """A run artifact's JSON, or None when missing or unsafe to trust (``normlab.io.read_json``: a FIFO or device
    in its place, over the size cap, corrupt, nested too deep)."""
    try:
        return read_json(path)
    except NormlabError:
        return None


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _load_artifacts(run: RunInfo, run_dir: Path) -> None:
    sm = _read_json(run_dir / SUMMARY_FILE)
    run.summary = sm if isinstance(sm, dict) else None
    d = _read_json(run_dir / "diagnostics.json")
    run.diagnostics = d if isinstance(d, dict) else None
    x = _read_json(run_dir / "extrapolation.json")
    if isinstance(x, dict) and isinstance(x.get("results"), list):
        rows = [r for r in x["results"] if isinstance(r, dict) and _num(r.get("factor")) and _num(read_bpb(r))]
        run.extrapolation = sorted(rows, key=lambda r: r["factor"]) or None
    c = _read_json(run_dir / "calibration.json")
    if isinstance(c, dict) and any(_num(c.get(k)) for k in ("ece_before", "ece_after", "temperature")):
        run.calibration = c


def load(sweep_dir: str | Path, baseline: str | None = None) -> SweepReport:
    """Read the store and the run directories of ``sweep_dir`` and compute the ranking and the summary.
    ``baseline``: the variant the comparisons use (default: the declared design's, else the sweep's ``baseline:``,
    else its first); a baseline other than the declared one is a question asked after the data: exploratory."""
    sweep_dir = Path(sweep_dir)
    store = Store(sweep_dir / "results.sqlite")
    meta = store.meta()
    rows = store.runs()
    curves = store.curves(finite=True)  # a null (NaN) point is no number to average or plot
    runs = []
    for row in rows:
        info = RunInfo(row, curves.get(row["run_id"], {}))
        _load_artifacts(info, sweep_dir / "runs" / row["run_id"])
        runs.append(info)
    names = list(dict.fromkeys((r.row.get("axes") or {}).get("grid_group") or r.row["variant"] for r in runs))
    if baseline is not None and baseline not in names:  # analyze would fall back to the first variant silently
        raise NormlabError(f"--baseline {baseline!r} is not a variant of {sweep_dir}; variants: {', '.join(names)}")
    question = stored_design(meta)
    if question is None:  # a store written before designs were recorded: the sweep file's keys
        spec = stored_sweep(sweep_dir)
        question = {"declared": False, "baseline": spec.baseline} if spec is not None else None
    why = changed_after_results(meta, rows)
    if (baseline is not None and question is not None and question.get("declared")
            and baseline != question.get("baseline")):
        why = why or f"the baseline {baseline} was chosen when reporting (--baseline), not declared"
    if baseline is None and question is not None:
        baseline = question.get("baseline")
    return from_runs(sweep_dir, meta, runs, baseline, question=question, exploratory=why)


def _read_yaml(path: Path) -> Any:
    """A YAML file through normlab's one strict reader (``normlab.io.read_yaml_file``), or None when it is missing
    or refused."""
    try:
        return read_yaml_file(path, "YAML file")
    except NormlabError:
        return None


def _question(question: dict[str, Any] | None, grid: bool) -> dict[str, Any] | None:
    """A stored design's question, or None (analyze's default: undeclared); a declared grid metric that the runs
    cannot give (a design changed from a grid to one learning rate) falls back to the default."""
    if question is None or not question.get("declared"):
        return None if question is None else {**question, "declared": False,
                                               "primary": "lr_sensitivity" if grid else "final_loss"}
    return question


def unigram_floors(runs: list[RunInfo], sweep_dir: Path) -> None:
    """Fill ``summary["unigram_bpb"]`` of runs trained before normlab recorded it: computed exactly from the
    training split of the run's own corpus (normlab.rundir.readers.run_data, identity-checked; the token cache is
    reused),
    once per distinct corpus and tokenizer. A run whose corpus cannot be read keeps no floor."""
    cache: dict[str, float | None] = {}
    for r in runs:
        if r.summary is None or _num(r.summary.get("unigram_bpb")):
            continue
        d = r.path or sweep_dir / "runs" / r.row["run_id"]
        try:
            info = readers.read_data_info(d)
            if info is None:
                continue
            key = json.dumps([info.get("content_hash"), info.get("tokenizer"), (r.row.get("config") or {}).get("data")],
                             sort_keys=True, default=str)
            if key not in cache:
                cache[key] = readers.run_data(d, readers.open_config(d)).unigram_bpb
        except (NormlabError, OSError, ValueError, KeyError, TypeError):
            continue
        if cache.get(key) is not None:
            r.summary["unigram_bpb"] = cache[key]


def from_runs(sweep_dir: Path, meta: dict[str, str], runs: list[RunInfo], baseline: str | None = None, *,
              question: dict[str, Any] | None = None, exploratory: str | None = None) -> SweepReport:
    """The report of ``runs`` (from a results store, or from run directories: normlab.report.rundirs).
    ``question``: the declared design (normlab.experiments.design), None for none; ``exploratory``: why nothing
    may be decided."""
    order: list[str] = []
    for r in runs:
        if r.row["variant"] not in order:
            order.append(r.row["variant"])
    unigram_floors(runs, sweep_dir)
    variants = [_variant(name, [r for r in runs if r.row["variant"] == name]) for name in order]
    _rank(variants)
    rep = SweepReport(sweep_dir, meta, runs, variants)
    gruns = grid_runs_from_rows([r.row for r in runs], {r.row["run_id"]: r.curves for r in runs},
                                {r.row["run_id"]: r.summary for r in runs})
    grid = len({(g.group, g.lr) for g in gruns}) > len({g.group for g in gruns})
    q = _question(question, grid)
    if q is not None and baseline is not None:
        q = {**q, "baseline": baseline}
    rep.grid = analyze(gruns, baseline, question=q, exploratory=exploratory)
    rep.summary = summarize(rep)
    return rep


def primary_family(sweep_dir: str | Path) -> GridReport:
    """The declared question of the sweep in ``sweep_dir`` answered from its stored per-seed results.

    Returns the GridReport; its ``question`` is the stored design's question (``declared``, ``primary``,
    ``baseline``, ``family``, ``alpha``, ``correction``, ``paired``), ``exploratory`` says why nothing may be decided
    (None when the family is decided), and ``[r for r in rep.paired if r.role == "primary"]`` are the family's
    comparisons (normlab.decide.decisions.PairedRow): ``r.diff`` (mean, half, n, sd, df, raw two-sided ``p``),
    ``r.p_adjusted`` (over the family), ``r.decided`` (adjusted p <= alpha), ``r.verdict`` (lower / higher /
    undecided / not testable / did not learn). Torch-free; reads only the store and the run directories."""
    return load(sweep_dir).grid


def _variant(name: str, runs: list[RunInfo]) -> VariantResult:
    done = [r for r in runs if r.row["status"] == "completed" and _num(r.row["val_bpb"])]
    finals = [r.row["val_bpb"] for r in done]
    bests = [r.row["best_val_bpb"] for r in done if _num(r.row["best_val_bpb"])]
    floors = [r.row["entropy_floor_bpb"] for r in runs if _num(r.row["entropy_floor_bpb"])]
    tps = [r.row["tokens_per_s"] for r in done if _num(r.row["tokens_per_s"])]
    params = [r.row["params"] for r in runs if r.row["params"]]
    unis = [r.summary["unigram_bpb"] for r in runs if r.summary and _num(r.summary.get("unigram_bpb"))]
    uni = mean(unis) if unis else None
    return VariantResult(
        name=name, runs=runs, finals=finals, ci=mean_ci(finals) if finals else None,
        best_ci=mean_ci(bests) if bests else None,
        diverged=[r for r in runs if r.row["status"] == "diverged"],
        other=[r for r in runs if r not in done and r.row["status"] != "diverged"],  # no final result: reported
        floor=floors[0] if floors else None, tokens_per_s=mean(tps) if tps else None,
        params=params[0] if params else None, unigram=uni,
        not_learned=sum(1 for x in finals if did_not_learn(x, uni)),
    )


def _rank(variants: list[VariantResult]) -> None:
    """Rank by mean final loss; a variant with a seed that did not learn (normlab.stats.learning) is never ranked."""
    variants.sort(key=lambda v: (v.ci is None or v.not_learned > 0, v.ci.mean if v.ci else 0.0))
    for i, v in enumerate(v for v in variants if v.ci is not None and not v.not_learned):
        v.rank = i + 1
    if variants and variants[0].rank is not None:
        best = variants[0]
        for v in variants[1:]:
            if v.rank is not None:
                v.vs_best = welch(v.finals, best.finals)


def _fmt(x: float) -> str:
    return f"{x:.4f}"


def ci_text(ci: MeanCI | None) -> str:
    if ci is None:
        return "–"
    return f"{ci.mean:.4f} ± {ci.half:.4f}" if ci.half is not None else f"{ci.mean:.4f} (n=1)"


def overlap(a: MeanCI, b: MeanCI) -> bool | None:
    if a.half is None or b.half is None:
        return None
    return a.low <= b.high and b.low <= a.high


def _p(p: float) -> str:
    return "p < 0.001" if p < 0.001 else f"p = {p:.3f}" if p < 0.1 else f"p = {p:.2f}"


def summarize(rep: SweepReport) -> list[str]:
    """Sentences that state only what the stored numbers show (a learning-rate grid leads with its own)."""
    warn = [f"{r.row['run_id']}: {r.summary['eval_mode_warning']['message']}." for r in rep.runs
            if r.summary and isinstance(r.summary.get("eval_mode_warning"), dict)
            and isinstance(r.summary["eval_mode_warning"].get("message"), str)]
    if rep.grid is not None and rep.grid.is_grid:
        counts: dict[str, int] = {}
        for r in rep.runs:
            counts[r.row["status"]] = counts.get(r.row["status"], 0) + 1
        return lrsection.summary(rep.grid, counts) + warn
    return _summarize_cells(rep) + (lrsection.paired_summary(rep.grid) if rep.grid else []) + warn


def _summarize_cells(rep: SweepReport) -> list[str]:
    out: list[str] = []
    vs = rep.variants
    runs = rep.runs
    counts: dict[str, int] = {}
    for r in runs:
        counts[r.row["status"]] = counts.get(r.row["status"], 0) + 1
    seeds = sorted({r.row["seed"] for r in runs})
    status_txt = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    out.append(f"{len(vs)} variants × {len(seeds)} seeds = {len(runs)} runs ({status_txt}).")
    ranked = [v for v in vs if v.rank is not None]
    dnl = [v for v in vs if v.not_learned]
    if dnl:
        out.append("Did not learn (final loss at or above the unigram level minus "
                   f"{DID_NOT_LEARN_MARGIN:g} bits/byte; never ranked): " + "; ".join(
                       f"{v.name} in {v.not_learned} of {len(v.finals)} seeds ({ci_text(v.ci)} against the unigram "
                       f"{v.unigram:.4f})" for v in dnl) + ".")
    if not ranked:
        out.append("No run has completed yet, so nothing is ranked." if not dnl else
                   "No variant learned in every seed, so nothing is ranked.")
        return out
    best = ranked[0]
    ns = sorted({v.ci.n for v in ranked})
    out.append(f"Lowest mean final validation bits/byte: {best.name}, {ci_text(best.ci)} "
               f"(mean ± 95% CI half-width over {best.ci.n} seed{'s' if best.ci.n > 1 else ''}).")
    items = []
    for v in ranked[1:]:
        d = welch_diff(v.finals, best.finals)
        est = f"{d.mean:+.4f} ± {d.half:.4f}" if d.half is not None else f"{d.mean:+.4f}"
        items.append(f"{v.name} {est}" + (f" (Welch p = {v.vs_best.p:.3g}, unadjusted)" if v.vs_best else ""))
    if items:
        out.append(f"Differences from {best.name}, exploratory (the lowest mean is chosen by the data; Welch 95% "
                   "intervals, no verdict): " + "; ".join(items) + ".")
    for v in vs:
        if v.other:  # never drop a seed silently: say which runs have no final result
            ids = ", ".join(f"{r.row['run_id']} ({r.row['status']})" for r in v.other)
            out.append(f"{v.name}: {len(v.other)} of {v.n_seeds} seeds have no final result ({ids}); its row uses "
                       "the others; re-run the same compare command to finish them.")
        if v.diverged:
            steps = ", ".join(str(r.row["step"]) for r in v.diverged)
            at = f"step{'s' if len(v.diverged) > 1 else ''} {steps}"
            out.append(f"{v.name} diverged in {len(v.diverged)} of {v.n_seeds} seeds (at {at}).")
    if best.floor is not None:
        out.append(f"The corpus's entropy floor is {best.floor:.4f} bits/byte; {best.name} is {best.gap:.4f} above it.")
    if ns and max(ns) >= 2:
        qs = ", ".join(f"t = {t_ppf(0.975, n - 1):.2f} for n = {n}" for n in ns if n >= 2)
        out.append(f"Interval half-widths use the Student-t quantile ({qs}); with few seeds they are wide, "
                   "so add seeds to separate close variants.")
    tps = [(v.tokens_per_s, v.name) for v in ranked if v.tokens_per_s]
    if len(tps) >= 2:
        lo, hi = min(tps), max(tps)
        workers = rep.meta.get("workers")
        how = f" with {workers} runs in parallel" if workers else ""
        out.append(f"Training throughput ranged from {lo[0]:,.0f} tokens/s ({lo[1]}) to {hi[0]:,.0f} tokens/s "
                   f"({hi[1]}), wall-clock per run{how}; other load on the machine changes these numbers.")
    return out


# -- diagnostics, read defensively ----------------------------------------------------------------------------
# diagnostics.json layout (normlab diagnose, docs/diagnostics.md): variance{var, rms, log_var_slope},
# massive{blocks[{ratio}], max_ratio}, sinks{sink_rate, sink_rate_per_layer, first_token_importance_mean},
# layer_effectiveness{blocks[{angular_distance, skip_loss_increase}]}. Training-time: diag/resid_var/<l>,
# diag/grad_norm/{attn,mlp,norm}/<l> in metrics.jsonl. Anything missing or oddly shaped is skipped.


def _get(obj: Any, *path: str) -> Any:
    for p in path:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(p)
    return obj


def _numlist(xs: Any) -> list[float] | None:
    if isinstance(xs, list) and len(xs) >= 2 and all(_num(x) for x in xs):
        return [float(x) for x in xs]
    return None


def _field_list(blocks: Any, key: str) -> list[float] | None:
    if isinstance(blocks, list) and blocks and all(isinstance(b, dict) for b in blocks):
        return _numlist([b.get(key) for b in blocks])
    return None


def _train_series(curves: dict[str, Any], prefixes: list[str]) -> list[float] | None:
    """Per-block series from ``<prefix><l>`` curve keys (root-sum-square over prefixes), averaged over the last half
    of the diagnostic steps that every block recorded (the value logged last at a step counts)."""
    per_prefix = []
    for prefix in prefixes:
        keys = {int(k[len(prefix):]): pts for k, pts in curves.items()
                if k.startswith(prefix) and k[len(prefix):].isdigit()}
        if len(keys) < 2:
            continue
        per_prefix.append([by_step(keys[b]) for b in sorted(keys)])
    if not per_prefix:
        return None
    steps = per_prefix[0][0][0]
    for cols in per_prefix:
        for s, _ in cols:
            steps = np.intersect1d(steps, s, assume_unique=True)
    if not len(steps):
        return None
    keep = steps[steps >= steps[-1] / 2]
    keep = keep if len(keep) else steps[-1:]
    depth = min(len(cols) for cols in per_prefix)
    out = []
    for b in range(depth):
        total = np.zeros(len(keep))
        for cols in per_prefix:
            s, v = cols[b]
            total = total + v[np.searchsorted(s, keep)] ** 2  # in prefix order, as a Python sum would add them
        out.append(mean(np.sqrt(total).tolist()))
    return out


# (title, x label, x offset (0: first value = embeddings), extractor, log scale)
PROFILES: dict[str, tuple[str, str, int]] = {
    "variance": ("Residual-stream variance vs depth", "depth (0 = embeddings, l = after block l)", 0),
    "grad": ("Per-block gradient norm (attention + MLP + norm parameters)", "block", 1),
    "massive": ("Massive activations: top |h| / median |h| per block", "block", 1),
    "sink": ("Attention sink rate per layer (first-token importance > threshold)", "layer", 1),
    "angular": ("Layer effectiveness: angular distance between block input and output", "block", 1),
    "skip": ("Layer effectiveness: validation loss increase when the block is skipped", "block", 1),
}
SCALARS = {
    "log-variance slope / block": ("variance", "log_var_slope"),
    "max massive ratio": ("massive", "max_ratio"),
    "sink rate": ("sinks", "sink_rate"),
    "first-token importance": ("sinks", "first_token_importance_mean"),
}


def run_profiles(run: RunInfo) -> dict[str, list[tuple[list[float], str]]]:
    """``{category: [(values, source), ...]}`` for one run, preferred source first (``diagnose``, then ``training``)."""
    d = run.diagnostics or {}
    cands: dict[str, list[tuple[list[float] | None, str]]] = {
        "variance": [(_numlist(_get(d, "variance", "var")), "diagnose")],
        "massive": [(_field_list(_get(d, "massive", "blocks"), "ratio"), "diagnose")],
        "sink": [(_numlist(_get(d, "sinks", "sink_rate_per_layer")), "diagnose")],
        "angular": [(_field_list(_get(d, "layer_effectiveness", "blocks"), "angular_distance"), "diagnose")],
        "skip": [(_field_list(_get(d, "layer_effectiveness", "blocks"), "skip_loss_increase"), "diagnose")],
        "grad": [(_train_series(run.curves, list(GRAD_NORM_PREFIXES)), "training")],  # normlab.names.block_grad_norms
    }
    blocks = _train_series(run.curves, ["diag/resid_var/"])
    embed = run.curves.get("diag/embed_var")
    if blocks is not None and embed:  # same indexing as diagnose: 0 = embeddings, l = after block l
        cands["variance"].append(([_last_half_mean(embed)] + blocks, "training"))
    return {k: [(v, src) for v, src in c if v is not None] for k, c in cands.items() if any(v for v, _ in c)}


def _last_half_mean(pts: list[tuple[int, float]]) -> float:
    last = pts[-1][0]
    return mean(v for s, v in pts if s >= last / 2)


@dataclass
class DiagSection:
    """One diagnostics plot: ``series[variant] = mean per-depth values over seeds``."""

    category: str
    title: str
    xlabel: str
    x0: int
    source: str
    series: dict[str, list[float]]


def diagnostics(rep: SweepReport) -> tuple[list[DiagSection], dict[str, dict[str, float]]]:
    """Per-depth plots (a category is shown when any run has it) and a table of scalar diagnostics per variant."""
    sections: list[DiagSection] = []
    profiles = {r.row["run_id"]: run_profiles(r) for r in rep.runs}
    for cat, (title, xlabel, x0) in PROFILES.items():
        series, sources = {}, set()
        for v in rep.variants:
            got = [profiles[r.row["run_id"]].get(cat, []) for r in v.runs]
            avail = [src for g in got for _, src in g]
            if not avail:
                continue
            src = "diagnose" if "diagnose" in avail else avail[0]  # one source per variant: never mix them
            vals = [x for g in got for x, s in g if s == src]
            n = min(len(x) for x in vals)
            series[v.name] = [mean(x[i] for x in vals) for i in range(n)]
            sources.add(f"{src} ({len(vals)} of {len(v.runs)} runs)" if len(vals) < len(v.runs) else src)
        if series:
            sections.append(DiagSection(cat, title, xlabel, x0, "; ".join(sorted(sources)), series))
    table: dict[str, dict[str, float]] = {}
    for label, path in SCALARS.items():
        for v in rep.variants:
            xs = [_get(r.diagnostics, *path) for r in v.runs if r.diagnostics]
            xs = [float(x) for x in xs if _num(x)]
            if xs:
                table.setdefault(label, {})[v.name] = mean(xs)

    table.update(robustness_rows(rep))  # W4 / W4+Hadamard (normlab report --quantize)
    spikes = {}
    for v in rep.variants:
        counts = [_get(r.summary, "loss_spikes", "count") for r in v.runs if r.summary]
        counts = [c for c in counts if _num(c)]
        if counts:
            spikes[v.name] = float(sum(counts))
    if spikes and any(spikes.values()):
        table["loss spikes (all seeds)"] = spikes
    return sections, table
