"""Sweeps: expansion, bad input, the results store under concurrent writers, resume, divergence, Ctrl-C, TensorBoard.

Real trainings are tiny (the ``tiny`` preset, a dozen steps, one thread per worker)."""

from __future__ import annotations

import fcntl
import json
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from normlab.errors import NormlabError
from normlab.resources import plan_workers
from normlab.experiments.store import Store
from normlab.experiments.sweep import list_presets, load_sweep, parse_sweep
from normlab.train.tracking import read_hparams, read_scalars
from tests.helpers import assert_bad_input, cli_env
from tests.helpers import run_inproc as normlab

FAST = {"train.steps": 12, "train.eval_every": 6, "train.eval_batches": 2, "train.log_every": 3,
        "train.checkpoint_every": 6, "diag.every": 6}


def write_sweep(path: Path, **spec) -> Path:
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


# -- expansion ---------------------------------------------------------------------------------------------------
def test_expansion_cartesian_variants_seeds():
    sweep = parse_sweep({
        "name": "x", "base": "tiny", "set": {"train.steps": 5},
        "axes": {"model.depth": [1, 2], "model.norm": ["layernorm", "rmsnorm"]},
        "variants": [{"name": "Post", "set": {"model.placement": "post"}},
                     {"name": "Pre", "set": {"model.placement": "pre"}}],
        "seeds": [0, 1, 7],
    })
    assert len(sweep.runs) == 2 * 2 * 2 * 3
    assert len({r.config_hash for r in sweep.runs}) == 24 and len({r.run_id for r in sweep.runs}) == 24
    assert len(sweep.variants) == 8 and sweep.variants[0] == "Post · depth=1, norm=layernorm"
    for r in sweep.runs:
        c = r.config
        assert c["train"]["steps"] == 5 and c["seed"] == r.seed
        assert c["model"]["depth"] == r.axes["model.depth"] and c["model"]["norm"] == r.axes["model.norm"]
        assert c["model"]["placement"] == {"Post": "post", "Pre": "pre"}[r.axes["variant"]]
    assert [r.seed for r in sweep.runs[:3]] == [0, 1, 7]
    # axes only, variants only; nested sections and dotted keys are the same sweep (same hash)
    only_axes = parse_sweep({"base": "tiny", "axes": {"model.placement": ["pre", "post", "peri"]}})
    assert [r.variant for r in only_axes.runs] == ["placement=pre", "placement=post", "placement=peri"]
    a = parse_sweep({"base": "tiny", "set": {"train": {"steps": 3}, "model.width": 32}, "seeds": [0, 1]})
    b = parse_sweep({"base": "tiny", "set": {"model.width": 32, "train.steps": 3}, "seeds": [0, 1]})
    assert a.hash == b.hash and len(a.runs) == 2 and a.runs[0].variant == "base"


def test_presets_validate():
    assert {"quick", "depth", "attention"} <= set(list_presets())
    quick = load_sweep(preset="quick")
    assert len({r.axes["grid_group"] for r in quick.runs}) == 4
    assert sorted({r.seed for r in quick.runs}) == [1000, 1001, 1002, 1003]
    assert quick.question.declared and len(quick.question.family) <= 3  # few questions, decided
    explore = load_sweep(preset="quick-explore")
    # the old design: exploratory
    assert len({r.axes["grid_group"] for r in explore.runs}) == 6 and not explore.question.declared
    assert {r.config["data"]["source"] for r in quick.runs} == {"pystdlib"}
    assert len(load_sweep(preset="depth").runs) == 30
    dyt = load_sweep(preset="dyt")
    assert len(dyt.runs) == 14
    norms = {r.variant: r.config["model"]["norm"] for r in dyt.runs}
    assert sorted(set(norms.values())) == ["dyt", "layernorm", "none"]
    att = load_sweep(preset="attention")
    assert {r.config["model"]["attention"] for r in att.runs} == {"softmax", "softplus", "linear", "nala",
                                                                  "transnormer"}
    assert len(att.runs) == 20


