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
