"""Hardening (issue 17): every bad input a one-line error with exit 2, faults with their documented status, nothing
half-written, no data lost. Table-driven: each reproduction of the issue is one row, together with clean cases
that already passed (so they stay clean).

Rows run the CLI in-process (``run_inproc``) against one tiny finished run shared by the module; each row that
could write something checks that nothing was written (or that what was there is unchanged).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from tests.helpers import assert_bad_input, run_inproc

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = ["--set", "train.steps=8", "--set", "train.eval_every=4", "--set", "train.checkpoint_every=4",
        "--set", "train.log_every=2", "--set", "train.eval_batches=1", "--set", "model.depth=1",
        "--set", "diag.every=0"]


def tree(d: Path) -> dict[str, str]:
    """``{relative path: sha256}`` of every file under ``d`` (empty when ``d`` does not exist)."""
    if not d.exists():
        return {}
    return {str(p.relative_to(d)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(d.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def run(tmp_path_factory, cache):
    """One finished tiny run (8 steps, checkpoints at 4 and 8)."""
    out = tmp_path_factory.mktemp("run") / "r"
    run_inproc("train", "tiny", *TINY, "--out", str(out), cache=cache, check=True)
    return out


@pytest.fixture()
def run_copy(run, tmp_path):
    """A private copy of the finished run a row may damage."""
    dst = tmp_path / "rc"
    shutil.copytree(run, dst, symlinks=True)
    return dst


# ------------------------------------------------------------------------------------ numbers and limits
BAD_SET = [  # (--set KEY=VALUE, fragments of the one-line error)
    ("train.lr=.nan", ["train.lr must be > 0", "nan"]),
    ("train.lr=.inf", ["train.lr must be > 0", "inf"]),
    ("train.beta1=-1", ["train.beta1 must be in [0, 1)", "-1"]),
    ("train.beta2=2", ["train.beta2 must be in [0, 1)", "2"]),
    ("model.init_std=.nan", ["model.init_std must be > 0"]),
    ("model.mlp_ratio=.inf", ["model.mlp_ratio must be in (0, 64]"]),
    ("seed=99999999999999999999999", ["seed must be <= 9223372036854775807", "99999999999999999999999"]),
    ("seed=-1", ["seed must be >= 0"]),
    ("model.width=1000000000", ["model.width must be <= 65536"]),
    ("model.depth=1000000", ["model.depth must be <= 4096"]),
    ("train.batch_size=1000000000000", ["train.batch_size must be <= 1048576"]),
    ("model.rope_base=-1", ["model.rope_base must be > 0"]),
    ("model.rope_base=.nan", ["model.rope_base must be > 0"]),
    ("model.norm_eps=.nan", ["model.norm_eps must be > 0"]),
    ("model.logit_softcap=.nan", ["model.logit_softcap must be > 0"]),
    ("train.grad_clip=.nan", ["train.grad_clip must be >= 0"]),
    ("train.loss_ceiling=.nan", ["train.loss_ceiling must be > 0"]),
    ("train.z_loss=.nan", ["train.z_loss must be >= 0"]),
    ("model.norm_options.alpha_init=.nan", ["model.norm_options.alpha_init must be a finite number"]),
    ("model.width=8192", ["training needs an estimated", "GiB", "available", "train.batch_size"]),  # memory check
    # a value starting with '*' is text (no anchor can precede it), checked like any other value of its key
    ("data.source=*foo", ["corpus path '*foo' does not exist"]),
    ("model.norm=*foo", ["unknown norm '*foo'", "allowed: batchnorm"]),
    ("model.norm_options={a: &x [1], b: *x}", ["--set model.norm_options", "YAML aliases (*x) are not allowed"]),
]


@pytest.mark.parametrize("item,fragments", BAD_SET, ids=[b[0] for b in BAD_SET])
def test_bad_number_is_one_line_and_writes_nothing(item, fragments, tmp_path, cache):
    extra = ["--set", "model.depth=64"] if item == "model.width=8192" else []
    out = tmp_path / "out"
    assert_bad_input(run_inproc("train", "tiny", *extra, "--set", item, "--out", str(out), cache=cache), *fragments)
    assert not out.exists()


def test_memory_estimate_is_checked_against_available_memory(monkeypatch, tmp_path, cache):
    from normlab.config import load_config
    from normlab.validate import check_train_memory, param_count

    cfg = load_config("tiny")
    cfg.model.vocab_size = 256
    n = param_count(cfg.model)
    from normlab.model import build_model

    assert abs(n - build_model(cfg.model).num_params()) / n < 0.05  # the estimate's parameter count is close
    monkeypatch.setenv("NORMLAB_MEMORY_GB", "0.0001")
    with pytest.raises(Exception, match="needs an estimated"):
        check_train_memory(cfg)
    monkeypatch.setenv("NORMLAB_MEMORY_GB", "64")
    check_train_memory(cfg)


BAD_FLAGS = [  # (command line after the run dir is substituted for RUN, fragments)
    (["eval", "RUN", "--stride", "0"], ["--stride must be >= 1"]),
    (["eval", "RUN", "--context", "0"], ["--context must be >= 1"]),
    (["eval", "RUN", "--batch-size", "100000000"], ["--batch-size must be <= 65536"]),
    (["generate", "RUN", "--prompt", "a", "--seed", "99999999999999999999999"], ["--seed must be <= "]),
    (["extrapolate", "RUN", "--factors", "1e308"], ["--factors must be numbers > 0 and <= 4096", "1e308"]),
    (["extrapolate", "RUN", "--memory-gb", "nan"], ["--memory-gb must be in (0, "]),
    (["diagnose", "RUN", "--sequences", "100000"], ["--sequences must be <= 4096"]),
    (["calibrate", "RUN", "--max-tokens", "-1"], ["--max-tokens must be >= 0"]),
    (["claims", "--only", ",", "--out", "OUT"], ["--only needs at least one claim name"]),
    (["compare", "--preset", "quick", "--workers", "0", "--out", "OUT"], ["--workers must be >= 1"]),
]


@pytest.mark.parametrize("argv,fragments", BAD_FLAGS, ids=[" ".join(a[:1] + a[2:4]) for a, _ in BAD_FLAGS])
def test_bad_flag_is_one_line_and_writes_nothing(argv, fragments, run_copy, tmp_path, cache):
    before = tree(run_copy)
    argv = [str(run_copy) if a == "RUN" else str(tmp_path / "o") if a == "OUT" else a for a in argv]
    assert_bad_input(run_inproc(*argv, cache=cache), *fragments)
    assert tree(run_copy) == before and not (tmp_path / "o").exists()


CLEAN_FLAGS = [  # valid edge values that already worked
    (["eval", "RUN", "--stride", "16", "--max-tokens", "256", "--json"], "bpb"),
    (["eval", "RUN", "--context", "32", "--max-tokens", "256", "--json"], "bpb"),
    (["generate", "RUN", "--prompt", "ab", "--max-new-tokens", "3", "--seed", "9223372036854775807", "--json"],
     "tokens"),
    (["generate", "RUN", "--prompt", "\udcff\udcfe", "--max-new-tokens", "2", "--json"], "tokens"),  # $'\xff\xfe'
]


@pytest.mark.parametrize("argv,key", CLEAN_FLAGS, ids=[" ".join(a[:1] + a[2:4]) for a, _ in CLEAN_FLAGS])
def test_clean_flags_still_work(argv, key, run, cache):
    proc = run_inproc(*[str(run) if a == "RUN" else a for a in argv], cache=cache)
    assert proc.returncode == 0, proc.stderr
    assert key in json.loads(proc.stdout)


def test_generate_streams_undecodable_prompt(run, cache):
    """``generate --prompt $'\\xff\\xfe'`` streams (the prompt shown with U+FFFD), no UnicodeEncodeError."""
    proc = run_inproc("generate", str(run), "--prompt", "\udcff\udcfe", "--max-new-tokens", "2", cache=cache)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("\ufffd\ufffd")


# ------------------------------------------------------------------------------------ inputs that hung or exploded
def test_fifo_and_device_sources_are_refused(tmp_path, cache):
    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    for src in (str(fifo), "/dev/zero"):
        out = tmp_path / "o"
        assert_bad_input(run_inproc("train", "tiny", "--set", f"data.source={src}", "--out", str(out), cache=cache),
                         "not a regular file or directory", src)
        assert not out.exists()


ALIAS_BOMB = """name: bomb
base: tiny
a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]
b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]
c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]
description: [*c, *c, *c, *c, *c, *c, *c, *c, *c]
"""


def test_yaml_alias_bomb_is_refused(tmp_path, cache):
    sweep = tmp_path / "bomb.yaml"
    sweep.write_text(ALIAS_BOMB)
    assert_bad_input(run_inproc("compare", str(sweep), "--out", str(tmp_path / "s"), cache=cache),
                     "YAML aliases", str(sweep))
    assert not (tmp_path / "s").exists()
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("seed: 0\nmodel: &m {width: 64}\ndata: *m\n")
    assert_bad_input(run_inproc("train", str(cfg), "--out", str(tmp_path / "o"), cache=cache), "YAML aliases", "cfg")


# ------------------------------------------------------------------------------------ run-directory readers, OS errors
def _damage(name: str):
    """Row helpers: each damages a copy of the finished run as the issue did."""
    def summary_list(d: Path) -> None:
        (d / "summary.json").write_text("[1]")

    def touch_diagnostics(d: Path) -> None:
        shutil.rmtree(d / "diagnostics", ignore_errors=True)
        (d / "diagnostics").write_text("")

    def mkdir_eval(d: Path) -> None:
        (d / "eval_val.json").unlink(missing_ok=True)
        (d / "eval_val.json").mkdir()

    def mkdir_reliability(d: Path) -> None:
        (d / "reliability.png").unlink(missing_ok=True)
        (d / "reliability.png").mkdir()

    def symlink_diagnostics(d: Path) -> None:
        outside = d.parent / "outside"
        outside.mkdir()
        shutil.rmtree(d / "diagnostics", ignore_errors=True)
        (d / "diagnostics").symlink_to(outside)

    return {"summary_list": summary_list, "touch_diagnostics": touch_diagnostics, "mkdir_eval": mkdir_eval,
            "mkdir_reliability": mkdir_reliability, "symlink_diagnostics": symlink_diagnostics}[name]


DAMAGED_RUN = [  # (damage, command after RUN, fragments, files that must not appear)
    ("summary_list", ["diagnose", "RUN"], ["summary", "must hold a JSON object", "summary.json"], ["diagnostics.json"]),
    ("summary_list", ["train", "--resume", "RUN"], ["summary", "must hold a JSON object"], []),
    ("touch_diagnostics", ["diagnose", "RUN"], ["diagnostics", "is a file, not a directory"], ["diagnostics.json"]),
    ("mkdir_eval", ["eval", "RUN", "--max-tokens", "256"], ["eval_val.json", "is a directory"], []),
    ("mkdir_reliability", ["calibrate", "RUN", "--max-tokens", "256"], ["reliability.png", "is a directory"],
     ["calibration.json"]),
    ("symlink_diagnostics", ["diagnose", "RUN"], ["refusing to write", "outside"], ["diagnostics.json"]),
]


@pytest.mark.parametrize("damage,argv,fragments,absent", DAMAGED_RUN,
                         ids=[f"{d}-{a[0]}" for d, a, _, _ in DAMAGED_RUN])
def test_damaged_run_dir_is_one_line(damage, argv, fragments, absent, run_copy, cache):
    _damage(damage)(run_copy)
    before = tree(run_copy)
    outside = tree(run_copy.parent / "outside")
    argv = [str(run_copy) if a == "RUN" else a for a in argv]
    assert_bad_input(run_inproc(*argv, cache=cache), *fragments)
    assert tree(run_copy) == before and tree(run_copy.parent / "outside") == outside  # nothing (half-)written
    for name in absent:
        assert not (run_copy / name).exists()


def test_junk_and_non_utf8_metrics_lines_are_skipped(run_copy, cache):
    from normlab.experiments.worker import read_metrics

    good = sorted({s for s, _, _ in read_metrics(run_copy / "metrics.jsonl")})
    assert 3 not in good and good[-1] == 8  # step 0 (loss at initialisation), then every log_every steps
    with open(run_copy / "metrics.jsonl", "ab") as f:
        f.write(b"junk\n\xff\xfe{\"step\": 3}\n[1, 2]\n")
    proc = run_inproc("diagnose", str(run_copy), "--sequences", "2", "--json", cache=cache)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["training"]["records"] == 0  # diag.every=0: no diag records, none invented
    steps = sorted({s for s, _, _ in read_metrics(run_copy / "metrics.jsonl")})
    assert steps == good  # the good lines, nothing from the junk


def test_out_an_existing_file(tmp_path, cache):
    f = tmp_path / "taken"
    f.write_text("keep me")
    assert_bad_input(run_inproc("train", "tiny", *TINY, "--out", str(f), cache=cache), "is a file", str(f))
    assert f.read_text() == "keep me"


@pytest.mark.parametrize("err,fragment", [(errno.EROFS, "Read-only file system"), (errno.ENOSPC, "No space left"),
                                          (errno.EACCES, "Permission denied")])
def test_os_errors_are_one_line_naming_the_path(err, fragment, run_copy, monkeypatch, cache):
    """A read-only file system, a full disk, a permission error while writing eval_val.json: one line with the
    path, exit 2, the old file untouched and no temp file left."""
    real = os.replace

    def failing(src, dst, *a, **k):
        if str(dst).endswith("eval_val.json"):
            raise OSError(err, os.strerror(err), str(dst))
        return real(src, dst, *a, **k)

    before = tree(run_copy)
    monkeypatch.setattr(os, "replace", failing)
    proc = run_inproc("eval", str(run_copy), "--max-tokens", "256", cache=cache)
    assert_bad_input(proc, fragment, "eval_val.json")
    assert tree(run_copy) == before


READ_ONLY = [  # (command after RUN, the path whose write fails, where the output would go)
    (["train", "tiny", *TINY, "--out", "NEW"], "config.yaml", "NEW"),
    (["convert", "RUN", "--to", "rmsnorm", "--max-tokens", "256", "--out", "NEW"], "NEW", "NEW"),
    (["extrapolate", "RUN", "--factors", "1", "--max-tokens", "256"], "extrapolation.json", None),
]


@pytest.mark.parametrize("argv,victim,new", READ_ONLY, ids=[r[0][0] for r in READ_ONLY])
def test_read_only_file_system_is_one_line_and_a_retry_works(argv, victim, new, run_copy, tmp_path, monkeypatch,
                                                             cache):
    """The issue's read-only file system for train / convert / extrapolate (eval: the row above): the write that
    fails raises EROFS; one line naming the path, exit 2, the run unchanged, no temporary files, and the same
    command succeeds once the file system is writable again."""
    real = os.replace
    out = tmp_path / "new"
    argv = [str(run_copy) if a == "RUN" else str(out) if a == "NEW" else a for a in argv]
    target = str(out) if victim == "NEW" else victim

    def failing(src, dst, *a, **k):
        if str(dst).endswith(target):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(dst))
        return real(src, dst, *a, **k)

    before = tree(run_copy)
    monkeypatch.setattr(os, "replace", failing)
    assert_bad_input(run_inproc(*argv, cache=cache), "Read-only file system", victim if victim != "NEW" else "new")
    monkeypatch.setattr(os, "replace", real)
    assert tree(run_copy) == before
    assert not [p for p in tmp_path.rglob(".*") if p.name not in (".train.lock",)], "temporary files left"
    if new and out.exists():  # a failed train may leave its empty or config-less directory: it must not block a retry
        assert not (out / "config.yaml").exists()
    proc = run_inproc(*argv, cache=cache)
    assert proc.returncode == 0, proc.stderr


def test_disk_full_during_the_final_checkpoint_stays_resumable(run, tmp_path, monkeypatch, cache):
    """safetensors' error on a full disk is one line (exit 2); nothing corrupt is left and --resume after freeing
    space ends with the same weights as an uninterrupted run."""
    import normlab.run.tensors as nio  # tensor files are written beside the checkpoint code
    from safetensors import SafetensorError

    from tests.helpers import assert_same_weights

    real = nio.save_file

    def full(tensors, path, metadata=None):
        if "step_00000008" in str(path):
            raise SafetensorError("Error while serializing: IoError(Os { code: 28, kind: StorageFull })")
        return real(tensors, path, metadata=metadata)

    out = tmp_path / "r"
    monkeypatch.setattr(nio, "save_file", full)
    proc = run_inproc("train", "tiny", *TINY, "--out", str(out), cache=cache)
    last = proc.stderr.strip().splitlines()[-1]  # progress lines came first; the error is one line, no traceback
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert last.startswith("error: cannot write") and "step_00000008" in last
    monkeypatch.setattr(nio, "save_file", real)
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["step_00000004"]  # no temp dir, no partial one
    assert not (out / "summary.json").exists()
    proc = run_inproc("train", "--resume", str(out), "--json", cache=cache)
    assert proc.returncode == 0, proc.stderr
    assert_same_weights(out, run)


# ------------------------------------------------------------------------------------ kill -9 window, summary, JSON
def test_kill_9_between_final_checkpoint_and_summary_keeps_metrics(run, tmp_path, cache):
    """Issue row 1: the final checkpoint carries the final metrics, so a resume restores them (not null)."""
    x = tmp_path / "x"
    shutil.copytree(run, x)
    (x / "model.safetensors").unlink()
    (x / "summary.json").unlink()
    proc = run_inproc("train", "--resume", str(x), "--json", cache=cache)
    assert proc.returncode == 0, proc.stderr
    got, ref = json.loads(proc.stdout), json.loads((run / "summary.json").read_text())
    for k in ("val_bpb", "val_loss", "train_loss", "best_val_bpb"):
        assert got[k] is not None and got[k] == ref[k], k
    assert (x / "model.safetensors").read_bytes() == (run / "model.safetensors").read_bytes()


def test_identical_runs_give_identical_model_files(run, tmp_path, cache):
    """sha256 of model.safetensors (and of each checkpoint's files) equal between identical runs."""
    out = tmp_path / "again"
    run_inproc("train", "tiny", *TINY, "--out", str(out), cache=cache, check=True)
    for rel in ("model.safetensors", "checkpoints/step_00000008/model.safetensors",
                "checkpoints/step_00000008/optim.safetensors"):
        assert hashlib.sha256((out / rel).read_bytes()).digest() == hashlib.sha256((run / rel).read_bytes()).digest()
    import struct

    raw = (out / "model.safetensors").read_bytes()
    header = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])  # dicts keep the file's key order
    assert list(header["__metadata__"]) == sorted(header["__metadata__"]) == ["config_hash", "format"]