def test_stored_sweep_file_has_the_same_hash(tmp_path):
    from normlab.experiments.sweep import dump_spec

    s = load_sweep(preset="quick")
    (tmp_path / "sweep.yaml").write_text(dump_spec(s))
    again = load_sweep(tmp_path / "sweep.yaml")
    assert again.hash == s.hash and [r.config for r in again.runs] == [r.config for r in s.runs]


def test_plan_workers_never_oversubscribes():
    for cores in (1, 2, 3, 8, 16):
        for n_runs in (1, 2, 5, 40):
            for asked in (None, 1, 2, 4):
                w, t = plan_workers(n_runs, asked, cores)
                assert w >= 1 and t >= 1 and w <= max(1, n_runs)
                if asked is None or asked <= cores:
                    assert w * t <= cores
    assert plan_workers(14, None, 2) == (2, 1) and plan_workers(1, None, 2) == (1, 2)


@pytest.mark.parametrize(
    "spec, fragments",
    [
        ({"base": "tiny", "axes": {"model.nrom": ["layernorm"]}}, ["model.nrom", "did you mean 'model.norm'"]),
        ({"base": "tiny", "axes": {"model.norm": []}}, ["axis 'model.norm' is empty"]),
        ({"base": "tiny", "axes": {"model.norm": "rmsnorm"}}, ["must be a list"]),
        ({"base": "tiny", "variants": [{"name": "A", "set": {"model.norm": "rmsnorm"}},
                                       {"name": "B", "set": {"model.norm": "rmsnorm"}}]},
         ["variants 'A' and 'B' produce the same config"]),
        ({"base": "tiny", "axes": {"model.depth": [2, 2]}}, ["produce the same config"]),
        ({"base": "tiny", "variants": [{"name": "A", "set": {}}, {"name": "A", "set": {"model.depth": 3}}]},
         ["two variants are named 'A'"]),
        ({"base": "tiny", "variants": [{"name": "A", "set": {"model.norm": "lyernorm"}}]},
         ["variant 'A'", "did you mean 'layernorm'"]),
        ({"base": "tiny", "set": {"seed": 3}}, ["'seed' is set by the sweep's 'seeds:' list"]),
        ({"base": "tiny", "seeds": []}, ["seeds must be a non-empty list"]),
        ({"base": "tiny", "seeds": [0, 0]}, ["duplicate"]),
        ({"base": "tiny", "axis": {"model.depth": [2]}}, ["unknown key 'axis'", "did you mean 'axes'"]),
        ({"axes": {"model.depth": [2]}}, ["'base' is required"]),
        ({"base": "no-such-config"}, ["no-such-config"]),
    ],
)
def test_bad_sweep_input(tmp_path, cache, spec, fragments):
    f = write_sweep(tmp_path / "bad.yaml", **spec)
    out = tmp_path / "out"
    assert_bad_input(normlab("compare", str(f), "--out", str(out), cache=cache), *fragments)
    assert not out.exists()


def test_bad_compare_arguments(tmp_path, cache):
    assert_bad_input(normlab("compare", "--preset", "quik", "--out", str(tmp_path / "o"), cache=cache),
                     "did you mean 'quick'")
    assert_bad_input(normlab("compare", cache=cache), "--preset")
    assert_bad_input(normlab("compare", str(tmp_path / "none.yaml"), cache=cache), "not found")
    (tmp_path / "broken.yaml").write_text("base: tiny\naxes: [\n")
    assert_bad_input(normlab("compare", str(tmp_path / "broken.yaml"), cache=cache), "not valid YAML")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x.txt").write_text("unrelated")
    f = write_sweep(tmp_path / "ok.yaml", base="tiny")
    assert_bad_input(normlab("compare", str(f), "--out", str(tmp_path / "full"), cache=cache),
                     "not a sweep directory")
    assert_bad_input(normlab("compare", str(f), "--out", str(tmp_path / "w0"), "--workers", "0", cache=cache),
                     "--workers must be >= 1")
    assert not (tmp_path / "w0").exists()
    assert_bad_input(normlab("runs", str(tmp_path / "full"), cache=cache), "holds no normlab runs")
    assert_bad_input(normlab("runs", str(tmp_path / "nope"), cache=cache), "does not exist")
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "results.sqlite").write_bytes(b"this is not sqlite" * 100)
    assert_bad_input(normlab("runs", str(tmp_path / "junk"), cache=cache), "not a normlab results store")


