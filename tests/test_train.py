"""End-to-end training: learning, exact resume after kill -9 and Ctrl-C, divergence as a result."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from normlab.errors import EXIT_DIVERGED, EXIT_INTERRUPTED
from tests.helpers import TINY, assert_same_weights, cli_env, kill_9_after, normlab, run_inproc, summary


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory, cache):
    out = tmp_path_factory.mktemp("ref") / "run"
    normlab("train", "tiny", *TINY, "--out", str(out), cache=cache, check=True)
    return out


def test_run_directory_contents(reference_run):
    s = summary(reference_run)
    assert s["status"] == "completed" and s["step"] == 24
    records = [json.loads(l) for l in (reference_run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "loss" in r and "tokens_per_s" in r] == [4, 8, 12, 16, 20, 24]
    assert set(records[0]) == {"step", "init_val_loss", "init_val_bpb"} and records[0]["step"] == 0
    assert s["init_val_bpb"] == records[0]["init_val_bpb"]  # loss at initialisation (LR sensitivity)
    assert {"step", "loss", "lr", "grad_norm", "tokens_per_s", "elapsed_s"} <= set(records[1])
    assert [r["step"] for r in records if "val_bpb" in r] == [12, 24]
    groups = json.loads((reference_run / "param_groups.json").read_text())
    norm_site = re.compile(r"(attn|mlp)_(in|out|post)\.|final_norm\.")
    assert groups["no_decay"] and all(
        norm_site.search(n) or "emb" in n or n.endswith("bias") for n in groups["no_decay"]
    )
    assert all(n.endswith("weight") and "emb" not in n for n in groups["decay"])
    ckpts = sorted(p.name for p in (reference_run / "checkpoints").iterdir())
    assert ckpts == ["step_00000020", "step_00000024"]  # keep_checkpoints=2, no temp dirs left
    assert s["gap_bpb"] == pytest.approx(s["val_bpb"] - s["entropy_floor_bpb"])


def test_resume_after_kill_9_is_bit_exact(reference_run, tmp_path, cache):
    out = tmp_path / "killed"
    kill_9_after(["train", "tiny", *TINY], out, cache, 12)
    assert not (out / "model.safetensors").exists(), "run finished before it could be killed"
    r = normlab("train", "--resume", str(out), cache=cache)
    assert r.returncode == 0, r.stderr
    assert_same_weights(reference_run, out)
    steps = [json.loads(l)["step"] for l in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(set(steps)), "metrics.jsonl has duplicated steps after resume"


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_ctrl_c_then_resume_is_bit_exact(reference_run, tmp_path, cache, sig):
    """Ctrl-C, or SIGTERM (``kill``, a scheduler's pre-emption notice): checkpoint at the next step, exit 130 with
    ``status: interrupted``; ``--resume`` ends with the weights of an uninterrupted run."""
    out = tmp_path / "interrupted"
    proc = subprocess.Popen([sys.executable, "-m", "normlab.cli", "train", "tiny", *TINY, "--out", str(out)],
                            env=cli_env(cache), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    while not (out / "checkpoints").exists() and proc.poll() is None:
        time.sleep(0.02)
    proc.send_signal(sig)
    assert proc.wait() == EXIT_INTERRUPTED
    s = summary(out)
    assert s["status"] == "interrupted" and 0 < s["step"] < 24
    r = normlab("train", "--resume", str(out), cache=cache)
    assert r.returncode == 0, r.stderr
    assert_same_weights(reference_run, out)


def test_divergence_is_a_result(tmp_path, cache):
    out = tmp_path / "div"
    r = run_inproc("train", "tiny", "--set", "train.loss_ceiling=3.0", "--out", str(out), "--json", cache=cache)
    assert r.returncode == EXIT_DIVERGED
    s = json.loads(r.stdout)
    assert s["status"] == "diverged" and s["step"] == 1 and summary(out)["status"] == "diverged"


def test_gradient_accumulation_matches_big_batch(tmp_path, cache, monkeypatch):
    """Two micro-batches of 4 sum to the same gradient as one batch of 8 drawn from the same windows."""
    from normlab.config import load_config
    from normlab.model import build_model
    from normlab.rundir.readers import load_data
    from normlab.train.loop import get_batch

    monkeypatch.setenv("NORMLAB_CACHE_DIR", str(cache))
    cfg = load_config("tiny")
    data = load_data(cfg)
    cfg.model.vocab_size = data.vocab_size
    torch.manual_seed(0)
    m = build_model(cfg.model)
    x, y = get_batch(data.train, 8, cfg.model.context, torch.Generator().manual_seed(1))
    m(x, y)[1].backward()
    full = [p.grad.clone() for p in m.parameters()]
    m.zero_grad()
    for i in range(2):
        (m(x[4 * i : 4 * i + 4], y[4 * i : 4 * i + 4])[1] / 2).backward()
    for a, b in zip(full, [p.grad for p in m.parameters()]):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def source_unigram_bpb(order: int, alphabet: int, concentration: float, seed: int) -> float:
    """The exact unigram entropy of a ``synthetic:markov`` source, rebuilt here from its definition (the same
    Dirichlet draws as ``normlab.data.markov.generate``), with an eigenvector for the stationary distribution: the
    symbol marginal is ``p(s) = sum_c pi(c) P[c, s]``, ``H1 = -sum_s p(s) log2 p(s)``."""
    P = np.random.default_rng(seed).dirichlet(np.full(alphabet, concentration), size=alphabet**order)
    n = P.shape[0]
    T = np.zeros((n, n))
    for c in range(n):
        for s in range(alphabet):
            T[c, (c * alphabet + s) % n] += P[c, s]
    w, v = np.linalg.eig(T.T)
    pi = np.real(v[:, np.argmin(np.abs(w - 1))])
    p = (pi / pi.sum()) @ P
    return float(-(p * np.log2(p)).sum())


def test_tiny_preset_learns_and_its_gap_shrinks_with_steps(tmp_path, cache):
    """The ``tiny`` preset as shipped ends well below its source's unigram entropy (it learned more than symbol
    frequencies), and a shorter run of it ends further from the entropy floor."""
    from normlab.config import load_config

    gaps = []
    for steps in (20, None):  # None: the preset's own step count
        out = tmp_path / f"s{steps}"
        sets = ["--set", f"train.steps={steps}"] if steps else []
        r = run_inproc("train", "tiny", *sets, "--out", str(out), "--json", cache=cache, check=True)
        gaps.append(json.loads(r.stdout)["gap_bpb"])
    assert gaps[1] < gaps[0] - 0.1 and gaps[1] > 0
    source = load_config("tiny").data.source
    q = dict(kv.split("=") for kv in source.partition("?")[2].split("&"))
    h1 = source_unigram_bpb(int(q["order"]), int(q["alphabet"]), float(q["concentration"]), int(q["seed"]))
    final = json.loads(r.stdout)
    assert final["step"] == load_config("tiny").train.steps
    assert final["val_bpb"] <= h1 - 0.3, (final["val_bpb"], h1)


def test_banner_names_every_choice_set_away_from_its_default(tmp_path, cache):
    sets = {"train.clip": "adagc", "model.output": "stablemax", "optim.perp_grad": "true", "train.steps": "2"}
    args = [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
    r = run_inproc("train", "tiny", *args, "--set", "train.log_every=1", "--out", str(tmp_path / "r"), "--verbose",
                   cache=cache, check=True)
    (line,) = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.startswith("not default: ")]
    named = dict(kv.split("=", 1) for kv in line.removeprefix("not default: ").split(", ") if "=" in kv)
    assert {k: named.get(k, "").lower() for k in sets} == sets  # each --set, by its key
    assert "train.log_every" not in named and "device" not in named  # bookkeeping and runtime keys aside


def test_the_banner_is_one_line_and_the_reasons_are_in_the_run_files(tmp_path, cache):
    """Without --verbose, train's banner is one short line (parameters, optimizer, device, precision, threads,
    compile); the reasons behind the runtime choices (threads, OpenMP wait policy, malloc) are in summary.json's
    runtime_notes, and --verbose prints those same lines."""
    out = tmp_path / "r"
    r = run_inproc("train", "tiny", "--set", "train.steps=2", "--set", "train.eval_every=2", "--out", str(out),
                   cache=cache, check=True)
    lines = r.stderr.splitlines()  # progress and banner: stderr (stdout holds the result)
    before = lines[: next(i for i, ln in enumerate(lines) if ln.startswith("step "))]
    assert len(before) == 1 and before[0].startswith(f"train {out}: ")
    assert len(before[0]) - len(str(out)) <= 100
    assert all(w in before[0] for w in ("params", "adamw", "cpu", "thread", "compile"))
    assert "OMP" not in r.stderr and "malloc" not in r.stderr and "not default" not in r.stderr
    notes = json.loads((out / "summary.json").read_text())["runtime_notes"]
    assert any(n.startswith("threads ") and ("OMP_" in n or "GOMP_" in n) for n in notes)
    assert any(n.startswith("malloc") for n in notes) and any(n.startswith("precision ") for n in notes)
    v = run_inproc("train", "tiny", "--set", "train.steps=2", "--set", "train.eval_every=2", "--out",
                   str(tmp_path / "v"), "--verbose", cache=cache, check=True)
    notes_v = json.loads((tmp_path / "v" / "summary.json").read_text())["runtime_notes"]
    assert all(n in v.stderr + v.stdout for n in notes_v if not n.startswith("threads "))


def test_a_run_killed_while_writing_config_yaml_is_not_a_dead_end(tmp_path, cache):
    """kill -9 inside normlab.io.atomic_path's write of config.yaml (the first file of a new run) leaves only its
    temp file: --resume says what happened and what to run (one line, exit 2); train --out reuses the directory,
    removing the temp file with one note line, and the run completes."""
    from tests.helpers import assert_bad_input

    run_dir = tmp_path / "r"
    code = ("import os, sys; from normlab.io import atomic_path\n"
            "with atomic_path(sys.argv[1]) as tmp:\n"
            "    tmp.write_text('model:\\n  wid')\n"
            "    os.kill(os.getpid(), 9)\n")
    run_dir.mkdir()
    proc = subprocess.run([sys.executable, "-c", code, str(run_dir / "config.yaml")], env=cli_env(cache))
    assert proc.returncode == -9
    (temp,) = list(run_dir.iterdir())
    assert temp.name.startswith(".config.yaml.") and temp.name.endswith(".tmp")

    r = run_inproc("train", "--resume", str(run_dir), cache=cache)
    assert_bad_input(r, "holds only temporary files", temp.name, f"--out {run_dir}")
    assert temp.exists()  # --resume changes nothing

    r = run_inproc("train", "tiny", "--set", "train.steps=2", "--set", "train.eval_every=2", "--out", str(run_dir),
                   cache=cache)
    assert r.returncode == 0, r.stderr
    notes = [ln for ln in r.stderr.splitlines() if temp.name in ln]
    assert len(notes) == 1 and notes[0].startswith("note: --out") and "removed" in notes[0]
    assert summary(run_dir)["status"] == "completed" and not temp.exists()

    other = tmp_path / "other"  # a directory with anything else in it is still refused
    other.mkdir()
    (other / ".config.yaml.abcdefgh.tmp").write_text("")
    (other / "notes.txt").write_text("mine")
    assert_bad_input(run_inproc("train", "tiny", "--out", str(other), cache=cache), "is not empty")
    assert (other / "notes.txt").exists() and (other / ".config.yaml.abcdefgh.tmp").exists()