def test_strict_json_everywhere(tmp_path, cache):
    """A run that diverges on a NaN loss: summary.json, metrics.jsonl and --json hold null, never bare NaN."""
    from normlab.io import dumps, strict

    assert strict({"a": float("nan"), "b": [float("inf"), 1.0]}) == {"a": None, "b": [None, 1.0]}
    assert dumps({"x": float("-inf")}) == '{"x": null}'
    out = tmp_path / "d"
    proc = run_inproc("train", "tiny", *TINY, "--set", "train.lr=1e30", "--set", "train.grad_clip=0",
                      "--set", "train.warmup_steps=0", "--out", str(out), "--json", cache=cache)
    assert proc.returncode == 3, proc.stderr

    def bad(c: str):
        raise AssertionError(f"bare {c} in JSON")

    s = json.loads(proc.stdout, parse_constant=bad)
    assert s["status"] == "diverged"
    json.loads((out / "summary.json").read_text(), parse_constant=bad)
    for line in (out / "metrics.jsonl").read_text().splitlines():
        json.loads(line, parse_constant=bad)


def test_stale_temp_dirs_are_cleaned_and_resume_is_locked(run_copy, cache):
    from normlab.io import exclusive_lock

    stale = run_copy / "checkpoints" / ".step_00000012.abcd1234"
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"partial")
    tmpfile = run_copy / ".summary.json.x1y2.tmp"
    tmpfile.write_text("{")
    (run_copy / "summary.json").unlink()  # so --resume really opens the run
    with exclusive_lock(run_copy / ".train.lock", "test"):
        assert_bad_input(run_inproc("train", "--resume", str(run_copy), cache=cache), "in use by another normlab",
                         str(run_copy))
    assert stale.exists()  # a refused resume touches nothing
    proc = run_inproc("train", "--resume", str(run_copy), "--json", cache=cache)
    assert proc.returncode == 0, proc.stderr
    assert not stale.exists() and not tmpfile.exists()