# -- a real tiny sweep: divergence, resume, store, TensorBoard ---------------------------------------------------
@pytest.fixture(scope="module")
def sweep(tmp_path_factory, cache):
    d = tmp_path_factory.mktemp("sweep")
    f = write_sweep(d / "s.yaml", name="t", base="tiny", set=FAST, seeds=[0, 1], variants=[
        {"name": "Post-LN", "set": {"model.placement": "post"}},
        {"name": "Boom", "set": {"train.loss_ceiling": 0.1}},  # diverges at step 1
    ])
    out = d / "out"
    first = normlab("compare", str(f), "--out", str(out), "--workers", "2", "--json", cache=cache)
    return f, out, first


def test_diverged_run_recorded_while_others_finish(sweep):
    f, out, first = sweep
    assert first.returncode == 0, first.stderr
    res = json.loads(first.stdout)
    assert res["counts"] == {"completed": 2, "diverged": 2} and res["workers"] * res["threads"] <= 2
    rows = {r["run_id"]: r for r in Store(out / "results.sqlite").runs()}
    assert {k: r["status"] for k, r in rows.items()} == {
        "post-ln-s0": "completed", "post-ln-s1": "completed", "boom-s0": "diverged", "boom-s1": "diverged"}
    assert rows["boom-s0"]["step"] == 1 and rows["boom-s0"]["val_bpb"] is None
    for r in rows.values():
        if r["status"] == "completed":
            s = json.loads((out / "runs" / r["run_id"] / "summary.json").read_text())
            assert r["val_bpb"] == s["val_bpb"] and r["step"] == 12 and r["params"] == s["params"]
            assert r["tokens_per_s"] > 0 and r["wall_s"] > 0 and r["peak_mem_mb"] > 50 and r["train_calls"] == 1
    boom = next(x for x in res["ranking"] if x["variant"] == "Boom")
    assert boom["diverged"] == 2 and boom["rank"] is None
    assert (out / "report.html").is_file() and (out / "report.md").is_file() and (out / "sweep.yaml").is_file()


def test_rerun_skips_finished_runs(sweep, cache):
    f, out, _ = sweep
    before = {r["run_id"]: r["train_calls"] for r in Store(out / "results.sqlite").runs()}
    again = normlab("compare", str(f), "--out", str(out), "--json", cache=cache)
    assert again.returncode == 0, again.stderr
    res = json.loads(again.stdout)
    assert res["trained"] == [] and len(res["skipped"]) == 4
    assert {r["run_id"]: r["train_calls"] for r in Store(out / "results.sqlite").runs()} == before == {
        k: 1 for k in before}
    # the stored, self-contained sweep file is the same sweep
    assert normlab("compare", str(out / "sweep.yaml"), "--out", str(out), "--json", cache=cache).returncode == 0
    # a finished run whose stored resolved config differs (an upgrade changed a default) is named, not hidden
    import sqlite3

    con = sqlite3.connect(out / "results.sqlite")
    (old_hash,) = con.execute("SELECT config_hash FROM runs WHERE run_id = 'post-ln-s0'").fetchone()
    with con:
        con.execute("UPDATE runs SET config_hash = '0000' WHERE run_id = 'post-ln-s0'")
    try:
        stale = normlab("compare", str(f), "--out", str(out), "--json", cache=cache)
        assert stale.returncode == 0 and json.loads(stale.stdout)["trained"] == []
        assert "1 finished run(s) were trained under a different resolved config" in stale.stderr
        assert "post-ln-s0" in stale.stderr and "--out NEW_DIR" in stale.stderr
        assert "different resolved config" not in again.stderr
    finally:
        with con:
            con.execute("UPDATE runs SET config_hash = ? WHERE run_id = 'post-ln-s0'", (old_hash,))
        con.close()


