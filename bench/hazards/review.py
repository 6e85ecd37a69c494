"""review.md: the one page a reviewer of a pull request to SGLang reads (`bench review`).

Built from a run of the sides (`bench run --cache sglang --sglang base=SPEC,head=SPEC`:
its summary and request rows and its plan) and a hazard matrix of the same sides (`bench
hazards`: its rows): what the run and the matrix concluded, the run's headline (every
side's ratios to the reference, bench.analysis.sides), its counts side by side by call
site, and the hazard cells whose outcome changed from the reference's (bench.hazards.sides);
under `--strict-counts`, the count differences no explained call site accounts for.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from bench.analysis import side_timings
from bench.analysis.side_timings import Verdict, failing
from bench.analysis.sides import count_changes, counts_text, headline_lines
from bench.hazards.sides import change_table, changes, worse
from bench.tables import WIDTH, wrapped

TIMING_RULE = ("Each side against the first, per policy, as `make gate` judges a revision: "
               "PASS when the whole 95% interval of the ratio lies below 1 + threshold, "
               "FAIL when it lies above, UNRESOLVED (failing, like the gate) while it holds "
               "it, NOT JUDGED without an interval (fewer than 3 repeats); more repeats "
               "(--run-args '--repeats N') narrow an UNRESOLVED one.")


@dataclass(frozen=True)
class Part:
    """One verb's share of the review: how it ended and what it left."""

    command: str  # as run, for the page
    folder: str
    code: int  # its exit code: 0 OK, 1 FAILED (hazards: a hazard), 3 (hazards) harness


@dataclass(frozen=True)
class RunRows:
    """What the run of the sides left (summary None: it ended before writing one)."""

    summary: pd.DataFrame | None
    requests: pd.DataFrame | None
    plan: dict | None


def verdict(run: Part, hazards: Part, rows: list[dict], consensus: bool,
            counts: list[str] | None = None, timings: list[Verdict] | None = None
            ) -> list[str]:
    """Why the review fails, a reason a line ([] when it does not); `counts`: the
    unexplained count differences of a strict review (None: not strict); `timings`: the
    sides' timing verdicts (bench.analysis.side_timings), FAIL and UNRESOLVED failing."""
    why = [f"the run FAILED (exit {run.code}): {run.folder}"] if run.code else []
    why += [f"count difference not explained: {c}" for c in counts or []]
    why += [f"timing {t}" for t in failing(timings or [])]
    lost = worse(rows, consensus)
    why += [f"hazard cell {c.scenario} is worse on {c.side}: {c.ref['outcome']} -> "
            f"{c.row['outcome']}" for c in lost]
    if hazards.code and not lost:
        why.append(f"the hazard matrix FAILED (exit {hazards.code}: "
                   f"{MATRIX_FAILED.get(hazards.code, 'it ended early')}): {hazards.folder}")
    return why


def closing_lines(prog: str, why: list[str], timings: list[Verdict], page_path: str
                  ) -> list[str]:
    """What `bench review` prints once the page is written, no line wider than a terminal
    (bench.tables.WIDTH): each side's timing verdict, then a last line OK or FAILED with its
    reasons, naming the page. Where that is too wide, the reasons stand above it, one a
    line (the last line counts them), and then the page's path too."""
    lines = [f"{prog}: timing {t.text()}" for t in timings]
    said = "FAILED: " + "; ".join(why) if why else "OK"
    if why and len(f"{prog}: {said} -> {page_path}") > WIDTH:
        lines += [f"{prog}: why: {w}" for w in why]
        said = f"FAILED: {len(why)} reason{'s' * (len(why) > 1)} above"
    last = f"{prog}: {said} -> {page_path}"
    if len(last) > WIDTH:
        lines.append(f"{prog}: the page: {page_path}")
        last = f"{prog}: {said} (the page above)"
    return wrapped([*lines, last])


# bench hazards' exit codes other than 0 and 2 (bench.hazards.report.exit_code)
MATRIX_FAILED = {1: "a hazard: a cell hung past its bound (livelock or deadlock) or "
                    "differed between two runs",
                 3: "its harness failed: a cell it could not run"}


def strict_counts(got: RunRows, explained: tuple[str, ...]) -> list[str]:
    """The count differences no `explained` site accounts for (bench.analysis.sides
    count_changes); none where the run wrote no summary (its failure says why)."""
    if got.summary is None or got.requests is None or not got.plan:
        return []
    return count_changes(got.summary, got.requests, got.plan, explained)


def page(sides: list[str], run: Part, hazards: Part, got: RunRows, rows: list[dict],
         consensus: bool = False, counts: list[str] | None = None,
         explained: tuple[str, ...] = (), timings: list[Verdict] | None = None
         ) -> list[str]:
    """The page's lines (markdown); `counts` and `timings` as for verdict."""
    why = verdict(run, hazards, rows, consensus, counts, timings)
    found = changes(rows, consensus)
    return [f"# Review: {', '.join(sides[1:])} against {sides[0]}", "",
            ("**FAILED**: " + "; ".join(why) + "." if why else
             f"**OK**: the run ended OK and no hazard cell got worse ({len(found)} changed)."),
            "", f"- run: `{run.command}` -> {run.folder} (exit {run.code})",
            f"- hazards: `{hazards.command}` -> {hazards.folder} (exit {hazards.code})", "",
            "## The run's headline", "", *_block(_headline(got)), "",
            "## Timings at the gate's thresholds", "", TIMING_RULE, "",
            *side_timings.lines(timings or []), "",
            "## Counts side by side, by call site", "", *_block(_counts(got)), "",
            *_strict(counts, explained),
            "## Hazard cells that changed", "",
            *(change_table(rows, consensus) or ["No hazard cells were run."]), "",
            f"Every cell, each side's: {hazards.folder}/hazards.md."]


def _strict(counts: list[str] | None, explained: tuple[str, ...]) -> list[str]:
    """What a strict review found of the counts (nothing for a review that is not)."""
    if counts is None:
        return []
    said = f" (explained: {', '.join(explained)})" if explained else ""
    return ["## Count differences (--strict-counts)", "",
            *([f"- {c}" for c in counts] or
              [f"None unexplained{said}: every side issues what the reference does, at the "
               "same call sites."]), ""]


def _headline(got: RunRows) -> list[str]:
    if got.summary is None or not got.plan:
        return ["The run wrote no summary (it ended before its serves did): see its folder."]
    return headline_lines(got.summary, got.plan)


def _counts(got: RunRows) -> list[str]:
    if got.summary is None or got.requests is None or not got.plan:
        return ["No counts: the run wrote no summary."]
    return counts_text(got.summary, got.requests, got.plan)


def _block(lines: list[str]) -> list[str]:
    """Fixed-width text kept as printed."""
    return ["```text", *lines, "```"]