def test_convert_cleans_its_stale_temp_dir(run, tmp_path, cache):
    out = tmp_path / "conv"
    stale = tmp_path / ".conv.k9k9k9k9"
    stale.mkdir()
    (stale / "config.yaml").write_text("half")
    proc = run_inproc("convert", str(run), "--to", "rmsnorm", "--out", str(out), "--max-tokens", "256", cache=cache)
    assert proc.returncode == 0, proc.stderr
    assert not stale.exists() and (out / "model.safetensors").is_file()


# ------------------------------------------------------------------------------------ sweeps, stores, reports
HOSTILE = [  # (variant, seed, status, final val bpb): names as an attacker would choose them
    ("<script>alert(1)</script>", 0, "completed", 1.5), ("<script>alert(1)</script>", 1, "completed", 1.6),
    ("[/bold]x", 0, "completed", 1.7), ("[/bold]x", 1, "completed", None), ("a|b*_c_", 0, "completed", 1.8),
]


def make_sweep(d: Path, rows=HOSTILE) -> Path:
    """A sweep directory with a results store holding finished rows (no training needed)."""
    from normlab.config import load_config
    from normlab.experiments.store import Store

    d.mkdir()
    st = Store(d / "results.sqlite")
    st.create("hostile", "h0")
    cfg = load_config("tiny").to_dict()
    st.register([{"run_id": f"r{i}", "position": i, "variant": v, "seed": s, "config_hash": "c", "axes": {},
                  "overrides": {"model.norm": v}, "config": cfg} for i, (v, s, _, _) in enumerate(rows)])
    for i, (_, _, status, val) in enumerate(rows):
        st.finish(f"r{i}", {"status": status, "val_bpb": val, "best_val_bpb": val, "step": 8, "steps": 8,
                            "tokens_per_s": 100.0}, [(4, "val_bpb", 2.0), (8, "val_bpb", 1.5)])
    return d