def test_store_curves_and_tensorboard(sweep):
    out = sweep[1]
    store = Store(out / "results.sqlite")
    curves = store.curves("post-ln-s0")["post-ln-s0"]
    metrics = [json.loads(line) for line in (out / "runs" / "post-ln-s0" / "metrics.jsonl").read_text().splitlines()]
    assert curves["val_bpb"] == [(m["step"], m["val_bpb"]) for m in metrics if "val_bpb" in m]
    assert [s for s, _ in curves["loss"]] == [3, 6, 9, 12]
    assert any(k.startswith("diag/") for k in curves)  # training-time diagnostics are stored too
    scalars = read_scalars(out / "tb" / "post-ln-s0")  # written live by the trainer (tensorboardX)
    tags = {t for t, _, _ in scalars}
    assert {"train/loss", "train/lr", "train/grad_norm", "val/bpb"} <= tags
    assert any(t.startswith("diag/") for t in tags)
    val = [(s, v) for t, s, v in scalars if t == "val/bpb"]
    assert val == [(s, pytest.approx(v, rel=1e-6)) for s, v in curves["val_bpb"]]
    hp = read_hparams(out / "tb" / "post-ln-s0")
    assert hp["model.placement"] == "post" and hp["status"] == "STATUS_SUCCESS"


def test_runs_command_formats(sweep, cache):
    _, out, _ = sweep
    js = json.loads(normlab("runs", str(out), "--format", "json", cache=cache, check=True).stdout)
    assert len(js["runs"]) == 4 and js["sweep"] == "t"
    assert json.loads(normlab("runs", str(out), "--json", cache=cache, check=True).stdout) == js
    csv_lines = normlab("runs", str(out), "--format", "csv", cache=cache, check=True).stdout.strip().splitlines()
    assert csv_lines[0].startswith("run_id,variant,seed,status") and len(csv_lines) == 5
    table = normlab("runs", str(out), cache=cache, check=True).stdout
    assert "post-ln-s0" in table and "diverged" in table


def test_other_sweep_file_and_locks_are_one_line_errors(sweep, cache, tmp_path, monkeypatch):
    f, out, _ = sweep
    before = sorted(p.name for p in out.iterdir())
    other = write_sweep(tmp_path / "other.yaml", name="t", base="tiny", set=FAST, seeds=[0])
    assert_bad_input(normlab("compare", str(other), "--out", str(out), cache=cache), "from another sweep file")
    assert sorted(p.name for p in out.iterdir()) == before
    # another compare holds the sweep dir
    with open(out / ".compare.lock", "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert_bad_input(
            normlab("compare", str(f), "--out", str(out), cache=cache), "in use by another normlab compare"
        )
        fcntl.flock(fh, fcntl.LOCK_UN)
    # another process holds SQLite's write lock longer than the busy timeout
    con = sqlite3.connect(str(out / "results.sqlite"), isolation_level=None)
    con.execute("BEGIN IMMEDIATE")
    try:
        monkeypatch.setenv("NORMLAB_DB_TIMEOUT", "0.3")
        assert_bad_input(normlab("compare", str(f), "--out", str(out), cache=cache), "is locked by another process")
    finally:
        con.execute("ROLLBACK")
        con.close()
    assert len(Store(out / "results.sqlite").runs()) == 4


# -- Ctrl-C and resume -------------------------------------------------------------------------------------------
def test_ctrl_c_checkpoints_and_rerun_resumes(tmp_path, cache):
    spec = {**FAST, "train.steps": 100, "train.checkpoint_every": 5, "train.eval_every": 50, "train.log_every": 5}
    f = write_sweep(tmp_path / "long.yaml", name="long", base="tiny", set=spec, seeds=[0])
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "normlab.cli", "compare", str(f), "--out", str(out), "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env(cache))
    ckpts = out / "runs" / "base-s0" / "checkpoints"
    deadline = time.time() + 300  # generous: a loaded machine can take a minute to start a worker
    while time.time() < deadline and not (ckpts.is_dir() and any(ckpts.iterdir())):
        time.sleep(0.05)
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert json.loads(stdout)["status"] == "interrupted"
    row = Store(out / "results.sqlite").get("base-s0")
    assert row["status"] == "interrupted" and 0 < row["step"] < 100 and row["train_calls"] == 1
    stopped_at = row["step"]
    again = normlab("compare", str(f), "--out", str(out), "--json", cache=cache)
    assert again.returncode == 0, again.stderr
    row = Store(out / "results.sqlite").get("base-s0")
    assert row["status"] == "completed" and row["step"] == 100 and row["train_calls"] == 2
    steps = [json.loads(line)["step"] for line in (out / "runs" / "base-s0" / "metrics.jsonl").read_text().splitlines()]
    assert steps == sorted(set(steps)) and steps[-1] == 100 and min(steps) <= stopped_at  # one continuous curve


