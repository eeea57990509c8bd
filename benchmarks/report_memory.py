#!/usr/bin/env python
"""Peak resident memory of ``normlab report RUN`` on a large synthetic ``metrics.jsonl``.

A run directory is written with the ``tiny`` preset's resolved config, a completed ``summary.json`` and a
``metrics.jsonl`` of about ``--mb`` MB shaped like the trainer's: every line the loop's keys (``step``, ``loss``,
``lr``, ``grad_norm``, ``tokens_per_s``, ``elapsed_s``); every ``--diag-every``-th line also the training-time
diagnostics of a 12-block model (residual RMS / variance per block, norm RMS per site, per-block gradient norms:
about 100 more keys, ~5 KB a line, as the claims runs write them); every ``--eval-every``-th line ``val_loss`` and
``val_bpb``. Then ``normlab report RUN --out OUT --json`` runs under ``/usr/bin/time -v`` (a fresh process) and its
"Maximum resident set size" is reported, with the file's size and how many numbers it holds (8 bytes each: its
numeric content), beside the same command on a 0.1 MB metrics file (what the imports and the figures take
whatever the file: the fixed part).

    python benchmarks/report_memory.py [--mb 250] [--out docs/benchmarks.md] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sections import write_section  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from normlab.api import make_config  # noqa: E402
from normlab.names import GRAD_NORM_PREFIXES  # noqa: E402

DEPTH = 12


def diag_keys() -> list[str]:
    keys = ["diag/embed_rms", "diag/embed_var"]
    keys += [f"diag/{k}/{b}" for b in range(DEPTH) for k in ("resid_rms", "resid_var")]
    keys += [f"diag/norm_rms/blocks.{b}.{s}" for b in range(DEPTH) for s in ("attn_post", "mlp_post")]
    keys += [f"{p}{b}" for p in GRAD_NORM_PREFIXES for b in range(DEPTH)]
    return keys


def write_metrics(path: Path, target_bytes: int, diag_every: int, eval_every: int, seed: int = 0) -> tuple[int, int]:
    """Write about ``target_bytes`` of trainer-shaped lines; ``(lines, numbers)`` written (``step`` counted)."""
    rng = random.Random(seed)
    dkeys = diag_keys()
    lines = numbers = size = 0
    with open(path, "w") as f:
        f.write(json.dumps({"step": 0, "init_val_loss": 5.54, "init_val_bpb": 7.99}) + "\n")
        step = 0
        while size < target_bytes:
            step += 1
            rec = {"step": step, "loss": 2.0 + rng.random(), "lr": 1e-3 * rng.random(), "grad_norm": rng.random(),
                   "tokens_per_s": 30000 + 1000 * rng.random(), "elapsed_s": 0.05 * step}
            if step % diag_every == 0:
                rec.update({k: rng.random() for k in dkeys})
            if step % eval_every == 0:
                rec.update({"val_loss": 1.5 + rng.random(), "val_bpb": 2.2 + rng.random()})
            line = json.dumps(rec) + "\n"
            f.write(line)
            size += len(line)
            lines += 1
            numbers += len(rec)
    return lines + 1, numbers + 3


def make_run(run: Path, mb: float, diag_every: int, eval_every: int) -> dict:
    run.mkdir(parents=True)
    cfg = make_config("tiny", {"train.steps": 10**6}).to_dict()
    (run / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    lines, numbers = write_metrics(run / "metrics.jsonl", int(mb * 1e6), diag_every, eval_every)
    last = lines - 1
    (run / "summary.json").write_text(json.dumps({"status": "completed", "step": last, "steps": last,
                                                   "val_bpb": 2.5, "val_loss": 1.7, "train_loss": 2.1}))
    return {"bytes": (run / "metrics.jsonl").stat().st_size, "lines": lines, "numbers": numbers}


def peak_rss(run: Path, out: Path) -> tuple[int, int, str]:
    """``(peak RSS in KiB, exit status, the command's last stderr line)`` of ``normlab report`` in a fresh process."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + (os.pathsep + os.environ["PYTHONPATH"]
                                                    if os.environ.get("PYTHONPATH") else ""))
    cmd = ["/usr/bin/time", "-v", sys.executable, "-m", "normlab", "report", str(run), "--out", str(out), "--json"]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", p.stderr)
    errs = [ln for ln in p.stderr.splitlines() if ln.strip() and not ln.startswith("\t")]
    rc = re.search(r"Exit status: (\d+)", p.stderr)
    return int(m.group(1)) if m else -1, int(rc.group(1)) if rc else p.returncode, errs[-1] if errs else ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=float, default=250.0, help="size of metrics.jsonl in MB (cap: 256 MiB)")
    ap.add_argument("--diag-every", type=int, default=10)
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--out", type=Path, help="write a section of this markdown file (docs/benchmarks.md)")
    ap.add_argument("--keep", type=Path, help="build the run here and keep it (default: a temp dir, removed)")
    args = ap.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="report-memory-"))
    try:
        make_run(root / "small", 0.1, args.diag_every, args.eval_every)
        floor, _, _ = peak_rss(root / "small", root / "small-report")
        facts = make_run(root / "run", args.mb, args.diag_every, args.eval_every)
        kib, rc, last = peak_rss(root / "run", root / "report")
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)
    ratio = (kib - floor) * 1024 / (8 * facts["numbers"])
    print(json.dumps({**facts, "peak_rss_kib": kib, "floor_rss_kib": floor, "exit_status": rc,
                      "above_floor_over_numeric": round(ratio, 2), "last_stderr_line": last}))
    if args.out:
        body = (f"## `normlab report` on a large metrics.jsonl (`benchmarks/report_memory.py`)\n\n"
                f"`python benchmarks/report_memory.py --mb {args.mb:g} --diag-every {args.diag_every} --eval-every "
                f"{args.eval_every} --out {args.out}` ({platform.machine()}, Python {platform.python_version()}): "
                f"a metrics.jsonl of {facts['bytes']:,} bytes, {facts['lines']:,} lines, {facts['numbers']:,} "
                f"numbers ({8 * facts['numbers'] / 2**20:.0f} MiB as 8-byte values); `normlab report RUN --json` "
                f"(under `/usr/bin/time -v`) exit status {rc}, peak resident memory {kib / 1024:.0f} MiB; on a 0.1 MB "
                f"metrics file {floor / 1024:.0f} MiB (imports and figures); the difference, "
                f"{(kib - floor) / 1024:.0f} MiB, is {ratio:.1f}x the numeric content.\n")
        title, text = body.split("\n\n", 1)
        write_section(args.out, "report_memory", f"{title}\n\n{textwrap.fill(text, 120, break_on_hyphens=False)}\n")


if __name__ == "__main__":
    main()
