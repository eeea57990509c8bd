"""Digest of what normlab computes, for checking that a refactor changes no number.

Runs, in a fresh directory: the demo (``normlab compare --preset quick``, 2 workers x 1 thread so the thread plan is
the same on every run), ``normlab claims --budget tiny``, and a tiny ``train`` followed by ``convert``, ``quantize``
and ``export``. It records the SHA-256 of every tensor file those commands write and of every results file with its
volatile fields (wall times, dates, absolute paths, host facts) removed, plus the demo's Markdown tables verbatim.

    python benchmarks/output_digest.py --work before-dir --out before.json
    python benchmarks/output_digest.py --work after-dir --out after.json --compare before.json

``--compare`` exits 1 and lists the entries that differ. ``--skip-demo`` leaves out the 80-run demo (10-20 min).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

# keys whose values change from run to run without any number of the model changing
VOLATILE = re.compile(r"(wall|time|_s$|^s_|date|host|hostname|cpu|load|path|dir|created|started|finished|elapsed|"
                      r"version|commit|python|torch|platform|threads|workers|pid|eta|rate|per_s|tokens_per|"
                      r"throughput|memory|rss|machine|out$|command|argv|env|cache)", re.I)


# table columns that hold a speed or a duration
TIMING = re.compile(r"tok(ens)?/s|wall|elapsed|\bETA\b|\bs/step", re.I)


def _clean(obj, root: str):
    if isinstance(obj, dict):
        return {k: _clean(v, root) for k, v in sorted(obj.items()) if not VOLATILE.search(str(k))}
    if isinstance(obj, list):
        return [_clean(v, root) for v in obj]
    if isinstance(obj, str):
        return obj.replace(root, "<work>")
    return obj


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _run(cmd: list[str], cwd: Path) -> None:
    env = dict(os.environ, NORMLAB_CACHE_DIR=str(cwd / "cache"))
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, cwd=cwd, env=env, check=True, stdout=subprocess.DEVNULL)


def _digest_tree(top: Path, root: Path, into: dict) -> None:
    for path in sorted(top.rglob("*")):
        if not path.is_file():
            continue
        rel = str(path.relative_to(root))
        if path.suffix == ".safetensors":
            into[rel] = _sha(path.read_bytes())
        elif path.name in ("summary.json", "config.json", "claims.json", "sweep_summary.json", "config.yaml",
                           "results.json", "report.json", "quantize.json", "convert.json"):
            try:
                data = json.loads(path.read_text())
            except ValueError:
                continue
            into[rel] = _sha(json.dumps(_clean(data, str(root)), sort_keys=True).encode())


def _tables(md: str) -> list[str]:
    return [line for line in md.splitlines() if line.startswith("|")]


def _mask_timings(lines: list[str]) -> list[str]:
    """Table lines with the cells of timing columns (tokens/s, wall time) replaced: speeds differ between runs of
    the same code, the numbers the comparison is about do not."""
    out, masked = [], set()
    for i, line in enumerate(lines):
        cells = line.split(" | ")
        if i + 1 < len(lines) and set(lines[i + 1].replace("|", "").replace(":", "").split()) <= {"---"}:
            masked = {j for j, c in enumerate(cells) if TIMING.search(c)}
        out.append(" | ".join("<timing>" if j in masked else c for j, c in enumerate(cells)))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", required=True, help="an empty or absent directory to run in")
    ap.add_argument("--out", required=True, help="the digest JSON to write")
    ap.add_argument("--compare", help="a digest JSON to compare against")
    ap.add_argument("--skip-demo", action="store_true")
    args = ap.parse_args()
    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    py = [sys.executable, "-m", "normlab"]
    digest: dict = {"files": {}, "tables": {}}
    _run(py + ["train", "tiny", "--out", "tiny"], work)
    _run(py + ["convert", "tiny", "--to", "rmsnorm", "--out", "tiny-rms", "--json"], work)
    _run(py + ["quantize", "tiny", "--weights", "8", "--out", "tiny-q8", "--json"], work)
    _run(py + ["export", "tiny", "--to", "hf", "--out", "tiny-hf", "--json"], work)
    _run(py + ["claims", "--budget", "tiny", "--out", "claims-tiny", "--json"], work)
    if not args.skip_demo:
        _run(py + ["compare", "--preset", "quick", "--workers", "2", "--out", "demo", "--json"], work)
        digest["tables"]["demo/report.md"] = _tables((work / "demo" / "report.md").read_text())
    for name in ("tiny", "tiny-rms", "tiny-q8", "tiny-hf", "claims-tiny", "demo"):
        if (work / name).exists():
            _digest_tree(work / name, work, digest["files"])
    Path(args.out).write_text(json.dumps(digest, indent=1, sort_keys=True) + "\n")
    print(f"{len(digest['files'])} files, {sum(len(t) for t in digest['tables'].values())} table lines -> {args.out}")
    if args.compare:
        old = json.loads(Path(args.compare).read_text())
        if args.skip_demo:  # the demo was not run this time: compare the rest
            old["files"] = {k: v for k, v in old["files"].items() if not k.startswith("demo/")}
            old["tables"] = {}
        diff = [k for k in sorted(set(old["files"]) | set(digest["files"]))
                if old["files"].get(k) != digest["files"].get(k)]
        diff += [k for k in sorted(set(old["tables"]) | set(digest["tables"]))
                 if _mask_timings(old["tables"].get(k, [])) != _mask_timings(digest["tables"].get(k, []))]
        for k in diff:
            print("differs:", k)
        print("identical" if not diff else f"{len(diff)} entries differ")
        return 1 if diff else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