# -- the store under concurrent writers --------------------------------------------------------------------------
FAKE_WRITER = """
import json, sys
from pathlib import Path
from normlab.experiments.store import Store
from normlab.experiments.worker import record

d, worker, n = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
store = Store(d / "results.sqlite")
for i in range(n):
    rid = f"w{worker}-r{i}"
    run_dir = d / "runs" / rid
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text("".join(
        json.dumps({"step": s, "loss": 3.0 - s / 100, "lr": 1e-3, "grad_norm": 0.5, "val_bpb": 4.0 - s / 50}) + "\\n"
        for s in range(1, 21)))
    store.start(rid, calls_trainer=True)
    record(store, d, rid, {"status": "completed", "step": 20, "steps": 20, "val_bpb": 4.0 - worker / 10 - i / 1000,
                           "best_val_bpb": 3.5, "tokens_per_s": 1000.0, "elapsed_s": 1.0, "params": 10},
               peak_mem_mb=1.0)
"""


def test_concurrent_workers_lose_no_rows(tmp_path):
    workers, per = 4, 25
    store = Store(tmp_path / "results.sqlite")
    store.create("fake", "0" * 16)
    store.register([{"run_id": f"w{w}-r{i}", "position": w * per + i, "variant": f"v{w}", "seed": i, "config_hash": "h",
                     "axes": {}, "overrides": {}, "config": {}} for w in range(workers) for i in range(per)])
    # separate processes (no torch import: the recording path is light), all writing at once
    procs = [subprocess.Popen([sys.executable, "-c", FAKE_WRITER, str(tmp_path), str(w), str(per)],
                              stderr=subprocess.PIPE, text=True) for w in range(workers)]
    errs = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0] * workers, errs
    rows = store.runs()
    assert len(rows) == workers * per and all(r["status"] == "completed" for r in rows)
    assert all(r["val_bpb"] == pytest.approx(4.0 - int(r["run_id"][1]) / 10 - int(r["run_id"].split("r")[-1]) / 1000)
               for r in rows)
    curves = store.curves()
    assert len(curves) == workers * per and all(
        len(c["loss"]) == 20 and len(c["val_bpb"]) == 20 for c in curves.values()
    )
    with sqlite3.connect(str(tmp_path / "results.sqlite")) as con:
        assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert con.execute("SELECT COUNT(*) FROM curves").fetchone()[0] == workers * per * 20 * 4


def test_store_rejects_unknown_columns(tmp_path):
    store = Store(tmp_path / "results.sqlite")
    store.create("s", "h")
    with pytest.raises(ValueError):
        store.update("x", nonsense=1)
    with pytest.raises(NormlabError, match="not in"):
        store.get("missing")


