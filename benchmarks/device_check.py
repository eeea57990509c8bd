#!/usr/bin/env python
"""The device checks of docs/gpu.md in one call of at most 8 minutes (``benchmarks/device_check.sh`` runs this).

Steps, in order, each cut at its own time limit so that the next still runs, and each writing its results as soon
as it ends (``OUT/results.json``, one key per step, and ``OUT/device_check.md``, the same as tables), so a call cut
short keeps every step it finished:

1. ``device``: the card, torch and CUDA versions;
2. ``test_cuda``: ``tests/test_cuda.py`` (correctness on CUDA: train, kill -9 resume, stacked == alone, no host reads
   between read points), its pass / fail / skip counts;
3. ``speed``: steady-state tokens/s (median of the ``tokens_per_s`` records after the first ``SKIP`` steps: compile,
   warm-up, evaluation and checkpoints left out) at the GPT-2-small body (``issue``: L12 E768 H12 T1024 B16, byte
   vocabulary, bf16 on CUDA): karpathy/nanoGPT's own ``train.py`` compiled (a checkout at ``NANOGPT``; skipped
   without one: nothing of it is vendored), ``normlab train`` at its defaults, and with one cost switched at a time:
   ``diag.every=0`` (no diagnostic steps), ``train.deterministic=true`` (what exact resume costs), and
   ``model.positions=learned`` (RoPE's cost). The gap to nanoGPT is attributed: each switch's tokens/s over the
   defaults' is the share of the gap that cost explains;
4. ``stacked``: stacking ``MEMBERS`` runs against one run alone at the demo's shape (L6 E64 T64 B16) and the scale
   preset's (L12 E256 T256 B16): the group's tokens/s (its members' summed) over one run's, both steady-state;
5. ``scale``: the scale preset's first config for ``SCALE_STEPS`` steps; its steady-state tokens/s, and from it
   alone (no start-up, compile, evaluation or checkpoint time, which a long run pays once or rarely) the hours of the
   preset's runs with its replication, one after another and stacked (the ``stacked`` step's speed-up at that
   shape).

``DRY_RUN=1``: the same steps on the CPU at small shapes (a few seconds each; ``tests/test_cuda.py`` runs it inside
``make test`` so the script cannot rot): numbers of the CPU, labelled as a dry run, never a GPU's.

    OUT=device-out NANOGPT=.nanogpt python benchmarks/device_check.py     # DRY_RUN=1 for the CPU dry run
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DRY = os.environ.get("DRY_RUN", "") not in ("", "0")
OUT = Path(os.environ.get("OUT", "device-out"))
NANOGPT = Path(os.environ.get("NANOGPT", ".nanogpt"))
MEMBERS = 4
# seconds per step on a GPU (their sum, 430 s, leaves 50 s of the 8 minutes for start-up and writing); a dry run's
# sum, 170 s, stays under CI's 3 minutes
LIMITS = {"device": 30, "test_cuda": 150, "speed": 150, "stacked": 70, "scale": 30}
DRY_LIMITS = {"device": 15, "test_cuda": 30, "speed": 55, "stacked": 50, "scale": 20}
STEPS, SKIP, LOG_EVERY = (16, 6, 2) if DRY else (60, 20, 5)
SCALE_STEPS = 16 if DRY else 60
# (depth, width, heads, context, batch) per shape; a dry run's stand-ins are small
SHAPES = {"issue": (12, 768, 12, 1024, 16), "demo": (6, 64, 4, 64, 16), "scale": (12, 256, 4, 256, 16)}
DRY_SHAPES = {"issue": (2, 64, 2, 64, 8), "demo": (2, 32, 2, 32, 8), "scale": (2, 64, 2, 64, 8)}
COSTS = [("defaults", []), ("diag.every=0", ["diag.every=0"]), ("train.deterministic=true",
                                                                  ["train.deterministic=true"]),
         ("model.positions=learned", ["model.positions=learned"])]


def shape_keys(name: str) -> list[str]:
    d, w, h, t, b = (DRY_SHAPES if DRY else SHAPES)[name]
    return [f"model.depth={d}", f"model.width={w}", f"model.heads={h}", f"model.context={t}", f"train.batch_size={b}"]


def run_keys(steps: int) -> list[str]:
    """What every measured run sets: its length, logging for the steady-state rate, no evaluation or checkpoint in
    between, no trackers, the device."""
    return [f"train.steps={steps}", f"train.log_every={LOG_EVERY}", f"train.eval_every={steps}",
            "train.eval_batches=1", f"train.checkpoint_every={steps}", "train.track=[]",
            *(["device=cpu", "train.precision=fp32"] if DRY else ["device=cuda"])]  # CPU: no bf16 timing probe


def steady_rate(metrics: Path) -> float:
    """Median ``tokens_per_s`` of the records after step ``SKIP`` (the first steps compile and warm up)."""
    recs = [json.loads(line) for line in metrics.read_text().splitlines()]
    rates = [r["tokens_per_s"] for r in recs if "tokens_per_s" in r and r["step"] > SKIP]
    if not rates:
        raise RuntimeError(f"no tokens_per_s record after step {SKIP} in {metrics}")
    return statistics.median(rates)


class Results:
    """``OUT/results.json`` and ``OUT/device_check.md``, rewritten (temp file, then rename) after every step."""

    def __init__(self, out: Path):
        self.out, self.data = out, {"dry_run": DRY, "steps": {}}
        out.mkdir(parents=True, exist_ok=True)

    def put(self, step: str, value: dict) -> None:
        self.data["steps"][step] = value
        for name, text in (("results.json", json.dumps(self.data, indent=1, allow_nan=False)),
                           ("device_check.md", self.markdown())):
            tmp = self.out / f".{name}.tmp"
            tmp.write_text(text + "\n")
            tmp.replace(self.out / name)

    def markdown(self) -> str:
        s = self.data["steps"]
        dev = s.get("device", {})
        lines = [f"## Device check on {dev.get('card', '?')}" + (" (DRY RUN on the CPU: not a GPU's numbers)" if DRY
                                                                 else ""), "",
                 f"torch {dev.get('torch', '?')}, CUDA {dev.get('cuda', '?')}. Command: "
                 f"`{'DRY_RUN=1 ' if DRY else ''}bash benchmarks/device_check.sh`.", ""]
        if "test_cuda" in s:
            t = s["test_cuda"]
            lines += [f"tests/test_cuda.py: {t.get('summary') or t.get('status')}", ""]
        if "speed" in s:
            sp = s["speed"]
            lines += [f"Steady-state tokens/s at `{sp['shape']}` (median after step {SKIP} of {STEPS}):", "",
                      "| run | tokens/s | vs nanoGPT | vs defaults |", "|---|---:|---:|---:|"]
            for r in sp["rows"]:
                rate = r.get("tokens_per_s")
                lines.append(f"| {r['run']} | {f'{rate:,.0f}' if rate else r.get('status', 'failed')} | "
                             f"{_ratio(r.get('vs_nanogpt'))} | {_ratio(r.get('vs_defaults'))} |")
            lines.append("")
        if "stacked" in s:
            lines += [f"Stacking {MEMBERS} runs against one alone (steady-state tokens/s):", "",
                      "| shape | one run | stacked group | speed-up |", "|---|---:|---:|---:|"]
            for r in s["stacked"]["rows"]:
                lines.append(f"| {r['shape']} | {_num(r.get('alone'))} | {_num(r.get('stacked'))} | "
                             f"{_ratio(r.get('speedup'))} |")
            lines.append("")
        if "scale" in s:
            sc = s["scale"]
            lines += [f"Scale preset: {sc.get('line', sc.get('status'))}", ""]
        return "\n".join(lines)


def _ratio(v: float | None) -> str:
    return f"{v:.2f}" if isinstance(v, (int, float)) else ""


def _num(v: float | None) -> str:
    return f"{v:,.0f}" if isinstance(v, (int, float)) else "failed"


def deadline_left(t_end: float) -> float:
    return max(1.0, t_end - time.monotonic())


def normlab_row(work: Path, keys: list[str], t_end: float) -> dict:
    """``normlab train tiny`` with ``keys`` in a fresh process: its steady-state tokens/s and what it resolved."""
    out = work / f"run-{len(list(work.iterdir()))}"
    argv = [sys.executable, "-m", "normlab", "train", "tiny", "--out", str(out)]
    for k in keys:
        argv += ["--set", k]
    r = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=deadline_left(t_end))
    if r.returncode != 0:
        raise RuntimeError((r.stderr.strip().splitlines() or ["normlab train failed"])[-1][:300])
    s = json.loads((out / "summary.json").read_text())
    return {"tokens_per_s": steady_rate(out / "metrics.jsonl"), "precision": s.get("precision"),
            "compile": s.get("compile"), "deterministic": s.get("deterministic")}


def nanogpt_rate(work: Path, t_end: float) -> float:
    """nanoGPT's ``train.py`` (compiled, bf16) at the ``issue`` shape on random byte tokens: tokens/s from its own
    per-iteration times after ``SKIP`` iterations (benchmarks/gpu_speed.py's driver)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu_speed

    d, w, h, t, b = SHAPES["issue"]
    shape = gpu_speed.Shape("issue", d, w, h, t, b)
    old = gpu_speed.SKIP
    gpu_speed.SKIP = SKIP
    try:
        return gpu_speed.nanogpt_rate(shape, NANOGPT, work, STEPS, True)
    finally:
        gpu_speed.SKIP = old


def step_device() -> dict:
    import torch

    cuda = torch.cuda.is_available()
    card = torch.cuda.get_device_name() if cuda and not DRY else "CPU (dry run)"
    return {"card": card, "torch": torch.__version__, "cuda": torch.version.cuda}


def step_test_cuda(t_end: float) -> dict:
    argv = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "tests/test_cuda.py",
            "-k", "not device_check",  # not the test that runs this script
            *(["--collect-only"] if DRY else [])]  # the CPU has nothing of it to run: the file collects
    try:
        r = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=deadline_left(t_end))
    except subprocess.TimeoutExpired:
        return {"status": "timed out"}
    (OUT / "test_cuda.log").write_text(r.stdout[-20000:] + r.stderr[-5000:])
    last = (r.stdout.strip().splitlines() or [""])[-1]
    return {"status": ("collected" if DRY else "passed") if r.returncode == 0 else f"exit {r.returncode}",
            "summary": last.strip("= ")}


