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


def _missing(v: object) -> bool:
    return v is None or (isinstance(v, float) and v != v)  # None or NaN


def interval_text(point: object, low: object, high: object, fmt: str = ".2f") -> str:
    """'point [low, high]'; 'point [no CI]' when the run could give no interval (the reason
    is in the row's `interval_note`); '-' without a point."""
    if _missing(point):
        return "-"
    if _missing(low) or _missing(high):
        return f"{point:{fmt}} [no CI]"
    return f"{point:{fmt}} [{low:{fmt}}, {high:{fmt}}]"