def test_report_escapes_names_and_prints_them_literally(tmp_path, cache):
    s = make_sweep(tmp_path / "s")
    proc = run_inproc("report", str(s), cache=cache)
    assert proc.returncode == 0, proc.stderr
    assert "[/bold]x" in proc.stdout  # printed as written, not read as rich markup
    md, page = (s / "report.md").read_text(), (s / "report.html").read_text()
    assert "<script>" not in md and "&lt;script&gt;alert(1)&lt;/script&gt;" in md
    assert "<script>alert" not in page
    assert "<details><summary>&lt;script&gt;" in md  # also inside the <details> block
    assert "| a\\|b\\*\\_c\\_ |" in md  # Markdown punctuation of a name cannot break the table or add emphasis
    # the seed without a final result is named, not silently dropped
    summary = json.loads(run_inproc("report", str(s), "--json", cache=cache).stdout)["summary"]
    assert any(line.startswith("[/bold]x: 1 of 2 seeds have no final result (r3") for line in summary), summary
    proc = run_inproc("runs", str(s), cache=cache)
    assert proc.returncode == 0 and "[/bold]x" in proc.stdout, proc.stderr
    assert_bad_input(run_inproc("eval", str(tmp_path / "a[/bold]"), cache=cache), "a[/bold]", "does not exist")


