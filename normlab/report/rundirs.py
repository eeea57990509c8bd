"""Reports for any run directories: ``normlab report RUN_DIR [RUN_DIR ...]``.

Each argument is a run directory (``config.yaml`` + ``summary.json`` + ``metrics.jsonl``, from ``normlab train``, a
sweep, or the claims suite) or a whole sweep directory (all its runs). Runs trained separately are grouped into
variants by their configs: two runs whose configs differ only in ``seed`` are seeds of one variant, runs that also
differ in ``train.lr`` are points of its learning-rate grid (bookkeeping keys such as ``train.threads`` or
``train.log_every`` do not count); a variant is named by its run directories (one run's name, or what its runs'
names share), and the config keys that differ between variants are kept as its overrides. Runs on more than one
corpus (``data.source``) are refused: their bits/byte cannot be paired or ranked. A run inside a
sweep directory keeps the sweep's variant label. The result is the same report as a sweep's (learning-rate
section, paired differences, ranking, curves, diagnostics), written to ``--out``; a single run's directory gets
its own page there, with its full training and validation curves (every logged step).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

from normlab.errors import NormlabError
from normlab.experiments.store import Store
from normlab.io import read_json, read_yaml_file
from normlab.report.analysis import RunInfo, SweepReport, _load_artifacts, from_runs
from normlab.rundir.files import CONFIG_FILE, METRICS_FILE
from normlab.rundir.readers import open_config, read_curves, read_summary

IGNORED = ("seed", "train.lr", "train.threads", "train.track", "train.log_every", "train.checkpoint_every",
           "train.keep_checkpoints", "data.cache_dir", "train.eval_every")


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict) and not prefix:
            out.update(_flat(v, f"{k}."))
        else:
            out[f"{prefix}{k}"] = json.dumps(v, sort_keys=True) if isinstance(v, (dict, list)) else v
    return out


def _short(key: str, keys: list[str]) -> str:
    parts = key.split(".")
    for n in range(1, len(parts) + 1):
        cand = ".".join(parts[-n:])
        if sum(1 for k in keys if k == cand or k.endswith(f".{cand}")) == 1:
            return cand
    return key


def _summary_row(run_dir: Path, rid: str, position: int, cfg: dict[str, Any]) -> dict[str, Any]:
    s = read_summary(run_dir) or {}  # not a JSON object (a list): one line naming the file
    status = s.get("status") if isinstance(s.get("status"), str) and s.get("status") else "interrupted"

    def num(k: str) -> float | None:
        v = s.get(k)
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None

    def integer(k: str) -> int | None:
        v = s.get(k)
        return v if isinstance(v, int) and not isinstance(v, bool) else None

    return {"run_id": rid, "position": position, "variant": "", "seed": int(cfg.get("seed", 0)), "config_hash": "",
            "axes": {}, "overrides": {}, "config": cfg, "status": status, "step": integer("step"),
            "steps": integer("steps"), "val_bpb": num("val_bpb") if status == "completed" else None,
            "best_val_bpb": num("best_val_bpb"), "final_val_loss": num("val_loss"), "train_loss": num("train_loss"),
            "entropy_floor_bpb": num("entropy_floor_bpb"), "tokens_per_s": num("tokens_per_s"),
            "wall_s": num("elapsed_s"), "peak_mem_mb": None, "params": integer("params"), "train_calls": 1,
            "error": None}


def _read_json(path: Path) -> Any:
    try:  # a regular file under the size cap; None when missing or refused
        return read_json(path)
    except NormlabError:
        return None


def _from_sweep(d: Path) -> list[tuple[RunInfo, Path]]:
    store = Store(d / "results.sqlite")
    curves = store.curves(finite=True)  # a null (NaN) point is no number to average or plot
    out = []
    for row in store.runs():
        info = RunInfo(dict(row), curves.get(row["run_id"], {}))
        out.append((info, d / "runs" / row["run_id"]))
    return out


def collect(paths: list[str | Path]) -> list[tuple[RunInfo, Path]]:
    """RunInfos (with their directories) of run or sweep directories; a bad path is a one-line error."""
    runs: list[tuple[RunInfo, Path]] = []
    loose: list[tuple[RunInfo, Path, dict[str, Any]]] = []
    for p in map(Path, paths):
        if not p.is_dir():
            raise NormlabError(f"{p} does not exist or is not a directory (give run or sweep directories)")
        if (p / "results.sqlite").is_file():
            runs += _from_sweep(p)
            continue
        # a config.yaml that is there but refused (not YAML, a 5001-digit integer, ...) says why, in one line
        cfg = read_yaml_file(p / CONFIG_FILE, "config") if os.path.lexists(p / CONFIG_FILE) else None
        if not isinstance(cfg, dict):
            raise NormlabError(f"{p} is neither a normlab run directory (no readable config.yaml) nor a sweep "
                               "directory (no results.sqlite)")
        sweep_dir = p.parent.parent
        if (sweep_dir / "results.sqlite").is_file() and p.parent.name == "runs":
            match = [x for x in _from_sweep(sweep_dir) if x[0].row["run_id"] == p.name]
            if match:
                runs += match
                continue
        # the one validated reader (every section; each key's type and range; one line if not), and its resolved
        # values: what eval, resume and the sweep read for this run, not the raw file
        cfg = open_config(p).to_dict()
        # streamed into columns (16 bytes a point): a metrics.jsonl near its 256 MiB cap fits in memory
        info = RunInfo(_summary_row(p, p.name, 0, cfg), read_curves(p / METRICS_FILE))  # type: ignore[arg-type]
        for pts in info.curves.values():
            pts.sort()
        loose.append((info, p, cfg))
    if loose:
        flats = [{k: v for k, v in _flat(cfg).items() if k not in IGNORED} for _, _, cfg in loose]
        keys = sorted({k for f in flats for k in f})
        differ = [k for k in keys if len({json.dumps(f.get(k), default=str) for f in flats}) > 1]
        groups: dict[str, list[Path]] = {}
        for (_, p, _), f in zip(loose, flats):
            groups.setdefault(json.dumps(f, sort_keys=True, default=str), []).append(p)
        names = _group_names(list(groups.values()))
        by_key = dict(zip(groups, names))
        labels = [by_key[json.dumps(f, sort_keys=True, default=str)] for f in flats]
        for (info, p, cfg), f, label in zip(loose, flats, labels):
            lrs = {c["train"]["lr"] for (_, _, c), lab in zip(loose, labels) if lab == label}
            lr = cfg.get("train", {}).get("lr")
            info.row["variant"] = f"{label} · lr={lr:g}" if len(lrs) > 1 else label
            info.row["axes"] = {"grid_group": label}
            info.row["overrides"] = {k: f.get(k) for k in differ}
            runs.append((info, p))
    _one_corpus(runs)
    seen: dict[str, int] = {}
    for i, (info, p) in enumerate(runs):
        rid = info.row["run_id"]
        if rid in seen:
            seen[rid] += 1
            info.row["run_id"] = f"{rid}-{seen[rid]}"
        else:
            seen[rid] = 1
        info.row["position"] = i
    for info, p in runs:
        _load_artifacts(info, p)
        info.path = p
    return runs


def _group_names(groups: list[list[Path]]) -> list[str]:
    """A variant's name from its run directories' names: one run's name, or what the names of its seeds (and
    learning rates) share (``peri-s0``, ``peri-s1`` -> ``peri``), else the first name and how many more; a name
    two variants would share gets its parent folder (``a/tiny``, ``b/tiny``)."""
    def name(paths: list[Path], full: bool) -> str:
        parts = [f"{p.parent.name}/{p.name}" if full else p.name for p in paths]
        if len(parts) == 1:
            return parts[0]
        common = os.path.commonprefix(parts)
        common = re.sub(r"[-_. ]*(?:s|seed|lr)?[-_. =]*$", "", common)
        return common or f"{parts[0]} (+{len(parts) - 1} runs)"

    out = [name(g, False) for g in groups]
    return [name(g, True) if out.count(n) > 1 else n for g, n in zip(groups, out)]


def _one_corpus(runs: list[tuple[RunInfo, Path]]) -> None:
    """Refuse runs on more than one corpus (``data.source``): their bits/byte measure different text, so no paired
    difference or ranking between them means anything."""
    corpora: dict[str, list[str]] = {}
    for info, p in runs:
        source = str((info.row.get("config") or {}).get("data", {}).get("source"))
        corpora.setdefault(source, []).append(p.name)
    if len(corpora) > 1:
        listing = "; ".join(f"{src}: {', '.join(ds[:3])}{' ...' if len(ds) > 3 else ''}"
                            for src, ds in corpora.items())
        raise NormlabError(f"these runs are on {len(corpora)} corpora ({listing}); bits/byte on different corpora "
                           "cannot be paired or ranked: report each corpus's runs separately")


def default_out(paths: list[str | Path]) -> Path:
    """A single run directory reports into itself; several into ``runs/report-<hash of the paths>``."""
    if len(paths) == 1 and not (Path(paths[0]) / "results.sqlite").is_file():
        return Path(paths[0])
    h = hashlib.sha256("\n".join(sorted(str(Path(p).resolve()) for p in paths)).encode()).hexdigest()[:8]
    return Path("runs") / f"report-{h}"


def load_dirs(paths: list[str | Path], out: Path, baseline: str | None = None) -> SweepReport:
    runs = collect(paths)
    if not runs:
        raise NormlabError("no runs found in " + ", ".join(map(str, paths)))
    names = list(dict.fromkeys(r.row["variant"] for r, _ in runs))
    if baseline is not None and baseline not in names:
        raise NormlabError(f"--baseline {baseline!r} is not a variant of these runs; variants: {', '.join(names)}")
    title = ", ".join(Path(p).name for p in paths[:3]) + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")
    meta = {"sweep_name": title, "sweep_hash": "-", "title": f"normlab report: {title}"}
    return from_runs(out, meta, [r for r, _ in runs], baseline)
