"""Docs stay in step with the code: every CLI subcommand and option appears in docs/cli.md."""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path

import pytest

from normlab.cli import build_parser

DOCS = Path(__file__).resolve().parent.parent / "docs"


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def test_every_command_and_option_is_documented():
    text = (DOCS / "cli.md").read_text()
    for name, sub in _subparsers(build_parser()).items():
        assert f"`normlab {name}" in text, f"docs/cli.md lacks a section for 'normlab {name}'"
        for action in sub._actions:
            for opt in action.option_strings:
                if opt.startswith("--") and opt != "--help":
                    assert opt in text, f"docs/cli.md does not mention {name} {opt}"


def test_readme_gives_the_two_commands():
    readme = (DOCS.parent / "README.md").read_text()
    assert "make demo" in readme and "make test" in readme


def test_every_attention_kind_is_documented():
    """docs/attention.md lists the registered kinds (the one list, normlab.attention.registry) in the key table,
    in registration order, and gives each its own section; so does ``normlab attention``."""
    from normlab.attention import attention_names

    text = (DOCS / "attention.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| `model.attention` |"))
    assert row.split("|")[2].strip() == ", ".join(f"`{k}`" for k in attention_names()), row
    for kind in attention_names():
        assert f"\n## `{kind}` " in text, f"docs/attention.md lacks a section for attention kind '{kind}'"


# An absolute path of the machine that made a file: a home, temp or work directory. Built from parts so that this
# file does not match itself.
_ROOTS = ("work", "root", "home", "tmp", "Users", "private/var", "var/folders", "mnt", "scratch")
MACHINE_PATH = __import__("re").compile(r"(?<![\w.~-])/(?:" + "|".join(_ROOTS) + r")/[\w.-]")


def _tracked_text_files() -> list[Path]:
    """The repository's tracked files (``git ls-files``; every file under the root but .git, .venv and caches
    where git is absent), the binary ones left out."""
    import subprocess

    root = DOCS.parent
    try:
        names = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True,
                               timeout=60).stdout.decode().split("\0")
        files = [root / n for n in names if n]
    except (OSError, subprocess.SubprocessError):
        skip = {".git", ".venv", "__pycache__", ".pytest_cache", ".ruff_cache", "runs"}
        files = [p for p in root.rglob("*") if p.is_file() and not skip & set(p.relative_to(root).parts)]
    out = []
    for p in files:
        try:
            data = p.read_bytes()
        except OSError:  # deleted in the work tree, not yet in the index
            continue
        if b"\0" not in data[:8192]:
            out.append(p)
    return out


def test_machine_path_pattern_finds_what_it_should():
    slash = "/"
    for bad in (f"{slash}work/runs/claims", f"see {slash}root/.cache/x", f"`{slash}tmp/nl/tiny3k`",
                f"{slash}home/alice/normlab", f"{slash}Users/bob/x"):
        assert MACHINE_PATH.search(bad), bad
    for fine in ("runs/claims", "/dev/zero", "/proc/pressure/cpu", "docs/work/x", "~/tmp/x", "a.tmp/b"):
        assert not MACHINE_PATH.search(fine), fine


def test_no_tracked_file_names_a_machine_path():
    """Committed files are portable: no absolute path of a home, temp or work directory of the machine that
    wrote them (stored results hold run directories relative to their own directory; examples use relative
    paths)."""
    root = DOCS.parent
    files = _tracked_text_files()
    assert len(files) > 50
    hits = []
    for p in files:
        for i, line in enumerate(p.read_text(errors="replace").splitlines(), 1):
            if MACHINE_PATH.search(line):
                hits.append(f"{p.relative_to(root)}:{i}: {line.strip()[:120]}")
    assert not hits, "machine paths in tracked files:\n" + "\n".join(hits[:30])


# -- README.md's commands run as written ---------------------------------------------------------------------------
README = DOCS.parent / "README.md"
TINY_BUDGET = {
    "normlab train small": ["--set", "train.steps=2", "--set", "train.eval_every=2", "--set",
                            "train.checkpoint_every=2", "--set", "train.eval_batches=1"],
    "normlab eval": ["--max-tokens", "1024"],
}
"""The tiny budget: a README command that takes minutes as written runs with the flags of the first entry whose key
starts it added at its end (the same command on fewer steps or tokens); every other command runs exactly as
written. A README command that matches no entry and takes long makes this test slow: add an entry here."""
MAKE_TARGETS = {"make demo": "python -m normlab.demo", "make test": "python -m pytest"}
"""``make`` targets are not run (``make test`` is this suite; ``make demo`` is checked by its design below): the
Makefile's recipe for each must hold the command given here."""


def readme_commands(text: str) -> list[str]:
    """The shell commands of README.md's ```bash blocks, one per line, without trailing ``# comments``."""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.splitlines():
            cmd = line.split(" #", 1)[0].strip()
            if cmd and not cmd.startswith("#"):
                out.append(cmd)
    return out