def step_speed(work: Path, t_end: float, results: Results) -> dict:
    rows: list[dict] = []
    out = {"shape": "issue" + (" (dry-run stand-in)" if DRY else ""), "rows": rows}
    ref = None
    if (NANOGPT / "train.py").is_file() and not DRY:
        try:
            ref = nanogpt_rate(work, t_end)
            rows.append({"run": "nanoGPT train.py, compiled", "tokens_per_s": ref, "vs_nanogpt": 1.0})
        except Exception as e:  # noqa: BLE001 - one line, the other rows still run
            rows.append({"run": "nanoGPT train.py, compiled", "status": f"failed: {str(e)[:200]}"})
    else:
        rows.append({"run": "nanoGPT train.py, compiled",
                     "status": "skipped (dry run)" if DRY else f"skipped: no checkout at {NANOGPT}"})
    results.put("speed", out)
    base = None
    for label, sets in COSTS:
        row: dict = {"run": f"normlab train, {label}"}
        try:
            row.update(normlab_row(work, [*shape_keys("issue"), *run_keys(STEPS), *sets], t_end))
            base = row["tokens_per_s"] if label == "defaults" else base
            row["vs_nanogpt"] = row["tokens_per_s"] / ref if ref else None
            row["vs_defaults"] = row["tokens_per_s"] / base if base else None
        except subprocess.TimeoutExpired:
            row["status"] = "timed out at the step's limit"
        except (RuntimeError, OSError) as e:
            row["status"] = f"failed: {str(e)[:200]}"
        rows.append(row)
        results.put("speed", out)  # each row as it is measured
    return out


