"""Whole-loop windows through the ``normlab train`` command itself, for benchmarks/nanogpt_speed.py.

Each window is one fresh ``python -m normlab train`` process, so the OpenMP wait policy and the ``auto`` thread
count are what the command decides at its start (normlab.train.threads: idle -> a bounded spin and every usable
core, contended -> passive and fewer threads), exactly as a user's run gets them. The environment is the user's
without ``OMP_*`` / ``GOMP_*`` / ``NORMLAB_*`` (nothing decided for the command); the rate is read the way
``nanogpt_speed.loop_row`` reads it (median of the loop's ``tokens_per_s`` records, the first dropped), and what
the run recorded (``threads``, ``threads_reason``) is kept per window, so a report can say which policy it ran under.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
LOOP_LR = 6e-4  # nanoGPT train.py's learning rate: both loops train stably at it (normlab's 3e-3 diverges at S here)
LOOP_LOG = 10  # normlab's log interval in the whole-loop rows: tokens/s per 10 steps, the first interval dropped


def loop_config(shape: Any, cache: Path) -> dict:
    """The whole-loop rows' config: normlab's defaults at this shape, nanoGPT's lr, the tiny preset's corpus,
    evaluation and checkpoints only at the end."""
    return {"data": {"source": "synthetic:markov?order=2&alphabet=16&length=300000&seed=0", "cache_dir": str(cache)},
            "model": {"depth": shape.depth, "width": shape.width, "heads": shape.heads, "context": shape.context},
            "train": {"batch_size": shape.batch, "log_every": LOOP_LOG, "lr": LOOP_LR, "eval_every": 10**6,
                      "eval_batches": 1, "checkpoint_every": 10**6}}


def command_env(user_env: dict[str, str]) -> dict[str, str]:
    """The user's environment less what would decide the policy or threads for the command."""
    env = {k: v for k, v in user_env.items() if not k.startswith(("OMP_", "GOMP_", "NORMLAB_", "MKL_NUM"))}
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def policy_of(reason: str) -> str:
    """A short name of the plan in a run's ``threads_reason``: ``spin (idle)``, ``passive (contended)``, or the
    user's variable."""
    at = [i for i in (reason.find("OMP_WAIT_POLICY="), reason.find("GOMP_SPINCOUNT=")) if i >= 0]
    note = reason[min(at):] if at else reason  # the plan's account: the last part of threads_reason
    setting = note.split(" ", 1)[0].rstrip(",")
    state = "idle" if "idle" in note else "contended" if "contended" in note else "?"
    if "from the environment" in note:
        return f"{setting} (the user's)"
    return f"{'spin' if setting.startswith('GOMP_SPINCOUNT') else 'passive'}, {setting} ({state})"


def command_loop(config: dict[str, Any], workdir: Path, user_env: dict[str, str], threads: str, log_every: int,
                 tag: str) -> tuple[Callable[[int], float], list[dict[str, Any]]]:
    """``(run, records)``: ``run(steps)`` trains ``config`` with ``train.threads=threads`` through the command in a
    fresh process and returns its tokens/s; ``records`` gets ``{"threads", "policy", "reason"}`` per run."""
    workdir.mkdir(parents=True, exist_ok=True)
    cfg_file = workdir / f"{tag}.yaml"
    cfg_file.write_text(yaml.safe_dump(config, sort_keys=False))
    records: list[dict[str, Any]] = []

    def run(steps: int) -> float:
        steps = max(steps, 3 * log_every)
        out = workdir / f"{tag}-{len(records)}"
        argv = [sys.executable, "-m", "normlab", "train", str(cfg_file), "--out", str(out),
                "--set", f"train.steps={steps}", "--set", f"train.threads={threads}"]
        res = subprocess.run(argv, env=command_env(user_env), capture_output=True, text=True, timeout=1800)
        if res.returncode != 0:
            raise RuntimeError(f"normlab train exited {res.returncode}: {res.stderr.strip().splitlines()[-1:]}")
        summary = json.loads((out / "summary.json").read_text())
        if summary.get("status") != "completed":
            raise RuntimeError(f"the run ended {summary.get('status')}: its rate is not a loop's")
        recs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        rates = [float(r["tokens_per_s"]) for r in recs if "tokens_per_s" in r and r.get("step", 0) % log_every == 0]
        reason = str(summary.get("threads_reason", ""))
        records.append({"threads": summary.get("threads"), "policy": policy_of(reason), "reason": reason})
        return statistics.median(rates[1:] or rates)

    return run, records


