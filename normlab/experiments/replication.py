"""A replication of a declared sweep on another data source (``replicate:`` in a sweep file, ``compare
--replicate-on``, ``normlab.compare``): the same declared design on the other source, on its own seed block, checked
before anything trains. The CLI and the Python API both build it here; the replication's verdicts are made by the
decision layer (normlab.decide.verdicts.replication) and assembled by normlab.report.sequential.
"""

from __future__ import annotations

from typing import Any

from normlab.config import stored_config
from normlab.errors import NormlabError
from normlab.experiments.sweep import parse_sweep, replication_seeds, slug
from normlab.rundir.readers import load_data


def replication_sweep(sweep: Any, source: str) -> Any:
    """The same declared design on data source ``source``: ``data.source`` set for every run, named
    ``<name>-on-<source>``, on the replication's own seed block (``replicate_seeds``, else the seeds shifted by
    REPLICATION_SEED_OFFSET), no ``replicate`` key (normlab.decide.plan)."""
    spec = sweep.resolved
    setters = [f"variant '{name}'" for name, vset in spec.variants if "data.source" in vset]
    if "data.source" in spec.axes or setters:
        raise NormlabError(f"cannot replicate sweep '{sweep.name}' on another source: "
                           f"{setters[0] if setters else 'an axis'} sets data.source")
    if spec.base.get("data", {}).get("source") == source and "data.source" not in spec.overrides:
        raise NormlabError(f"sweep '{sweep.name}' already runs on {source}; replicate on another source")
    raw = {k: v for k, v in sweep.spec.items() if k not in ("replicate", "replicate_seeds")}
    raw.update(name=f"{sweep.name}-on-{slug(source)}", set={**spec.overrides, "data.source": source},
               seeds=replication_seeds(spec))  # a fresh seed block: the design's own seeds confirm nothing twice
    return parse_sweep(raw, source=f"replication of '{sweep.name}' on {source}")


def check_replication_data(sweep: Any) -> None:
    """Load (and cache) every distinct corpus of a replication ``sweep`` now, as its runs would, so a source that
    cannot be read (``/dev/zero``, a missing path, an empty or too short corpus) is a one-line error before the main
    sweep trains, not after it; the replication then finds its token caches built."""
    seen = set()
    for r in sweep.runs:
        key = (repr(sorted(r.config["data"].items())), r.config["model"]["context"])
        if key not in seen:
            seen.add(key)
            load_data(stored_config(r.config, f"replication run {r.run_id}"))


def replica_dir(source: str) -> str:
    """A replication's directory inside the original sweep directory (relative)."""
    return f"replication/{slug(source)}"