def test_report_surgery_sections_escape_names(tmp_path, cache):
    """report --quantize --label-free: the W4 rows and the label-free section carry hostile variant names escaped
    in report.md (entities + backslashed Markdown) and report.html, as the rest of the report does."""
    from normlab.surgery.robustness import FORMAT

    rows = [(v, s, "completed", 1.5 + i / 10) for i, (v, s, _, _) in enumerate(HOSTILE)]
    s = make_sweep(tmp_path / "s", rows)
    for i in range(len(rows)):
        r = s / "runs" / f"r{i}"
        r.mkdir(parents=True)
        (r / "quant_robustness.json").write_text(json.dumps({
            "settings": {"format": FORMAT, "max_tokens": 8192, "bits": 4}, "bpb": 2.0, "w4_rtn": 0.01 + i / 100,
            "w4_hadamard": 0.005, "hadamard_error": None, "max_act_outlier_ratio": 3.0}))
        (r / "label_free.json").write_text(json.dumps({
            "settings": {"format": FORMAT, "max_tokens": 8192}, "mano": 0.5 - i / 100,
            "matrix_nuclear_norm": 1.0 + i, "loss": 2.0 + i / 10, "bpb": 3.0}))
    proc = run_inproc("report", str(s), "--quantize", "--label-free", cache=cache)
    assert proc.returncode == 0, proc.stderr
    md, page = (s / "report.md").read_text(), (s / "report.html").read_text()
    block = md[md.index("## Label-free metrics"):].split("\n## ")[0]
    assert "| &lt;script&gt;alert(1)&lt;/script&gt; | " in block and "| \\[/bold\\]x | " in block
    assert "| a\\|b\\*\\_c\\_ | " in block  # a name cannot break the table or add emphasis
    assert "<script>" not in md and "<script>alert" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;</td>" in page[page.index("Label-free metrics"):]


