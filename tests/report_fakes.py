"""A stored learning-rate sweep with chosen final losses, without training (tests of the report's decisions)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from normlab.experiments.design import record_design
from normlab.experiments.sweepdir import registration
from normlab.experiments.store import Store
from normlab.experiments.sweep import dump_spec, parse_sweep
from normlab.experiments.worker import record

INIT = 8.0  # validation bits/byte at initialisation of every run
UNIGRAM = 4.671  # the training split's unigram entropy recorded in every summary.json


def fake_grid(d: Path, variants: list[str], seeds: list[int], lrs: list[float],
              final: Callable[[str, int, float], float | None], *, unigram: float | None = UNIGRAM,
              **question) -> Path:
    """A sweep dir whose run (variant, seed, lr) ends at ``final(variant, seed, lr)`` (None: diverged)."""
    raw = {"name": "fake", "base": "tiny", "lr_grid": lrs, "seeds": seeds,
           "variants": [{"name": v, "set": {"model.width": 32 + 8 * i}} for i, v in enumerate(variants)], **question}
    sweep = parse_sweep(raw)
    store = Store(d / "results.sqlite")
    store.create(sweep.name, sweep.hash)
    record_design(store, sweep.design())
    store.register(registration(sweep))
    (d / "sweep.yaml").write_text(dump_spec(sweep))
    for r in sweep.runs:
        lr = r.axes["train.lr"]
        v = final(r.axes["variant"], r.seed, lr)
        run_dir = d / "runs" / r.run_id
        run_dir.mkdir(parents=True)
        recs = [{"step": 0, "init_val_bpb": INIT}] + ([{"step": 10, "val_bpb": v}] if v is not None else [])
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in recs))
        summary = {"status": "completed" if v is not None else "diverged", "step": 10 if v is not None else 4,
                   "steps": 10, "val_bpb": v, "best_val_bpb": v, "init_val_bpb": INIT, "params": 1000,
                   **({"unigram_bpb": unigram} if unigram is not None else {})}
        (run_dir / "summary.json").write_text(json.dumps(summary))
        record(store, d, r.run_id, summary, peak_mem_mb=1.0)
    return d