# -- stacked groups (normlab.train.stacked through the runner) ---------------------------------------------------
def test_compare_stack_on_trains_each_variant_as_one_group(tmp_path, cache, monkeypatch):
    """``normlab compare --stack on``: each variant's seeds and learning rates train as one stacked group in the
    driver; every run gets its own directory, store row and curves, equal to fp32 round-off to the same sweep run
    with ``--stack off``; a variant with dropout stacks on a CPU, one with running statistics (BatchNorm) trains alone
    (the reason is logged). ``auto`` on a CPU stacks nothing."""
    from normlab.experiments.sweepdir import run_sweep
    from normlab.experiments.worker import plan_stacks

    monkeypatch.setenv("NORMLAB_CACHE_DIR", str(cache))
    spec = {"name": "stk", "base": "tiny",
            "set": {**FAST, "diag.every": 0, "model.width": 32, "model.context": 32, "train.batch_size": 4,
                    "train.precision": "fp32", "train.compile": False, "train.track": []},
            "variants": [{"name": "ln", "set": {}}, {"name": "rms", "set": {"model.norm": "rmsnorm"}},
                         {"name": "drop", "set": {"model.dropout": 0.1}},
                         {"name": "bn", "set": {"model.norm": "batchnorm"}}],
            "axes": {"train.lr": [0.003, 0.006]}, "seeds": [0, 1]}
    sweep = parse_sweep(spec)
    groups, alone, why = plan_stacks({r.run_id: r.config for r in sweep.runs}, "on")
    assert sorted(map(len, groups)) == [4, 4, 4] and len(alone) == 4 and "running statistics" in why
    assert plan_stacks({r.run_id: r.config for r in sweep.runs}, "off")[0] == []
    # planned for a CUDA device elsewhere (a Ray cluster's GPUs), the dropout variant trains alone, as the group's
    # own check on that device would decide (it was judged for this CPU and refused there)
    g_cuda, alone_cuda, why_cuda = plan_stacks({r.run_id: r.config for r in sweep.runs}, "on", cuda=True)
    assert sorted(map(len, g_cuda)) == [4, 4] and len(alone_cuda) == 8 and "model.dropout=0.1 on CUDA" in why_cuda
    if not any(Path("/dev").glob("nvidia[0-9]*")):
        assert plan_stacks({r.run_id: r.config for r in sweep.runs}, "auto")[0] == []
    small = parse_sweep({**spec, "variants": spec["variants"][:2], "axes": {"train.lr": [0.003]}})
    logs: list[str] = []
    on = run_sweep(small, tmp_path / "on", workers=1, threads=1, inline=True, stack="on", log=logs.append)
    off = run_sweep(small, tmp_path / "off", workers=1, threads=1, inline=True, stack="off", log=lambda s: None)
    assert on.status == off.status == "completed" and any("2 group(s) of 4 runs stacked" in m for m in logs)
    rows_on = {r["run_id"]: r for r in on.runs}
    for r in off.runs:
        assert rows_on[r["run_id"]]["status"] == "completed", rows_on[r["run_id"]].get("error")
        assert r["val_bpb"] is not None
        assert rows_on[r["run_id"]]["val_bpb"] == pytest.approx(r["val_bpb"], rel=1e-5)
        assert len(Store(tmp_path / "on" / "results.sqlite").curves(r["run_id"])) > 0


def test_config_stack_on_logs_why_a_group_trains_alone(tmp_path, cache, monkeypatch):
    """``train.stack: on`` in the sweep (no --stack): a group that cannot stack (BatchNorm's running statistics)
    trains alone and the log names why, as with ``--stack on`` (nothing was logged: the note was shown only for
    --stack on or when some group stacked)."""
    from normlab.experiments.sweepdir import run_sweep

    monkeypatch.setenv("NORMLAB_CACHE_DIR", str(cache))
    sweep = parse_sweep({"name": "stk-bn", "base": "tiny", "seeds": [0, 1],
                         "set": {**FAST, "diag.every": 0, "model.width": 32, "model.context": 32,
                                 "train.batch_size": 4, "train.stack": "on", "train.track": []},
                         "variants": [{"name": "bn", "set": {"model.norm": "batchnorm"}}]})
    logs: list[str] = []
    out = run_sweep(sweep, tmp_path / "s", workers=1, threads=1, inline=True, log=logs.append)
    assert out.status == "completed"
    assert any("train alone" in m and "running statistics" in m for m in logs), logs


def test_worker_bad_input_prints_control_characters_as_escapes(tmp_path, capsys):
    """The sweep worker's own one-line errors (its log file, its stderr) escape a directory name's ESC and newline."""
    from normlab.experiments.worker import main

    assert main([str(tmp_path / "x\x1b[2J\ny"), "r0"]) == 2
    err = capsys.readouterr().err
    assert err == f"error: {tmp_path}/x\\x1b[2J\\ny is not a sweep directory (no results.sqlite)\n"