CORRUPT_STORE = [  # (SQL, command, fragments)
    ("UPDATE runs SET config_json='{bad'", "runs", ["results.sqlite", "is damaged", "config_json"]),
    ("UPDATE runs SET config_json='{bad'", "report", ["results.sqlite", "is damaged", "config_json"]),
    ("UPDATE curves SET value='abc'", "report", ["results.sqlite", "is damaged", "'abc'"]),
    ("UPDATE runs SET val_bpb='x'", "runs", ["results.sqlite", "val_bpb", "not a number"]),
]


@pytest.mark.parametrize("sql,cmd,fragments", CORRUPT_STORE, ids=[f"{c}: {q[:30]}" for q, c, _ in CORRUPT_STORE])
def test_corrupted_store_is_one_line(sql, cmd, fragments, tmp_path, cache):
    import sqlite3

    s = make_sweep(tmp_path / "s", HOSTILE[:2])
    con = sqlite3.connect(s / "results.sqlite")
    con.execute(sql)
    con.commit()
    con.close()
    assert_bad_input(run_inproc(cmd, str(s), cache=cache), *fragments)
    assert not (s / "report.md").exists()


def test_sweep_never_dies_on_a_missing_metric(tmp_path):
    """Issue row 1 in a sweep: a completed summary without val_bpb is recorded as failed (so the next compare
    re-runs it), the coordinator's progress line does not crash on it, and the worker does not treat it as done."""
    from normlab.experiments.progress import describe_row
    from normlab.experiments.store import FINAL, Store
    from normlab.experiments.worker import record

    s = make_sweep(tmp_path / "s", HOSTILE[:1])
    (s / "runs" / "r0").mkdir(parents=True)
    record(Store(s / "results.sqlite"), s, "r0", {"status": "completed", "step": 8, "steps": 8, "val_bpb": None},
           peak_mem_mb=1.0)
    row = Store(s / "results.sqlite").get("r0")
    assert row["status"] == "failed" and row["status"] not in FINAL and "val_bpb" in row["error"]
    assert "n/a" in describe_row({**row, "status": "completed"})


