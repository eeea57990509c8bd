"""The shipped presets (normlab.presets): every --help and one-line error that names presets lists exactly the
package's preset files, read here from the installed package's directory, not from a hand list."""

from __future__ import annotations

import re
from pathlib import Path

import normlab
from tests.helpers import run_inproc

PACKAGE = Path(normlab.__file__).resolve().parent


def _help(*args: str, cache: Path) -> str:
    r = run_inproc(*args, "--help", cache=cache)
    assert r.returncode == 0, r.stderr
    return re.sub(r"\s+", " ", r.stdout)  # argparse wraps help text


def test_help_and_errors_list_every_shipped_preset(cache):
    sweeps = sorted(p.stem for p in (PACKAGE / "configs" / "sweeps").glob("*.yaml"))
    configs = sorted(p.stem for p in (PACKAGE / "configs").glob("*.yaml"))
    assert {"quick", "quick-explore", "quick-1lr"} <= set(sweeps) and {"tiny", "small"} <= set(configs)
    assert f"({', '.join(sweeps)})" in _help("compare", cache=cache)
    assert f"normlab/configs/: {', '.join(configs)})" in _help("train", cache=cache)
    assert f"({', '.join(configs)})" in _help("config", cache=cache)
    r = run_inproc("compare", "--preset", "quik", cache=cache)
    assert r.returncode == 2 and r.stderr.rstrip().endswith("presets: " + ", ".join(sweeps))
    r = run_inproc("train", cache=cache)
    assert r.returncode == 2 and f"preset: {', '.join(configs)})" in r.stderr
    r = run_inproc("train", "tinny", cache=cache)
    assert r.returncode == 2 and r.stderr.rstrip().endswith("presets: " + ", ".join(configs))
