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
