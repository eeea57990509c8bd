"""A real install: build a wheel, install it non-editable into a fresh virtualenv, and run the shipped presets from
another directory (no source tree on the path).

The fresh virtualenv reuses this environment's third-party packages (torch, numpy, ...) through a ``.pth`` file
naming their directories, and the wheel is installed with ``--no-deps --no-index``: nothing is downloaded, and the
``.pth`` directories' own ``.pth`` hooks (this environment's editable normlab) are not executed, so ``normlab`` can
only come from the wheel.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
import yaml

import normlab

ROOT = Path(normlab.__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


def _run(cmd: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))} failed ({proc.returncode}): {proc.stderr[-3000:]}"
    return proc


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    base = tmp_path_factory.mktemp("install")
    src = base / "src"  # a clean copy of what the sdist holds: no build/ or egg-info left in the checkout
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    shutil.copytree(ROOT / "normlab", src / "normlab", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env.update({"PIP_DISABLE_PIP_VERSION_CHECK": "1", "OMP_NUM_THREADS": "1",
                "NORMLAB_CACHE_DIR": str(base / "cache")})
    pip = [sys.executable, "-m", "pip"]
    _run([*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q", "-w", str(base / "dist"), str(src)],
         base, env)
    wheel = next((base / "dist").glob("normlab-*.whl"))
    venv = base / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], base, env)
    py = venv / "bin" / "python"
    site = Path(_run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], base, env)
                .stdout.strip())
    shared = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (site / "_normlab_test_shared_deps.pth").write_text("".join(f"{p}\n" for p in sorted(shared)))
    _run([*pip, "--python", str(py), "install", "--no-deps", "--no-index", "-q", str(wheel)], base, env)
    elsewhere = base / "elsewhere"
    elsewhere.mkdir()
    return {"wheel": wheel, "venv": venv, "py": py, "bin": venv / "bin" / "normlab", "env": env, "cwd": elsewhere}


def test_wheel_ships_presets_and_sweeps(installed):
    names = set(zipfile.ZipFile(installed["wheel"]).namelist())
    shipped = {p.relative_to(ROOT).as_posix() for p in (ROOT / "normlab" / "configs").rglob("*.yaml")}
    assert shipped and shipped <= names
    assert "normlab/examples/api.py" in names  # docs/api.md's example runs from a wheel install
    assert "normlab/evidence/claims.json" in names  # normlab advise's evidence (docs/advise.md)
    assert "normlab/evidence/scaling.json" in names  # and its scaling fits
    claims = {p.relative_to(ROOT).as_posix() for p in (ROOT / "normlab" / "experiments" / "claims").rglob("*.yaml")}
    assert len(claims) > 30 and claims | {"normlab/evidence/revisions.yaml"} <= names  # the claim definitions
    got = _run([str(installed["py"]), "-c", "from normlab.experiments.claims.specs import CLAIMS; "
                "print(len(CLAIMS), sum(len(c.revised) for c in CLAIMS))"], installed["cwd"], installed["env"]).stdout
    from normlab.experiments.claims.specs import CLAIMS

    assert got.split() == [str(len(CLAIMS)), str(sum(len(c.revised) for c in CLAIMS))]  # loaded from the wheel
    assert not any(n.startswith(("tests/", "docs/", "benchmarks/")) for n in names)


def test_installed_normlab_is_the_wheel_not_the_checkout(installed):
    out = _run([str(installed["py"]), "-c", "import normlab, normlab.config as c; print(normlab.__file__); "
                "print(c.CONFIG_DIR)"], installed["cwd"], installed["env"]).stdout.split()
    assert all(Path(p).resolve().is_relative_to(installed["venv"].resolve()) for p in out), out
    v = _run([str(installed["bin"]), "--version"], installed["cwd"], installed["env"]).stdout
    assert v == f"normlab {normlab.__version__}\n"  # no git commit: the wheel is not a checkout


def test_installed_train_preset_and_compare(installed):
    cwd, env, exe = installed["cwd"], installed["env"], str(installed["bin"])
    fast = ["--set", "train.steps=4", "--set", "train.eval_every=2", "--set", "train.checkpoint_every=2",
            "--set", "model.context=16"]
    s = json.loads(_run([exe, "train", "tiny", *fast, "--out", "run", "--json"], cwd, env).stdout)
    assert s["status"] == "completed" and s["step"] == 4 and (cwd / "run" / "model.safetensors").is_file()
    assert (cwd / "run" / "tb").is_dir() and (cwd / "run" / "data.json").is_file()
    sweep = cwd / "one.yaml"
    sweep.write_text(yaml.safe_dump({"name": "one", "base": "tiny", "seeds": [0],
                                     "set": {"train.steps": 4, "train.eval_every": 2, "train.checkpoint_every": 2,
                                             "model.context": 16},
                                     "variants": [{"name": "RMS", "set": {"model.norm": "rmsnorm"}}]}))
    r = json.loads(_run([exe, "compare", "one.yaml", "--out", "sweep", "--workers", "1", "--json"], cwd, env).stdout)
    assert r["counts"] == {"completed": 1}
    assert (cwd / "sweep" / "report.html").is_file()
    assert (cwd / "sweep" / "runs" / "rms-s0" / "model.safetensors").is_file()
    presets = _run([str(installed["py"]), "-c",
                    "from normlab.experiments.sweep import list_presets; print(list_presets())"],
                   cwd, env).stdout
    assert "quick" in presets
    # issue 29, as a new user from the wheel: the folder of runs lists, the config explains itself, the example runs
    listed = json.loads(_run([exe, "runs", ".", "--json"], cwd, env).stdout)
    assert [r["path"] for r in listed["runs"]] == ["run"] and listed["sweeps"] == ["sweep"]
    assert listed["runs"][0]["status"] == "completed" and listed["runs"][0]["val_bpb"] == s["val_bpb"]
    keys = json.loads(_run([exe, "config", "tiny", "--json"], cwd, env).stdout)["keys"]
    assert all(k["description"] for k in keys)
    usage = _run([str(installed["py"]), "-m", "normlab.examples.api", "--help"], cwd, env).stdout
    assert "python -m normlab.examples.api" in usage


# -- what `make demo` installs --------------------------------------------------------------------------------------
EXTRAS_TOP_LEVEL = ("transformers", "datasets", "ray", "wandb", "mlflow", "lm_eval", "accelerate", "tensorboard",
                    "statsmodels", "hypothesis", "pytest", "x_transformers")
"""The top-level modules of the optional extras (pyproject.toml): `make demo` does not install them."""


def _make_plan(d: Path, target: str) -> list[str]:
    """The commands ``make -n TARGET`` would run in ``d``; the ``touch`` lines among them are then run (as the real
    recipe would), so the next plan sees the stamps."""
    proc = subprocess.run(["make", "-n", target], cwd=d, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    for line in lines:
        if line.startswith("touch "):
            subprocess.run(line.split(), cwd=d, check=True)
    return [line for line in lines if "pip install" in line]


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_demo_installs_the_core_and_make_test_adds_the_extras(tmp_path):
    """The Makefile's stamps: ``make demo`` on a fresh checkout installs torch and the package without extras; a
    following ``make test`` installs the extras; after that neither installs anything until pyproject.toml
    changes. And the other order: after ``make test``, ``make demo`` installs nothing."""
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for order in (("demo", "test", "demo", "test"), ("test", "demo")):
        d = tmp_path / "-".join(order)
        (d / ".venv" / "bin").mkdir(parents=True)
        (d / ".venv" / "bin" / "python").touch()  # the venv exists: only the stamps decide
        shutil.copy2(ROOT / "Makefile", d)
        shutil.copy2(ROOT / "pyproject.toml", d)
        plans = [_make_plan(d, t) for t in order]
        if order[0] == "demo":
            assert plans[0] == [".venv/bin/pip install -q torch==2.13.0", ".venv/bin/pip install -q -e ."]
            assert len(plans[1]) == 2 and plans[1][1].startswith(".venv/bin/pip install -q -e '.[")
            listed = plans[1][1].split("[", 1)[1].split("]", 1)[0].split(",")
            assert {"test", "hf", "interop", "lm-eval", "ray", "tensorboard", "wandb", "mlflow"} == set(listed)
            assert set(listed) <= set(extras)
            assert plans[2] == plans[3] == []
            with open(d / "pyproject.toml", "a") as f:
                f.write("\n# changed\n")
            assert _make_plan(d, "demo") == plans[0]
        else:
            assert len(plans[0]) == 2 and "[test," in plans[0][1]
            assert plans[1] == []


def _core_closure() -> set[str]:
    """The distributions a core install of normlab holds: its dependencies without extras (pyproject.toml), and
    theirs, recursively, with the markers of this interpreter."""
    import tomllib
    from importlib.metadata import PackageNotFoundError, requires

    from packaging.requirements import Requirement

    todo = [Requirement(r) for r in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]]
    seen: set[str] = set()
    while todo:
        req = todo.pop()
        name = req.name.lower().replace("_", "-")
        if name in seen or (req.marker and not req.marker.evaluate({"extra": ""})):
            continue
        seen.add(name)
        try:
            todo += [Requirement(r) for r in requires(req.name) or []]
        except PackageNotFoundError:
            pass  # an optional platform dependency this environment lacks
    return seen


def test_the_demo_path_imports_no_extra(tmp_path, cache):
    """What `make demo` runs (a declared-question sweep over a learning-rate grid on pystdlib, its workers and its
    report) needs nothing beyond a core install: a fresh virtualenv that sees only the core's distributions (this
    environment's files of normlab's dependencies and theirs, linked into one folder; no extra, no test tool) runs
    a small sweep of the demo's shape to its report."""
    from importlib.metadata import distribution

    view = tmp_path / "core-site"
    view.mkdir()
    for name in _core_closure():
        dist = distribution(name)
        for top in {f.parts[0] for f in dist.files or [] if not f.parts[0].startswith("..")}:
            src = Path(dist.locate_file(top))
            if src.exists() and not (view / top).exists():
                (view / top).symlink_to(src)
    linked = {p.name for p in view.iterdir()}
    assert "torch" in linked and not {"wandb", "ray", "transformers", "pytest", "hypothesis", "tensorboard"} & linked
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    (site / "core.pth").write_text(f"{view}\n{ROOT}\n")
    quick = yaml.safe_load((ROOT / "normlab" / "configs" / "sweeps" / "quick.yaml").read_text())
    spec = {**{k: quick[k] for k in ("base", "baseline", "primary", "alpha", "correction")},
            "name": "demo-path", "family": ["Peri-LN"], "variants": quick["variants"][:2], "seeds": [0, 1],
            "lr_grid": {"min": 0.001, "max": 0.01, "points": 2},
            "set": {**quick["set"], "model.width": 32, "model.depth": 2, "model.heads": 2, "train.steps": 4,
                    "train.eval_every": 4, "train.checkpoint_every": 4, "train.log_every": 2, "diag.every": 2,
                    "train.eval_batches": 2, "train.warmup_steps": 1}}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(spec))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env.update({"NORMLAB_CACHE_DIR": str(cache), "OMP_NUM_THREADS": "1"})
    probe = subprocess.run([str(py), "-c", "import wandb"], env=env, capture_output=True, text=True)
    assert "No module named 'wandb'" in probe.stderr  # the extras are absent there
    proc = subprocess.run([str(py), "-m", "normlab", "compare", str(tmp_path / "s.yaml"), "--out",
                           str(tmp_path / "out"), "--workers", "2", "--json"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert out["counts"] == {"completed": 8} and Path(out["report_html"]).is_file()