@pytest.mark.slow
def test_readme_commands_run_as_written(tmp_path, cache):
    """Each command of README.md's code blocks, in order, in one temporary directory (``.venv/bin/normlab`` is this
    interpreter's ``normlab``), exits 0; long ones run on the tiny budget (``TINY_BUDGET``)."""
    import shlex
    import subprocess
    import sys

    from tests.helpers import cli_env

    cmds = readme_commands(README.read_text())
    assert any(c.startswith("make demo") for c in cmds) and any(".venv/bin/normlab train" in c for c in cmds)
    makefile = (DOCS.parent / "Makefile").read_text()
    ran = 0
    for cmd in cmds:
        if cmd.startswith("make "):
            target = cmd.split()[1]
            recipe = re.search(rf"^{target}:.*\n((?:\t.*\n)+)", makefile, re.M)
            assert recipe and MAKE_TARGETS[cmd] in recipe.group(1), (cmd, recipe and recipe.group(1))
            continue
        argv = shlex.split(cmd)
        assert argv[0] in (".venv/bin/normlab", "normlab"), f"README command not understood: {cmd}"
        args = argv[1:]
        key = " ".join(["normlab", *args[:2]])
        extra = next((v for k, v in TINY_BUDGET.items() if key.startswith(k) or f"normlab {args[0]}" == k), [])
        env = cli_env(cache)
        env["PYTHONPATH"] = str(DOCS.parent) + os.pathsep + env.get("PYTHONPATH", "")
        p = subprocess.run([sys.executable, "-m", "normlab.cli", *args, *extra], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, f"README command failed ({p.returncode}): {cmd} {' '.join(extra)}\n{p.stderr[-2000:]}"
        ran += 1
    assert ran >= 4


def _number(word: str) -> int:
    words = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8}
    return int(word) if word.isdigit() else words[word]


def test_readme_and_compare_docs_quote_the_demo_preset_design():
    """The demo design README.md and docs/compare.md state (blocks, width, steps, learning rates, seeds, runs,
    family size) is that of the shipped ``quick`` preset, read from the package."""
    from normlab.experiments.sweep import load_sweep

    sweep = load_sweep(preset="quick")
    base = sweep.runs[0].config
    lrs = sorted({r.axes["train.lr"] for r in sweep.runs})
    variants = sorted({r.axes["variant"] for r in sweep.runs})
    seeds = sorted({r.seed for r in sweep.runs})
    readme = " ".join(README.read_text().split())
    m = re.search(r"a family of (\d+) comparisons.*?Each variant is a (\d+)-block, width-(\d+) byte-level GPT "
                  r"trained for (\d+) steps at (\w+) peak learning rates from ([\d.e-]+) to ([\d.e-]+) \(log-spaced\) "
                  r"with (\d+) seeds: (\d+) runs", readme)
    assert m, "README.md no longer states the demo design in the expected words; update this test with it"
    family, depth, width, steps, n_lr, lr_lo, lr_hi, n_seeds, n_runs = m.groups()
    assert int(family) == len(sweep.spec["family"])
    assert (int(depth), int(width), int(steps)) == (base["model"]["depth"], base["model"]["width"],
                                                    base["train"]["steps"])
    assert _number(n_lr) == len(lrs) and (float(lr_lo), float(lr_hi)) == (lrs[0], lrs[-1])
    assert int(n_seeds) == len(seeds) and int(n_runs) == len(sweep.runs) == len(variants) * len(lrs) * len(seeds)
    design = re.compile(r"(\d+|[a-z]+) (?:normalization choices|variants) [x×] (\d+) learning rates [x×] (\d+) seeds")
    demo_lines = [ln for ln in (DOCS / "compare.md").read_text().splitlines()
                  if re.search(r"--preset quick\b(?!-)|\| `quick` \||the demo\b", ln) and design.search(ln)]
    assert len(demo_lines) >= 2, demo_lines  # the example command and the presets table
    for ln in demo_lines:
        for a, b, c in design.findall(ln):
            assert (_number(a), int(b), int(c)) == (len(variants), len(lrs), len(seeds)), ln


# -- links between the docs ----------------------------------------------------------------------------------------
LINK = re.compile(r"\]\(([^)\s]+)\)")


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading: lower case, punctuation other than ``-`` and ``_`` dropped,
    spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def test_github_anchor_matches_known_anchors():
    assert github_anchor("Seeds until decided") == "seeds-until-decided"
    assert github_anchor("Seed blocks: runs that shaped a design cannot confirm it") == \
        "seed-blocks-runs-that-shaped-a-design-cannot-confirm-it"
    assert github_anchor("Weights & Biases and MLflow (`train.track`)") == "weights--biases-and-mlflow-traintrack"


def _anchors(md: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", md.read_text(), flags=re.S)
    return {github_anchor(m) for m in re.findall(r"^#+ (.+)$", text, re.M)}


def test_relative_links_in_readme_and_docs_resolve():
    """Every relative link of README.md and docs/*.md names a file that exists, and an ``#anchor`` a heading of
    that file (moving text between pages must not leave a dead link)."""
    bad = []
    for md in [README, *sorted(DOCS.glob("*.md"))]:
        text = re.sub(r"```.*?```", "", md.read_text(), flags=re.S)
        for target in LINK.findall(text):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (md.parent / path).resolve() if path else md
            if not dest.exists():
                bad.append(f"{md.name}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                bad.append(f"{md.name}: {target} (no such heading)")
    assert not bad, "\n".join(bad)
