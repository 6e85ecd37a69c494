"""The hazard matrix on several SGLangs (`bench hazards --cache sglang --sglang
base=SPEC,head=SPEC`): every cell on every side, and the cells that changed from the first
side (the reference) named before the rest.

A side's rows are its cells, its name in the protocol column (`head=sglang-tree:...`), as
in a `bench run` of several SGLangs. A cell changed when its outcome differs from the
reference's cell of the same scenario (with `--sglang-consensus`, or when SGLang's checker
said something else), or when it runs on one of the two sides only. It got worse when both
ran it and its outcome is of a graver tier than the reference's (TIER): exit code 1 of a
run of sides. Everything here is built from rows, so it can be rebuilt from hazards.csv.
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.hazards.classify import (
    ABORT,
    CORRUPT,
    DEADLOCK,
    DIVERGENCE,
    FAILED,
    HARNESS,
    LIVELOCK,
    OK,
    REFUSED,
)

# How grave an outcome is: OK, then ranks that decide apart (or pages that differ), then a
# rank that hangs, fails or is killed, then a cell the harness could not finish.
TIER = {OK: 0, DIVERGENCE: 1, CORRUPT: 1, FAILED: 2, DEADLOCK: 2, ABORT: 2, LIVELOCK: 2,
        HARNESS: 3}


@dataclass(frozen=True)
class Change:
    """One scenario's cell on the reference and on another side, where they differ."""

    scenario: str
    side: str  # the other side's name
    ref: dict | None  # the reference side's row (None: the cell runs on `side` only)
    row: dict | None  # the other side's row (None: on the reference only)

    @property
    def worse(self) -> bool:
        """Both sides ran the cell and the other side's outcome is of a graver tier (a cell
        refused on either side ran on one at most: never worse)."""
        return self.ref is not None and self.row is not None and \
            REFUSED not in (self.ref["outcome"], self.row["outcome"]) and \
            TIER[self.row["outcome"]] > TIER[self.ref["outcome"]]


def side_names(rows: list[dict]) -> list[str]:
    """The sides in the rows' order, the reference first."""
    return list(dict.fromkeys(r["protocol"] for r in rows))


def differs(ref: dict, row: dict, consensus: bool) -> bool:
    return ref["outcome"] != row["outcome"] or (
        consensus and ref.get("sglang_consensus") != row.get("sglang_consensus"))


def changes(rows: list[dict], consensus: bool = False) -> list[Change]:
    """Per other side and scenario, its cell where it differs from the reference's, in the
    rows' scenario order."""
    names = side_names(rows)
    by = {(r["scenario"], r["protocol"]): r for r in rows}
    scenarios = list(dict.fromkeys(r["scenario"] for r in rows))
    out = []
    for name in names[1:]:
        for s in scenarios:
            ref, row = by.get((s, names[0])), by.get((s, name))
            if ref is None or row is None or differs(ref, row, consensus):
                out.append(Change(s, name, ref, row))
    return out


def changed_first(rows: list[dict], consensus: bool = False) -> list[dict]:
    """The rows, those of a scenario that changed on some side first (scenario-major
    within each part, as the matrix ran)."""
    moved = {c.scenario for c in changes(rows, consensus)}
    return [r for r in rows if r["scenario"] in moved] + \
        [r for r in rows if r["scenario"] not in moved]


def cell_words(row: dict | None) -> str:
    """A cell in a line: its outcome and where (OK: its cost)."""
    if row is None:
        return "not run (the scenario is not for this side's protocol)"
    if row["outcome"] == OK:
        return f"OK {row['decision_per_poll']:g}/poll {row['collectives_per_step']:g}/step"
    if row["outcome"] == REFUSED:
        return "refused before serving (not run on this side)"
    where = f" {row['site']}" if row.get("site") else ""
    at = f"@{row['step']}" if row.get("step") is not None else ""
    return f"{row['outcome']}{where}{at}"


def _checker(row: dict | None, consensus: bool) -> str:
    return f"; SGLang's checker {row.get('sglang_consensus')}" if consensus and row else ""


def change_table(rows: list[dict], consensus: bool = False) -> list[str]:
    """Markdown: one line per changed cell, the reference's cell against the other side's;
    a line saying none changed otherwise."""
    names = side_names(rows)
    found = changes(rows, consensus)
    if len(names) < 2:
        return []
    if not found:
        return [f"No cell changed between {names[0]} and {', '.join(names[1:])} (outcome"
                f"{' or SGLang checker' if consensus else ''})."]
    lines = [f"| scenario | {names[0]} | side | its cell | |", "|---|---|---|---|---|"]
    for c in found:
        lines.append(f"| {c.scenario} | {cell_words(c.ref)}{_checker(c.ref, consensus)} | "
                     f"{c.side} | {cell_words(c.row)}{_checker(c.row, consensus)} | "
                     f"{'**worse**' if c.worse else 'changed'} |")
    return lines


def summary_lines(rows: list[dict], consensus: bool = False) -> list[str]:
    """The terminal's: the changed cells first, then the rest, a line each."""
    names = side_names(rows)
    found = changes(rows, consensus)
    out = [f"Changed from {names[0]} ({len(found)}):" if found else
           f"No cell changed from {names[0]}."]
    out += [f"  {c.scenario:<13} {cell_words(c.ref)} -> {c.side} "
            f"{cell_words(c.row)}{'  WORSE' if c.worse else ''}" for c in found]
    moved = {c.scenario for c in found}
    rest = [r for r in rows if r["scenario"] not in moved]
    if rest:
        out.append("The rest (alike on every side):")
        out += [f"  {r['scenario']:<13} {r['protocol']:<28} {cell_words(r)}" for r in rest]
    return out


def worse(rows: list[dict], consensus: bool = False) -> list[Change]:
    return [c for c in changes(rows, consensus) if c.worse]
