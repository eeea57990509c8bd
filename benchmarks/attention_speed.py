"""Attention speed: forward + backward time and peak memory of one attention layer per kind and sequence length.

One layer (``normlab.attention.build_attention``: qkv projection, attention, output projection) at a fixed width
(default 256, 4 heads of 64, RoPE, batch 1, float32, CPU), for each ``model.attention`` kind and each ``T``:

- time: one subprocess per ``T`` builds every kind and times forward + backward passes (``y.sum().backward()``)
  round robin, one pass of each kind in turn, after one warm-up pass each; median and fastest of ``--reps`` passes.
  Interleaving keeps the kinds' ratios meaningful when other jobs load the machine;
- peak memory: a fresh subprocess per (kind, T), so one configuration's allocations cannot hide another's; the
  growth of the process's peak resident set size during one forward + backward (Linux: the peak, ``VmHWM``, is reset
  through ``/proc/self/clear_refs`` just before the pass and read after it; elsewhere
  ``resource.getrusage(...).ru_maxrss`` before/after, which can under-report). This counts every allocation of the
  pass, activations saved for backward included (tracemalloc does not see torch's allocator).

Results go to the section of ``--out`` (default ``docs/benchmarks.md``) between ``<!-- attention_speed:start -->``
and ``<!-- attention_speed:end -->``; the rest of the file is kept (atomic temp file + rename).

    python benchmarks/attention_speed.py [--out docs/benchmarks.md] [--lengths 256,512,...] [--threads 1] [--quick]

Target (issue 4): causal linear attention at T=4096 at least 3x faster than softmax, memory growing linearly in T.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sections import write_section  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from normlab.attention import attention_names  # noqa: E402
START, END = "<!-- attention_speed:start -->", "<!-- attention_speed:end -->"
KINDS = attention_names()  # the registry: a newly registered kind is benchmarked too
LENGTHS = (256, 512, 1024, 2048, 4096)


# -- worker (one configuration, in its own process) ---------------------------------------------------------------
def _peak_rss_bytes() -> int | None:
    """Peak resident set size of this process (``VmHWM``), or None where /proc is not available."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _reset_peak() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")  # Linux >= 4.0: reset VmHWM to the current RSS
        return True
    except OSError:
        return False


def _rss_bytes() -> int:
    with contextlib.suppress(OSError, ValueError, IndexError):
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _layer(kind: str, T: int, width: int, heads: int):
    import torch

    sys.path.insert(0, str(ROOT))
    from normlab.attention import RotaryEmbedding, build_attention
    from normlab.model.config import ModelConfig

    torch.manual_seed(0)
    cfg = ModelConfig(width=width, heads=heads, context=T, attention=kind, positions="rope").validate()
    layer = build_attention(cfg, RotaryEmbedding(cfg.head_dim, T))
    x = torch.randn(1, T, width, requires_grad=True)

    def step() -> None:
        layer.zero_grad(set_to_none=True)
        x.grad = None
        layer(x).sum().backward()

    return step


def memory_worker(kind: str, T: int, width: int, heads: int) -> dict:
    """Peak RSS growth of the first forward + backward of one layer (a fresh process per configuration)."""
    step = _layer(kind, T, width, heads)
    exact = _reset_peak()
    before = _rss_bytes() if exact else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    step()
    after = _peak_rss_bytes() if exact else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"kind": kind, "T": T, "peak_mib": max(0, (after or 0) - before) / 2**20, "peak_exact": exact}


def time_worker(kinds: list[str], T: int, width: int, heads: int, reps: int) -> dict:
    """Forward + backward times of every kind at one ``T``, interleaved pass by pass (round robin after one
    warm-up each), so all kinds see the same machine load and their ratios stay meaningful on a shared machine."""
    steps = {k: _layer(k, T, width, heads) for k in kinds}
    for step in steps.values():
        step()
    times: dict[str, list[float]] = {k: [] for k in kinds}
    for _ in range(reps):
        for k, step in steps.items():
            t0 = time.perf_counter()
            step()
            times[k].append(time.perf_counter() - t0)
    return {k: {"ms": statistics.median(v) * 1e3, "ms_min": min(v) * 1e3, "reps": reps} for k, v in times.items()}


# -- driver -------------------------------------------------------------------------------------------------------
def _spawn(args: argparse.Namespace, *worker_args: str) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--width", str(args.width), "--heads", str(args.heads),
           "--reps", str(args.reps), "--threads", str(args.threads), *worker_args]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads))
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"worker {' '.join(worker_args)} failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_length(T: int, args: argparse.Namespace) -> list[dict]:
    """All kinds at one ``T``: a timing process (kinds interleaved), then one memory process per kind."""
    timed = _spawn(args, "--time-worker", str(T), ",".join(args.kinds))
    out = []
    for kind in args.kinds:
        mem = _spawn(args, "--memory-worker", kind, str(T))
        out.append({"kind": kind, "T": T, **timed[kind], "peak_mib": mem["peak_mib"], "peak_exact": mem["peak_exact"]})
    return out


