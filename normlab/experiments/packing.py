"""Sweep packing: how many worker processes x torch threads give a sweep the most tokens/s on this machine.

A small model trains fastest per core with one thread (a thread pool's fork/join costs more than the matmuls it
splits), a large one gains from several; which wins at a sweep's shape is measured, not guessed. For each packing
``workers x threads = cores`` (e.g. 2 x 1 and 1 x 2 on 2 cores, at most one worker per run) ``measure_packing``
starts ``workers`` probe processes at once, each with ``threads`` threads, each timing full training steps (forward,
backward, AdamW) of the sweep's first run's model at its batch size and precision, and sums their tokens/s. The best
packing is cached per machine and shape in ``<cache dir>/packing_probe.json``.

    python -m normlab.experiments.packing PROBE_JSON   (one probe process; prints {"tokens_per_s": ...})
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F

from normlab.config import TrainConfig, stored_config
from normlab.errors import NormlabError
from normlab.io import read_json, write_json
from normlab.model import ModelConfig, build_model
from normlab.train import precision as P
from normlab.train.optim import build_optimizer
from normlab.train.precision import cpu_name

PROBE_S = 3.0  # seconds of timed steps per probe process


def candidates(cores: int, n_runs: int) -> list[tuple[int, int]]:
    """``(workers, threads)`` with ``workers * threads == cores`` and ``workers <= n_runs``, most workers first."""
    return [(w, cores // w) for w in range(cores, 0, -1) if cores % w == 0 and w <= max(n_runs, 1)]


def _probe_spec(cfg: dict[str, Any]) -> dict[str, Any]:
    c = stored_config(json.loads(json.dumps(cfg)), "a planned run's config")
    return {"model": {k: v for k, v in json.loads(json.dumps(c.to_dict()["model"])).items()},
            "batch_size": c.train.batch_size, "precision": c.train.precision, "seconds": PROBE_S}


def _key(probe: dict[str, Any], cores: int) -> str:
    return json.dumps({"cpu": cpu_name(), "cores": cores, "torch": torch.__version__, **probe}, sort_keys=True)


def _env(threads: int) -> dict[str, str]:
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update({"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)})
    return env


def measure_packing(probe: dict[str, Any], packings: list[tuple[int, int]]) -> dict[str, float]:
    """``{"WxT": summed tokens/s}``: for each packing, ``W`` probe processes at once with ``T`` threads each."""
    out = {}
    for w, t in packings:
        procs = [subprocess.Popen([sys.executable, "-m", "normlab.experiments.packing", json.dumps(probe)],
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=_env(t))
                 for _ in range(w)]
        total = 0.0
        for p in procs:
            stdout, _ = p.communicate()
            try:
                total += float(json.loads(stdout.strip().splitlines()[-1])["tokens_per_s"])
            except (ValueError, IndexError, KeyError):
                total = float("nan")
        out[f"{w}x{t}"] = total
    return out


def choose_packing(cfg: dict[str, Any], n_runs: int, cores: int, cache_dir: Path,
                   log: Callable[[str], None]) -> tuple[int, int, dict[str, float]]:
    """The measured best ``(workers, threads, {packing: tokens/s})`` for a sweep whose first run is ``cfg``."""
    packings = candidates(cores, n_runs)
    if len(packings) == 1:
        w, t = packings[0]
        return w, t, {}
    probe = _probe_spec(cfg)
    path = Path(cache_dir) / "packing_probe.json"
    key = _key(probe, cores)
    try:  # the bounded reader; a damaged cache (not an object, too deep, a huge number) is measured again
        cache = read_json(path, "packing cache") if path.exists() else {}
    except NormlabError:
        cache = {}
    cache = cache if isinstance(cache, dict) else {}
    measured = {k: v for k, v in cache.get(key, {}).items() if k in {f"{w}x{t}" for w, t in packings}}
    if len(measured) < len(packings):
        log(f"measuring sweep packing ({', '.join(f'{w} workers x {t} threads' for w, t in packings)}) at this "
            f"sweep's shape, {PROBE_S:.0f} s each ...")
        measured = measure_packing(probe, packings)
        cache[key] = {**cache.get(key, {}), **measured}
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_json(path, cache)
        except OSError:
            pass
    ok = {k: v for k, v in measured.items() if v == v}
    if not ok:
        w = min(cores, n_runs)
        return w, max(1, cores // w), measured
    best = max(ok, key=ok.get)
    w, t = (int(v) for v in best.split("x"))
    return w, t, measured


def _probe(probe: dict[str, Any]) -> float:
    """Tokens/s of full training steps of ``probe``'s model (after two warm-up steps)."""
    threads = int(os.environ.get("OMP_NUM_THREADS", "1"))
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    mc = ModelConfig(**probe["model"])
    prec = probe["precision"] if probe["precision"] != "auto" else ("bf16" if P.fast_bf16("cpu")[0] else "fp32")
    model = P.prepare_model(build_model(mc), prec)
    opt, _ = build_optimizer(model, TrainConfig())
    x = torch.randint(mc.vocab_size, (probe["batch_size"], mc.context + 1))
    n, t0, warmup = 0, None, 2
    while t0 is None or time.perf_counter() - t0 < probe["seconds"]:
        with P.autocast("cpu", prec):
            logits = model(x[:, :-1])
        F.cross_entropy(logits.float().flatten(0, 1), x[:, 1:].flatten()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if t0 is None:  # warm-up steps are not timed; the clock starts once, after them
            warmup -= 1
            if warmup == 0:
                t0 = time.perf_counter()
        else:
            n += 1
    return n * x.shape[0] * mc.context / (time.perf_counter() - t0)


if __name__ == "__main__":
    print(json.dumps({"tokens_per_s": _probe(json.loads(sys.argv[1]))}))