def _popen_train(args: list[str], cache: Path):
    import subprocess
    import sys

    from tests.helpers import cli_env

    return subprocess.Popen([sys.executable, "-m", "normlab.cli", *args], env=cli_env(cache),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_ctrl_c_twice_before_the_loop_writes_summary(tmp_path, cache):
    import signal
    import time

    out = tmp_path / "r"
    proc = _popen_train(["train", "tiny", *TINY, "--set", "train.steps=400", "--out", str(out)], cache)
    deadline = time.time() + 120
    while not (out / "config.yaml").exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    s = json.loads((out / "summary.json").read_text())
    assert s["status"] == "interrupted" and s["steps"] == 400



@pytest.mark.parametrize("poison,fragment", [("nan", "contains NaN or inf"), ("int64", "has dtype torch.int64")])
def test_poisoned_weights_are_refused(poison, fragment, run_copy, cache):
    import torch
    from safetensors.torch import load_file, save_file

    path = run_copy / "model.safetensors"
    t = load_file(str(path))
    name = sorted(t)[0]
    t[name] = torch.full_like(t[name], float("nan")) if poison == "nan" else t[name].to(torch.int64)
    save_file(t, str(path))
    before = tree(run_copy)
    assert_bad_input(run_inproc("eval", str(run_copy), "--max-tokens", "256", cache=cache), fragment, name)
    assert tree(run_copy) == before


def test_report_never_writes_through_a_symlink_out_of_the_sweep_dir(tmp_path, cache):
    s = make_sweep(tmp_path / "s", HOSTILE[:2])
    victim = tmp_path / "victim.md"
    victim.write_text("precious")
    (s / "report.md").symlink_to(victim)
    assert_bad_input(run_inproc("report", str(s), cache=cache), "refusing to write", "report.md")
    assert victim.read_text() == "precious" and not (s / "report.html").exists()


# ------------------------------------------------------------------------ Ctrl-C during start-up (deterministic)
# The child parks itself at a chosen point of start-up (a wrapper writes a readiness marker there and waits), the
# test sends SIGINT only once that marker exists, so where the signal lands does not depend on the machine's load.
# The child starts with SIGINT at its default (as from a terminal; a background pytest would hand down SIG_IGN).
_CHILD = r'''
import signal, sys, time
from pathlib import Path
ready, phase, argv = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]

def park(until, n="1"):
    ready.write_text(n)  # the n-th readiness marker: the parent sends its n-th SIGINT now
    t = time.time() + 120  # never hang the suite
    while not until() and time.time() < t:
        time.sleep(0.01)

def handled():  # the first Ctrl-C reached normlab's handler (train()'s stop flag)
    h = signal.getsignal(signal.SIGINT)
    return bool(getattr(getattr(h, "__self__", None), "stop", False))

if phase == "imports":  # park inside `import torch`, which the train command does inside the CLI's guard
    class Park:
        def find_spec(self, name, path=None, target=None):
            if name == "torch":
                sys.meta_path.remove(self)
                park(lambda: False)  # only the KeyboardInterrupt ends this
            return None
    sys.meta_path.insert(0, Park())
elif phase == "data":  # park in data preparation, after train() installed its handler
    import normlab.train.loop as loop
    real = loop.load_data
    def load_data(*a, **k):
        park(handled)
        return real(*a, **k)
    loop.load_data = load_data
elif phase == "loop":  # park in the training loop after the first metrics record: Ctrl-C twice there
    from normlab.train.tracking import Tracker
    real_log = Tracker.log
    def log(self, record):
        real_log(self, record)
        if not handled():
            park(handled, "1")
            park(lambda: False, "2")  # only the second Ctrl-C (KeyboardInterrupt) ends this
    Tracker.log = log
from normlab.cli import entry
sys.argv = ["normlab", *argv]
entry()
'''


def _parked_child(tmp_path: Path, phase: str, args: list[str], cache: Path, signals: int = 1):
    import signal
    import subprocess
    import sys
    import time

    from tests.helpers import cli_env

    ready = tmp_path / f"ready-{phase}"
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, str(ready), phase, *args], env=cli_env(cache),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    for n in range(1, signals + 1):
        deadline = time.time() + 300
        while not (ready.exists() and ready.read_text() == str(n)) and proc.poll() is None and time.time() < deadline:
            time.sleep(0.01)
        assert ready.exists() and ready.read_text() == str(n), \
            f"child never reached {phase} ({n}): {proc.communicate(timeout=60)[1][-2000:]}"
        proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    return proc.returncode, out, err


