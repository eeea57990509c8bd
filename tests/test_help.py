"""``--help`` works for the top level and every subcommand (discovered from the parser, so new commands are covered
automatically), and ``--version`` names the package version."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

import pytest

import normlab
from normlab.cli import build_parser
from tests.helpers import run_inproc


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    for action in build_parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    raise AssertionError("normlab's parser has no subcommands")


def test_top_level_help_in_a_fresh_process(tmp_path):
    # `python -m normlab --help`, as a user types it (a `%` in any subcommand's help used to crash here)
    proc = subprocess.run([sys.executable, "-m", "normlab", "--help"], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout.startswith("usage: normlab")
    for name in _subcommands():
        assert name in proc.stdout, name


@pytest.mark.parametrize("name", sorted(_subcommands()))
def test_subcommand_help(name, tmp_path):
    proc = run_inproc(name, "--help", cache=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"usage: normlab {name}") and "Traceback" not in proc.stderr
    # every option of the subcommand is listed in its help text
    for action in _subcommands()[name]._actions:
        for opt in action.option_strings:
            assert opt in proc.stdout, (name, opt)


def test_version(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "normlab", "--version"], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    m = re.fullmatch(r"normlab (\S+)(?: \(git ([0-9a-f]{12})\))?\n", proc.stdout)
    assert m and m.group(1) == normlab.__version__, proc.stdout
    root = Path(normlab.__file__).resolve().parent.parent
    head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True)
    if (root / ".git").exists() and head.returncode == 0:
        assert m.group(2) == head.stdout.strip()[:12]