def ran_under(records: list[dict[str, Any]]) -> str:
    """``"2 threads, spin, GOMP_SPINCOUNT=30000 (idle) in 5 of 5 runs"``: what the windows ran under, most common
    first."""
    counts: dict[str, int] = {}
    for r in records:
        key = f"{r['threads']} thread(s), {r['policy']}"
        counts[key] = counts.get(key, 0) + 1
    return "; ".join(f"{k} in {n} of {len(records)} runs" for k, n in sorted(counts.items(), key=lambda kv: -kv[1]))


def render_policy(info: dict[str, Any], done: list[tuple[Any, dict[str, Any]]]) -> str:
    """docs/benchmarks.md's ``nanogpt_policy`` section: per shape, the command rows of ``nanogpt_speed.policy_rows``,
    each with the threads and the wait policy its runs recorded."""
    pct = (lambda v: "not reported" if v is None else f"{v:.0f}%")
    rate = (lambda v: "not measured" if v is None else f"{v:,.0f} tokens/s")
    L = ["<!-- nanogpt_policy:start -->", "## `normlab train` as a command: wait policy and threads, idle and busy", "",
         f"`{info['command']}` -- {info['date']}, {info['cpu']}, torch {info['torch']}. Each window is one fresh "
         "`python -m normlab train` process (`train.threads: auto`, the user's environment without `OMP_*`, `GOMP_*`, "
         "`NORMLAB_*`), so the OpenMP wait policy and the thread count are the command's own decision at start "
         "(normlab.train.threads); tokens/s = the median of the loop's records (every 10 steps, the first dropped), "
         "median over windows; a ratio = median over rounds (rows alternate, order flipped every round). nanoGPT's "
         "`train.py` runs as its users run it, at 1 thread and at every usable core (`OMP_NUM_THREADS`).", ""]
    for shape, p in done:
        idle, busy = p["idle"], p["busy"]
        nano = ", ".join(f"{n} thread(s) {v:,.0f}" for n, v in idle.get("nano", {}).items())
        vs = (f"**{idle['vs_best']:.2f}x** nanoGPT's train.py at its best thread count ({idle['best']}; {nano} "
              "tokens/s)") if "vs_best" in idle else "no ratio (no nanoGPT checkout)"
        ratio = "--" if busy["vs_one"] is None else f"**{busy['vs_one']:.2f}x**"
        L += [f"### {shape.name}: L{shape.depth} E{shape.width} T{shape.context} B{shape.batch}, {p['usable']} usable "
              "cores", "",
              "| condition | row | tokens/s | ratio | ran under (threads, wait policy, as the runs recorded) |",
              "|---|---|---|---|---|",
              f"| idle (load average {p['load_idle']:.1f}, CPU pressure {pct(p['pressure_idle'])}) | normlab train "
              f"(auto) | {rate(idle['rate'])} | {vs} | {idle['ran']} |",
              f"| a spinner per core (load average {p['load_busy']:.1f}, CPU pressure {pct(p['pressure_busy'])}) | "
              f"normlab train (auto) | {rate(busy['rate'])} | {ratio} its 1-thread rate | {busy['ran']} |",
              f"| a spinner per core | normlab train (train.threads=1) | {rate(busy['one'])} | 1.00x | "
              f"{busy['ran_one']} |", ""]
        if "(idle)" not in idle["ran"]:  # the runs' own decision at start, not the load average the script saw
            L += ["**The 'idle' rows ran on a machine shared with other jobs** (load and pressure above): the command "
                  "saw contention and chose accordingly; these rows do not show the idle-machine case.", ""]
    L.append("<!-- nanogpt_policy:end -->")
    return "\n".join(L) + "\n"