def test_ctrl_c_during_imports_exits_130_and_writes_nothing(tmp_path, cache):
    out = tmp_path / "r"
    code, _, err = _parked_child(tmp_path, "imports", ["train", "tiny", *TINY, "--out", str(out)], cache)
    assert code == 130 and "Traceback" not in err, err
    assert err.strip().splitlines()[-1].startswith("interrupted (Ctrl-C)"), err
    assert not out.exists()


def test_ctrl_c_during_data_preparation_checkpoints_step_0_and_resumes_exactly(run, tmp_path, cache):
    """Documented: Ctrl-C once before the loop = checkpoint at step 0, summary status interrupted, exit 130; all
    files complete (no temporaries) and --resume ends with the weights of the uninterrupted run."""
    from tests.helpers import assert_same_weights, normlab

    out = tmp_path / "r"
    code, _, err = _parked_child(tmp_path, "data", ["train", "tiny", *TINY, "--out", str(out)], cache)
    assert code == 130 and "Traceback" not in err, err
    s = json.loads((out / "summary.json").read_text())
    assert s["status"] == "interrupted" and s["step"] == 0, s
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["step_00000000"]
    assert not [p for p in out.rglob(".*") if p.name != ".train.lock"], "temporary files left"
    r = normlab("train", "--resume", str(out), cache=cache)
    assert r.returncode == 0, r.stderr
    assert_same_weights(run, out)


def test_ctrl_c_twice_in_the_loop_closes_the_tensorboard_session(tmp_path, cache):
    """A second Ctrl-C stops at once: summary.json still written (interrupted), and the TensorBoard events end with
    the HParams session end (status unknown = interrupted), as when the loop ends by itself."""
    from normlab.train.tracking import read_hparams, read_scalars

    out = tmp_path / "r"
    code, _, err = _parked_child(tmp_path, "loop", ["train", "tiny", *TINY, "--out", str(out)], cache, signals=2)
    assert code == 130 and "Traceback" not in err, err
    assert json.loads((out / "summary.json").read_text())["status"] == "interrupted"
    assert read_hparams(out / "tb")["status"] == "STATUS_UNKNOWN"
    assert ("train/loss", 2) in {(t, s) for t, s, _ in read_scalars(out / "tb")}


def test_guarded_maps_bad_input_os_errors_and_closed_pipes(capsys):
    """``normlab.safety.guarded``: a NormlabError and an OSError are one line on stderr with exit 2 (the OSError's
    line names the path), a closed stdout pipe (an OSError too) exits 0 silently; ``debug`` re-raises the first two."""
    from normlab.errors import EXIT_BAD_INPUT, NormlabError
    from normlab.safety import guarded

    def raising(e):
        def run():
            raise e
        return run

    full = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/x/y.json")
    assert guarded(raising(NormlabError("model.width must be >= 1"))) == EXIT_BAD_INPUT
    assert capsys.readouterr().err == "error: model.width must be >= 1\n"
    assert guarded(raising(full)) == EXIT_BAD_INPUT
    assert capsys.readouterr().err == (f"error: /x/y.json: {os.strerror(errno.ENOSPC)} (free some space and re-run; "
                                       "--resume continues from the last checkpoint)\n")
    for debug in (False, True):
        assert guarded(raising(BrokenPipeError(errno.EPIPE, "Broken pipe")), debug=debug) == 0
        assert capsys.readouterr().err == ""
    for e in (NormlabError("x"), full):
        with pytest.raises(type(e)):
            guarded(raising(e), debug=True)
