"""The one printer: every verb's console lines (say on stdout, progress and say_err on
stderr), fixed-width tables within a terminal's WIDTH, markdown tables for report files.
The only module of bench/ that calls print (tests/test_layout.py)."""

from __future__ import annotations

import sys
import textwrap


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


# ---- a terminal's width ----------------------------------------------------------------------
# No console line is wider than WIDTH: a wide table stacks its columns in groups (each group
# repeats the key columns, as the headline does), prose wraps with a two-space indent.
WIDTH = 120
GAP = "  "


def fixed_width(headers: list[str], rows: list[list[str]], right: frozenset[int] = frozenset()
                ) -> list[str]:
    """One fixed-width table: columns two spaces apart, those in `right` right-aligned."""
    table = [headers, *rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(headers))]
    return [GAP.join(c.rjust(w) if i in right else c.ljust(w)
                     for i, (c, w) in enumerate(zip(r, widths, strict=True))).rstrip()
            for r in table]


def column_groups(headers: list[str], rows: list[list[str]], keys: int = 2,
                  width: int = WIDTH) -> list[list[int]]:
    """The column indices of each stacked group: the first `keys` columns in every group,
    then the others in order, cut into as few groups as fit in `width`, as even as can be
    (the widest group as narrow as it can be)."""
    table = [headers, *rows]
    cost = [max(len(r[i]) for r in table) + len(GAP) for i in range(len(headers))]
    base, rest = sum(cost[:keys]), list(range(keys, len(headers)))
    for count in range(1, len(rest) + 1):
        cuts = _even_cuts([cost[i] for i in rest], count)
        groups = [rest[a:b] for a, b in zip([0, *cuts], [*cuts, len(rest)], strict=True)]
        if all(base + sum(cost[i] for i in g) - len(GAP) <= width for g in groups):
            return [list(range(keys)) + g for g in groups]
    return [list(range(keys)) + [i] for i in rest]  # one column a group: as narrow as it gets


def _even_cuts(sizes: list[int], count: int) -> list[int]:
    """Where to cut `sizes` into `count` runs so that the largest run's sum is least."""
    best: dict[tuple[int, int], tuple[int, list[int]]] = {}

    def solve(start: int, parts: int) -> tuple[int, list[int]]:
        if parts == 1:
            return sum(sizes[start:]), []
        if (start, parts) not in best:
            best[start, parts] = min(
                (max(sum(sizes[start:cut]), solve(cut, parts - 1)[0]),
                 [cut, *solve(cut, parts - 1)[1]])
                for cut in range(start + 1, len(sizes) - parts + 2))
        return best[start, parts]

    return solve(0, count)[1]


def fitted_table(headers: list[str], rows: list[list[str]], keys: int = 2,
                 right: frozenset[int] = frozenset(), width: int = WIDTH) -> list[str]:
    """A table no wider than `width`: whole when it fits, else its columns in stacked
    groups, each led by the first `keys` columns (the row's names)."""
    whole = fixed_width(headers, rows, right)
    if max(map(len, whole)) <= width:
        return whole
    out: list[str] = []
    for group in column_groups(headers, rows, keys, width):
        out += fixed_width([headers[i] for i in group], [[r[i] for i in group] for r in rows],
                           frozenset(n for n, i in enumerate(group) if i in right))
    return out


def wrapped(lines: list[str], width: int = WIDTH) -> list[str]:
    """Prose at a terminal's width: a longer line wraps, its continuation indented two
    spaces more than the line itself; a line that fits is kept as it is, a word (a path)
    longer than a line is cut."""
    out = []
    for line in lines:
        if len(line) <= width:
            out.append(line)
            continue
        lead = line[:len(line) - len(line.lstrip())]
        out += textwrap.wrap(line, width, initial_indent="", subsequent_indent=lead + "  ",
                             break_on_hyphens=False) or [""]
    return out


def fit(*lines: str) -> str:
    """`lines` as one text for a terminal: each wrapped at WIDTH (wrapped)."""
    return "\n".join(wrapped([part for line in lines for part in line.split("\n")]))


def verdict_lines(line: str, width: int = WIDTH) -> list[str]:
    """A verdict line within `width`, wrapped as prose but its last two words kept together,
    so the last line still ends as the verdict does (`...: FAILED`)."""
    head, _, last = line.rpartition(" ")
    glued = f"{head}\u00a0{last}" if head else line  # textwrap never breaks at a no-break space
    return [part.replace("\u00a0", " ") for part in wrapped([glued], width)]


def command_lines(cmd: str, indent: int = 4, width: int = WIDTH) -> list[str]:
    """A shell command to copy, within `width`: cut between words, each cut line ending in
    ` \\` (the shell joins them again), continuations indented two spaces more."""
    lines, line = [], " " * indent
    for word in cmd.split(" "):
        if line.strip() and len(line) + 1 + len(word) + 2 > width:
            lines.append(line + " \\")
            line = " " * (indent + 2) + word
        else:
            line += (" " if line.strip() else "") + word
    return lines + [line]


def say(text: str) -> None:
    """A verb's output on stdout, flushed: the one place new code prints a result."""
    print(text, flush=True)


def say_err(text: str, end: str = "\n") -> None:
    """A line for stderr as it is (an error, a warning, a partial line ended by `end`),
    flushed."""
    print(text, end=end, file=sys.stderr, flush=True)


def progress(line: str) -> None:
    """A verb's progress line on stderr, flushed, fitted to a terminal (fit)."""
    print(fit(line), file=sys.stderr, flush=True)


def console_table(headers: list[str], rows: list[list[str]], long: tuple[str, ...] = (),
                  keys: int = 1) -> list[str]:
    """A table for a terminal whose `long` columns (call-site chains, error text) would not
    fit in any column group: the others as fitted_table, then each row's long cells below,
    one wrapped line each, named by the row's first `keys` cells and the column."""
    short = [i for i, h in enumerate(headers) if h not in long]
    out = fitted_table([headers[i] for i in short], [[r[i] for i in short] for r in rows],
                       keys=min(keys, len(short)))
    for r in rows:
        name = " ".join(r[:keys])
        out += wrapped([f"  {name} {headers[i]}: {r[i]}" for i, h in enumerate(headers)
                        if h in long and r[i]])
    return out