GROUP = """
import json, statistics, sys
from pathlib import Path
from normlab.config import load_config
from normlab.train.loop import train
from normlab.train.stacked import train_stacked
keys, out, members, skip = json.loads(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
def rate(d):
    recs = [json.loads(l) for l in (d / "metrics.jsonl").read_text().splitlines()]
    return statistics.median(r["tokens_per_s"] for r in recs if "tokens_per_s" in r and r["step"] > skip)
cfgs = lambda: [load_config("tiny", [*keys, f"seed={s}"]) for s in range(members)]
train(cfgs()[0], out / "alone", quiet=True)  # one run alone, then the group, in one process (one start-up)
print(json.dumps({"alone": rate(out / "alone")}), flush=True)
train_stacked(cfgs(), [out / f"m{i}" for i in range(members)], quiet=True)
print(json.dumps({"stacked": sum(rate(out / f"m{i}") for i in range(members))}), flush=True)
"""


def step_stacked(work: Path, t_end: float, results: Results) -> dict:
    """One run alone and a group of ``MEMBERS`` (seeds 0..MEMBERS-1) at each shape, diagnostics off, in one process
    per shape: the group's summed steady-state tokens/s over the run's."""
    rows: list[dict] = []
    out = {"members": MEMBERS, "rows": rows}
    for shape in ("demo", "scale"):
        keys = [*shape_keys(shape), *run_keys(STEPS), "diag.every=0"]
        row: dict = {"shape": shape + (" (dry-run stand-in)" if DRY else "")}
        rows.append(row)
        try:
            r = subprocess.run([sys.executable, "-c", GROUP, json.dumps(keys), str(work / shape), str(MEMBERS),
                                str(SKIP)], cwd=ROOT, capture_output=True, text=True, timeout=deadline_left(t_end))
            for line in r.stdout.strip().splitlines():
                row.update(json.loads(line))
            if r.returncode != 0:
                raise RuntimeError((r.stderr.strip().splitlines() or ["stacked group failed"])[-1][:300])
            row["speedup"] = row["stacked"] / row["alone"]
        except subprocess.TimeoutExpired as e:
            row.update(_partial(e.stdout), status="timed out at the step's limit")
        except (RuntimeError, OSError, ValueError) as e:
            row["status"] = f"failed: {str(e)[:200]}"
        results.put("stacked", out)
    return out


