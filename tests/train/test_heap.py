"""normlab.train.heap: the C heap keeps freed memory (glibc's own accounting, ``mallinfo2``, says where a large
block came from), the environment carries it to child processes, a user's settings win, and no number changes."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

from normlab.train.heap import ENV, THRESHOLD, set_heap_policy
from tests.helpers import assert_bad_input, assert_same_weights, cli_env, normlab

GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"

# holds a 64 MiB tensor and prints glibc's mallinfo2: bytes in mmap'd blocks (hblkhd) and in the heap (arena)
PROBE = """
import ctypes, json, sys
if sys.argv[1] == "apply":
    from normlab.train.heap import set_heap_policy
    set_heap_policy()
import torch

class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                               "fsmblks", "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL(None)
libc.mallinfo2.restype = Info
t = torch.empty(16 << 20)
t.fill_(1.0)
i = libc.mallinfo2()
print(json.dumps({"mmapped": i.hblkhd, "arena": i.arena}))
"""


def _probe(mode: str, env: dict[str, str]) -> dict:
    r = subprocess.run([sys.executable, "-c", PROBE, mode], env=env, capture_output=True, text=True, check=True)
    return json.loads(r.stdout)


def _clean_env() -> dict[str, str]:
    drop = ("MALLOC_", "NORMLAB_MALLOC", "GLIBC_TUN", "NORMLAB_HEAP_NOTE", "NORMLAB_WAIT_POLICY_NOTE",
            "NORMLAB_CPU_PLAN", "GOMP_SPINCOUNT")
    return {k: v for k, v in os.environ.items() if not k.startswith(drop)}


@pytest.mark.skipif(not GLIBC, reason="glibc's malloc only")
def test_large_blocks_come_from_the_heap_in_this_process_and_in_children():
    big = 64 << 20
    env = _clean_env()
    plain = _probe("none", env)
    assert plain["mmapped"] >= big  # glibc's default: a 64 MiB block is mmap'd (and unmapped again on free)
    applied = _probe("apply", env)
    assert applied["mmapped"] < big <= applied["arena"]  # mallopt in this process: from the heap
    child = dict(env)
    assert set_heap_policy(child, apply=False).startswith("malloc keeps")
    inherited = _probe("none", child)  # a child process started with the variables: glibc reads them at start
    assert inherited["mmapped"] < big <= inherited["arena"]


@pytest.mark.skipif(not GLIBC, reason="glibc's malloc only")
def test_the_environment_rules():
    env: dict[str, str] = {}
    set_heap_policy(env, apply=False)
    assert env == ENV == {"MALLOC_MMAP_THRESHOLD_": str(THRESHOLD), "MALLOC_TRIM_THRESHOLD_": str(THRESHOLD)}
    user = {"MALLOC_TRIM_THRESHOLD_": "131072"}
    assert set_heap_policy(user, apply=False) == "malloc MALLOC_TRIM_THRESHOLD_=131072 (from the environment)"
    assert user == {"MALLOC_TRIM_THRESHOLD_": "131072"}  # the user's setting alone, nothing added
    tun = {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}
    assert "from the environment" in set_heap_policy(tun, apply=False) and "MALLOC_MMAP_THRESHOLD_" not in tun
    other = {"GLIBC_TUNABLES": "glibc.cpu.hwcaps=-AVX2"}  # not a malloc tunable: the policy still applies
    assert set_heap_policy(other, apply=False).startswith("malloc keeps") and other["MALLOC_TRIM_THRESHOLD_"]
    off = {"NORMLAB_MALLOC": "default"}
    assert set_heap_policy(off, apply=False) == "malloc defaults (NORMLAB_MALLOC=default)" and len(off) == 1
    child = {"NORMLAB_MALLOC": "default", **ENV}  # a child of a normlab process, told to use glibc's defaults
    set_heap_policy(child, apply=False)
    assert child == {"NORMLAB_MALLOC": "default"}  # normlab's variables stop here


@pytest.mark.skipif(not GLIBC, reason="glibc's malloc only")
def test_training_is_bit_identical_with_and_without_and_the_log_says_which(tmp_path, cache):
    args = ["train", "tiny", "--set", "train.steps=6", "--set", "model.width=32", "--set", "train.eval_every=6",
            "--set", "train.eval_batches=1", "--set", "diag.every=3", "--verbose"]
    kept, plain = tmp_path / "kept", tmp_path / "plain"
    r = normlab(*args, "--out", str(kept), cache=cache, check=True)
    assert "malloc keeps freed memory" in r.stderr
    env = {**{k: v for k, v in cli_env(cache).items() if not k.startswith("MALLOC_")}, "NORMLAB_MALLOC": "default"}
    r = subprocess.run([sys.executable, "-m", "normlab.cli", *args, "--out", str(plain)], env=env,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "malloc defaults (NORMLAB_MALLOC=default)" in r.stderr
    assert_same_weights(kept, plain)


@pytest.mark.skipif(not GLIBC, reason="glibc's malloc only")
def test_sweep_workers_inherit_the_policies(tmp_path, cache):
    """``set_process_policies`` (the ``normlab`` command and ``make demo`` call it first) reaches the sweep's
    workers through the environment: each run's log says the heap is kept and how OpenMP waits."""
    script = f"""
import sys
from normlab.cli import set_process_policies
set_process_policies()
from normlab.experiments.sweepdir import run_sweep
from normlab.experiments.sweep import parse_sweep
sweep = parse_sweep({{"name": "h", "base": "tiny", "seeds": [0], "set": {{"train.steps": 3, "train.eval_every": 3,
                     "train.eval_batches": 1, "model.width": 32}}}})
out = run_sweep(sweep, __import__("pathlib").Path({str(tmp_path / "sw")!r}), workers=1, threads=1, log=lambda s: None)
print(out.trained[0])
"""
    env = {**_clean_env(), "NORMLAB_CACHE_DIR": str(cache)}
    env.pop("OMP_WAIT_POLICY", None)
    r = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    log = (tmp_path / "sw" / "logs" / f"{r.stdout.split()[-1]}.log").read_text()
    assert "malloc keeps freed memory for reuse" in log
    assert "OMP_WAIT_POLICY=PASSIVE (set by normlab" in log or "GOMP_SPINCOUNT=30000 (set by normlab" in log


def test_a_bad_normlab_malloc_value_is_one_line():
    env = {**_clean_env(), "NORMLAB_MALLOC": "<b>fast</b>"}
    r = subprocess.run([sys.executable, "-m", "normlab", "list"], env=env, capture_output=True, text=True)
    assert_bad_input(r, "NORMLAB_MALLOC must be 'default'", "'<b>fast</b>'")
