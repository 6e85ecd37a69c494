"""Tables for people: markdown for report files, fixed-width for terminals."""

from __future__ import annotations


def _md_escape(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def markdown_table(headers: list[str], rows: list[list[str]]) -> str:
    """A GitHub-flavoured markdown table."""
    lines = ["| " + " | ".join(map(_md_escape, headers)) + " |",
             "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(map(_md_escape, r)) + " |" for r in rows]
    return "\n".join(lines)