def _partial(stdout: bytes | str | None) -> dict:
    """The JSON lines a subprocess printed before it was cut."""
    text = stdout.decode() if isinstance(stdout, bytes) else (stdout or "")
    got: dict = {}
    for line in text.strip().splitlines():
        try:
            got.update(json.loads(line))
        except json.JSONDecodeError:
            pass
    return got


def step_scale(work: Path, t_end: float, stacked: dict | None) -> dict:
    """The scale preset's first config, ``SCALE_STEPS`` steps: the preset's hours from steady-state tokens/s."""
    import yaml

    from normlab.experiments.sweep import load_sweep

    sweep = load_sweep(preset="scale")
    cfg = json.loads(json.dumps(sweep.runs[0].config))
    full_steps, t = cfg["train"]["steps"], cfg["train"]
    tokens_per_step = t["batch_size"] * t.get("grad_accum", 1) * cfg["model"]["context"]
    t.update(steps=SCALE_STEPS, eval_every=SCALE_STEPS, checkpoint_every=SCALE_STEPS, log_every=LOG_EVERY, track=[])
    from normlab.config import load_config

    cfg["data"]["source"] = load_config("tiny").data.source  # bytes either way: the rate is the data's size's, not
    # its content's, and the synthetic source needs no corpus preparation inside the step's time
    if DRY:  # the CPU stand-in: a small model of the same config
        for k in shape_keys("scale"):
            sec, rest = k.split(".", 1)
            key, value = rest.split("=")
            cfg[sec][key] = int(value)
        cfg["device"], cfg["train"]["precision"] = "cpu", "fp32"
    path = work / "scale.yaml"
    path.write_text(yaml.safe_dump(cfg))
    run = work / "scale-run"
    r = subprocess.run([sys.executable, "-m", "normlab", "train", str(path), "--out", str(run)], cwd=ROOT,
                       capture_output=True, text=True, timeout=deadline_left(t_end))
    if r.returncode != 0:
        raise RuntimeError((r.stderr.strip().splitlines() or ["scale probe failed"])[-1][:300])
    rate = steady_rate(run / "metrics.jsonl")
    n = 2 * len(sweep.runs)  # with --replicate-on english
    hours = n * full_steps * tokens_per_step / rate / 3600
    speedup = next((r.get("speedup") for r in (stacked or {}).get("rows", []) if r["shape"].startswith("scale")),
                   None)
    line = (f"{rate:,.0f} tokens/s steady-state over {SCALE_STEPS} steps{' (dry-run stand-in shape)' if DRY else ''}"
            f" on the synthetic byte source;"
            f" {n} runs x {full_steps} steps x {tokens_per_step} tokens: {hours:.2f} h of training one after another"
            + (f", {hours / speedup:.2f} h stacked ({speedup:.2f}x)" if speedup else "")
            + " (start-up, compile, evaluation and checkpoints not included)")
    return {"tokens_per_s": rate, "runs": n, "hours_one_after_another": hours,
            "hours_stacked": hours / speedup if speedup else None, "line": line}


def main() -> int:
    import torch

    if not DRY and not torch.cuda.is_available():
        print("device_check.py: no CUDA device (torch sees none); DRY_RUN=1 runs the same steps on the CPU",
              file=sys.stderr)
        return 2
    limits = DRY_LIMITS if DRY else LIMITS
    results = Results(OUT)
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    t0 = time.monotonic()

    def timed(name: str, fn) -> dict | None:  # noqa: ANN001 - one step: its result, or why not, written at once
        t = time.monotonic()
        print(f"== {name} (at {t - t0:.0f} s, limit {limits[name]} s)", flush=True)
        try:
            value = fn(t + limits[name])
        except subprocess.TimeoutExpired:
            value = {"status": f"timed out after {limits[name]} s"}
        except (RuntimeError, OSError, ValueError, KeyError) as e:
            value = {"status": f"failed: {str(e)[:300]}"}
        value["seconds"] = round(time.monotonic() - t, 1)
        results.put(name, value)
        print(json.dumps(value, allow_nan=False)[:2000], flush=True)
        return value

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        timed("device", lambda t_end: step_device())
        timed("test_cuda", step_test_cuda)
        speed_dir, stack_dir, scale_dir = (work / n for n in ("speed", "stacked", "scale"))
        for d in (speed_dir, stack_dir, scale_dir):
            d.mkdir()
        timed("speed", lambda t_end: step_speed(speed_dir, t_end, results))
        stacked = timed("stacked", lambda t_end: step_stacked(stack_dir, t_end, results))
        timed("scale", lambda t_end: step_scale(scale_dir, t_end, stacked))
    print(f"== done in {time.monotonic() - t0:.0f} s; {OUT / 'device_check.md'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