def render(results: list[dict], args: argparse.Namespace) -> str:
    import torch

    by = {(r["kind"], r["T"]): r for r in results}
    kinds = [k for k in args.kinds if any(r["kind"] == k for r in results)]
    lengths = sorted({r["T"] for r in results})
    lines = [START, "## Attention speed: one layer, forward + backward", "",
             f"One attention layer (`build_attention`: qkv projection, attention, output projection) at width "
             f"{args.width}, {args.heads} heads (head dim {args.width // args.heads}), RoPE, batch 1, float32, CPU "
             f"({platform.processor() or platform.machine()}, {args.threads} thread(s), torch {torch.__version__}). "
             f"Time: median (and fastest) of {results[0].get('reps', args.reps)} forward + backward passes after a "
             "warm-up, the kinds "
             "interleaved pass by pass in one process per T (same machine load for all); on a shared machine the "
             "fastest pass is the better estimate of the uncontended time. Peak memory: growth of the process's "
             "peak RSS during one forward + backward, each configuration in a fresh process "
             "(`benchmarks/attention_speed.py`). softmax = SDPA (fused causal kernel); softplus = LSSA, explicit "
             "T x T matrices; linear = chunked prefix sums (chunk 64); nala = NaLaFormer kernel, same chunked core.",
             "", "Time, ms: median (fastest):", "", "| T | " + " | ".join(kinds) + " | softmax ÷ linear |",
             "|---:|" + "---:|" * (len(kinds) + 1)]
    for T in lengths:
        row = [f"{by[(k, T)]['ms']:.1f} ({by[(k, T)]['ms_min']:.1f})" if (k, T) in by else "-" for k in kinds]
        ratio = (f"{by[('softmax', T)]['ms'] / by[('linear', T)]['ms']:.2f}x "
                 f"({by[('softmax', T)]['ms_min'] / by[('linear', T)]['ms_min']:.2f}x)"
                 if ("softmax", T) in by and ("linear", T) in by else "-")
        lines.append(f"| {T} | " + " | ".join(row) + f" | {ratio} |")
    lines += ["", "Peak memory growth (MiB):", "", "| T | " + " | ".join(kinds) + " |", "|---:|" + "---:|" * len(kinds)]
    for T in lengths:
        lines.append(f"| {T} | " + " | ".join(f"{by[(k, T)]['peak_mib']:.1f}" if (k, T) in by else "-"
                                               for k in kinds) + " |")
    lines.append("")
    if len(lengths) > 1:
        lo, mid, hi = lengths[0], lengths[-2], lengths[-1]
        lines += [f"Growth (median time, peak memory) from T={lo} to T={hi} ({hi / lo:g}x longer) and over the last "
                  f"step, T={mid} to T={hi} ({hi / mid:g}x; fixed costs such as the projections matter less there; "
                  "linear growth = the length ratio, quadratic = its square):", ""]

        def growth(k: str, a: int, b: int) -> str:
            t = by[(k, b)]["ms"] / by[(k, a)]["ms"]
            m0, m1 = by[(k, a)]["peak_mib"], by[(k, b)]["peak_mib"]
            return f"time {t:.1f}x, memory " + (f"{m1 / m0:.1f}x" if m0 > 0 else "n/a")

        for k in kinds:
            if all((k, t) in by for t in (lo, mid, hi)):
                lines.append(f"- {k}: {growth(k, lo, hi)}; last step {growth(k, mid, hi)}")
        lines.append("")
    T = max(lengths)
    if ("softmax", T) in by and ("linear", T) in by:
        ratio = by[("softmax", T)]["ms"] / by[("linear", T)]["ms"]
        fast = by[("softmax", T)]["ms_min"] / by[("linear", T)]["ms_min"]
        verdict = "met" if ratio >= 3 else f"missed by {3 / ratio:.2f}x"
        lines += [f"Target (issue 4): linear attention at T={T} at least 3x faster than softmax: **{ratio:.2f}x by "
                  f"median time, {verdict}** ({fast:.2f}x by fastest pass).", ""]
    lines.append(END)
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks.md", help="markdown file to update")
    ap.add_argument("--lengths", default=",".join(map(str, LENGTHS)))
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (1: stable on a shared machine)")
    ap.add_argument("--quick", action="store_true", help="T = 256, 512 only, 2 reps; print, do not write")
    ap.add_argument("--json", action="store_true", help="also print the raw results as one JSON object")
    ap.add_argument("--from-json", type=Path, help="re-render the section from a saved --json output (no runs)")
    ap.add_argument("--memory-worker", nargs=2, metavar=("KIND", "T"), help=argparse.SUPPRESS)
    ap.add_argument("--time-worker", nargs=2, metavar=("T", "KINDS"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.memory_worker or args.time_worker:
        import torch

        torch.set_num_threads(args.threads)
        if args.memory_worker:
            kind, T = args.memory_worker
            print(json.dumps(memory_worker(kind, int(T), args.width, args.heads)))
        else:
            T, kinds = args.time_worker
            print(json.dumps(time_worker(kinds.split(","), int(T), args.width, args.heads, args.reps)))
        return 0
    args.kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    lengths = [int(t) for t in args.lengths.split(",")]
    if args.quick:
        lengths, args.reps = [t for t in lengths if t <= 512] or lengths[:1], 2
    results = []
    if args.from_json:
        lines = [ln for ln in args.from_json.read_text().splitlines() if ln.startswith('{"results"')]
        results = json.loads(lines[-1])["results"]
        lengths = []
    for T in lengths:
        for r in run_length(T, args):
            print(f"{r['kind']:9s} T={T:5d}  {r['ms']:9.1f} ms (fastest {r['ms_min']:9.1f})  "
                  f"peak +{r['peak_mib']:8.1f} MiB", flush=True)
            results.append(r)
    section = render(results, args)
    if args.json:
        print(json.dumps({"results": results}))
    if args.quick:
        print(section)
    else:
        write_section(args.out, "attention_speed", section)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
