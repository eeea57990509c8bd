"""Markdown for report.md: user text escaped once, the same way everywhere (render, surgery_columns)."""

from __future__ import annotations

import html

_MD_SPECIAL = str.maketrans({c: "\\" + c for c in "\\`*_[]|#"})


def md_escape(text: object) -> str:
    """User text (variant names, paths, sentences that quote them) for Markdown, escaped as HTML is: ``<&>`` as
    entities (a viewer that passes inline HTML shows ``<script>`` as text) and Markdown punctuation backslashed
    (no emphasis, links or table breaks)."""
    return html.escape(str(text), quote=False).translate(_MD_SPECIAL)
