"""normlab.validate and the commands' flag types: every bad number or flag is a one-line error with exit 2 and
writes nothing; valid edge values still work; the memory estimates are checked against available memory. The
rows run the CLI in-process against one tiny finished run (conftest ``run`` / ``run_copy``)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers import assert_bad_input, cli_env, run_inproc, tree

pytestmark = pytest.mark.usefixtures("one_thread")


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


BAD_ENV = [  # (variable, value, fragments of the one-line error)
    ("NORMLAB_MEMORY_GB", "nan", ["NORMLAB_MEMORY_GB must be a finite number of GiB > 0", "'nan'"]),
    ("NORMLAB_MEMORY_GB", "lots", ["NORMLAB_MEMORY_GB must be", "'lots'"]),
    ("NORMLAB_MEMORY_GB", "-1", ["NORMLAB_MEMORY_GB must be", "'-1'"]),
    ("NORMLAB_MEMORY_GB", "0", ["NORMLAB_MEMORY_GB must be", "'0'"]),
    ("NORMLAB_MEMORY_GB", "inf", ["NORMLAB_MEMORY_GB must be", "'inf'"]),
    ("NORMLAB_DB_TIMEOUT", "-5", ["NORMLAB_DB_TIMEOUT must be a finite number of seconds > 0", "'-5'"]),
    ("NORMLAB_PROGRESS_EVERY", "soon", ["NORMLAB_PROGRESS_EVERY must be a finite number of seconds >= 0"]),
    ("NORMLAB_PROGRESS_EVERY", "-1", ["NORMLAB_PROGRESS_EVERY must be"]),
    ("NORMLAB_RAY_FILES", "rsync", ["NORMLAB_RAY_FILES must be auto, shared or copy", "'rsync'"]),
    ("NORMLAB_DIST_BACKEND", "mpi", ["NORMLAB_DIST_BACKEND must be 'gloo'", "'mpi'"]),
    ("NORMLAB_MALLOC", "fast", ["NORMLAB_MALLOC must be 'default'", "'fast'"]),
    ("NORMLAB_CACHE_DIR", "  ", ["NORMLAB_CACHE_DIR must be a directory path"]),
    ("NORMLAB_CPU_PLAN", "4096 warp", ["NORMLAB_CPU_PLAN must be '<threads> spin' or '<threads> passive'"]),
    ("NORMLAB_CPU_PLAN", "0 spin", ["NORMLAB_CPU_PLAN must be"]),
    ("NORMLAB_MEMORY_GB", "1e308", ["NORMLAB_MEMORY_GB must be", "<= 1048576 (1 PiB)", "'1e308'"]),  # was OverflowError
    ("NORMLAB_DB_TIMEOUT", "1e308", ["NORMLAB_DB_TIMEOUT must be", "<= 31536000 (a year)", "'1e308'"]),
    ("NORMLAB_PROGRESS_EVERY", "1e308", ["NORMLAB_PROGRESS_EVERY must be", "<= 31536000"]),
    ("NORMLAB_MEMORY_G", "8", ["unknown environment variable NORMLAB_MEMORY_G (did you mean 'NORMLAB_MEMORY_GB'?)"]),
]


@pytest.mark.parametrize("name,value,fragments", BAD_ENV, ids=[f"{n}={v}" for n, v, _ in BAD_ENV])
def test_bad_environment_variable_is_refused(name, value, fragments):
    from normlab.errors import NormlabError
    from normlab.validate import check_environment

    with pytest.raises(NormlabError) as e:
        check_environment({"PATH": "/bin", name: value})
    assert all(f in str(e.value) for f in fragments) and "\n" not in str(e.value), str(e.value)


def test_good_environment_values_parse():
    from normlab.validate import GiB, available_memory, check_environment, env_value

    good = {"NORMLAB_MEMORY_GB": "0.5", "NORMLAB_DB_TIMEOUT": "2.5", "NORMLAB_PROGRESS_EVERY": "0",
            "NORMLAB_RAY_FILES": "copy", "NORMLAB_DIST_BACKEND": "gloo", "NORMLAB_MALLOC": "default",
            "NORMLAB_CACHE_DIR": "some/dir", "NORMLAB_CPU_PLAN": "2 spin", "NORMLAB_WAIT_POLICY_NOTE": "anything",
            "NORMLAB_HEAP_NOTE": "x", "NORMLAB_TEST_KILL_AFTER": "3", "NORMLAB_MEMORY_GB_EXTRA": ""}
    with pytest.raises(Exception, match="unknown environment variable NORMLAB_MEMORY_GB_EXTRA"):
        check_environment(good)  # an unknown name, even empty
    del good["NORMLAB_MEMORY_GB_EXTRA"]
    check_environment(good)  # NORMLAB_TEST_* belongs to the test suite
    assert env_value("NORMLAB_MEMORY_GB", environ=good) == 0.5
    assert env_value("NORMLAB_MEMORY_GB", 7, environ={"NORMLAB_MEMORY_GB": ""}) == 7  # empty = unset
    import os

    old = os.environ.get("NORMLAB_MEMORY_GB")
    try:
        os.environ["NORMLAB_MEMORY_GB"] = "1.5"
        assert available_memory() == int(1.5 * GiB)
        os.environ["NORMLAB_MEMORY_GB"] = "nan"  # the library refuses it too (an API user skips the entry point)
        with pytest.raises(Exception, match="NORMLAB_MEMORY_GB must be"):
            available_memory()
    finally:
        os.environ.pop("NORMLAB_MEMORY_GB") if old is None else os.environ.__setitem__("NORMLAB_MEMORY_GB", old)


@pytest.mark.parametrize("name,value,fragment", [
    ("NORMLAB_MEMORY_GB", "nan", "NORMLAB_MEMORY_GB must be a finite number of GiB > 0 and <= 1048576 (1 PiB), "
                                 "got 'nan'"),
    ("NORMLAB_MEMORY_GB", "-1", "NORMLAB_MEMORY_GB must be a finite number of GiB > 0 and <= 1048576 (1 PiB), "
                                "got '-1'"),
    ("NORMLAB_PROGRESS_EVERY", "x", "NORMLAB_PROGRESS_EVERY must be"),
])
def test_the_command_refuses_a_bad_variable_before_anything_runs(name, value, fragment, tmp_path):
    """The ``normlab`` entry point checks every ``NORMLAB_*`` variable first: one line, exit 2, nothing written."""
    import os
    import subprocess
    import sys

    env = {**os.environ, name: value}
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "normlab", "train", "tiny", "--out", str(out)], env=env,
                       capture_output=True, text=True, timeout=300)
    assert_bad_input(r, fragment)
    assert not out.exists()


def test_check_choice_gives_the_one_line_of_each_kind_of_key():
    """A declared ``choices`` check: names get the standard ``unknown`` line (errors.unknown, with did-you-mean), a
    list key each entry, a mix with true / false one sentence; an allowed value (``False`` among them) passes."""
    from normlab.errors import NormlabError
    from normlab.validate import check_choice

    def refusal(*args) -> str:
        with pytest.raises(NormlabError) as e:
            check_choice(*args)
        return str(e.value)

    assert refusal("train.clip", "adagcc", ("global", "adagc")) == \
        "unknown train.clip 'adagcc' (did you mean 'adagc'?); allowed: adagc, global"
    assert refusal("train.track", ["wandb", "neptune"], ("tensorboard", "wandb", "mlflow")) == \
        "unknown train.track entry 'neptune'; allowed: mlflow, tensorboard, wandb"
    assert refusal("train.tf32", "maybe", ("auto", True, False)) == \
        "train.tf32 must be auto, true or false, got 'maybe'"
    check_choice("train.tf32", False, ("auto", True, False))
    check_choice("train.track", [], ("wandb",))


@pytest.mark.parametrize("name, argv", [("NORMLAB_MEMORY_GB", ["train", "tiny", "--set", "train.steps=1"]),
                                        ("NORMLAB_DB_TIMEOUT", ["runs"])])
def test_a_huge_environment_number_is_one_line_at_start_and_writes_nothing(name, argv, tmp_path, cache):
    """1e308 is finite: it passed the finiteness check and overflowed later (int(1e308 * GiB), sqlite's busy
    timeout in ms); the bound refuses it before anything runs."""
    out = tmp_path / "out"
    env = {**cli_env(cache), name: "1e308"}
    proc = subprocess.run([sys.executable, "-m", "normlab", *argv, *(["--out", str(out)] if argv[0] == "train"
                                                                      else [str(tmp_path)])],
                          capture_output=True, text=True, env=env, timeout=120)
    assert_bad_input(proc, f"{name} must be", "'1e308'")
    assert not out.exists()
