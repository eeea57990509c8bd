"""Docs stay in step with the code: every CLI subcommand and option appears in docs/cli.md."""

from __future__ import annotations

import argparse
from pathlib import Path

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
