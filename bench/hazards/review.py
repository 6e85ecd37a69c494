"""review.md: the one page a reviewer of a pull request to SGLang reads (`bench review`).

Built from a run of the sides (`bench run --cache sglang --sglang base=SPEC,head=SPEC`:
its summary and request rows and its plan) and a hazard matrix of the same sides (`bench
hazards`: its rows): what the run and the matrix concluded, the run's headline (every
side's ratios to the reference, bench.analysis.side_lead), its counts side by side by call
site, and the hazard cells whose outcome changed from the reference's (bench.hazards.side_changes);
under `--strict-counts`, the count differences no explained call site accounts for.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from bench.ab.sides import Verdict, failing, inconclusive
from bench.ab.sides import lines as timing_lines
from bench.analysis.side_lead import count_changes, counts_text, headline_lines
from bench.hazards.classify import REFUSED
from bench.hazards.side_changes import change_table, changes, worse
from bench.report.printer import WIDTH, wrapped

TIMING_RULE = ("Each side against the first, per policy, at the gate's thresholds and under "
               "its rule, as the gate judges two revisions: each side's serves of every "
               "stage read as one run, paired by repeat, with the served A/B's interval (the "
               "95% t interval of the paired log ratios; adjusted for each pair's lost CPU "
               "where over a tenth of the serves lost more than 5% of it); PASS when it lies "
               "below 1 + threshold, FAIL when it lies above; while it holds it the review adds a "
               "stage (a run on the next seed) within its budget, and at the budget it is "
               "INCONCLUSIVE when the machine was disturbed (its serves' cpu_lost p50 above "
               "5%), FAIL when it was quiet; NOT JUDGED without an interval (fewer than 3 "
               "repeats).")


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


@dataclass(frozen=True)
class Findings:
    """What the review's verbs found: how the run and the matrix ended, the matrix's rows
    (under SGLang's consensus checker or not), a strict review's unexplained count
    differences (None: not strict) and the sides' timing verdicts (as for verdict)."""

    run: Part
    hazards: Part
    rows: list[dict]
    consensus: bool = False
    counts: list[str] | None = None
    timings: list[Verdict] | None = None


def verdict(run: Part, hazards: Part, rows: list[dict], consensus: bool,
            counts: list[str] | None = None, timings: list[Verdict] | None = None
            ) -> list[str]:
    """Why the review fails, a reason a line ([] when it does not); `counts`: the
    unexplained count differences of a strict review (None: not strict); `timings`: the
    sides' timing verdicts at the budget (bench.ab.sides): FAIL fails it,
    INCONCLUSIVE does not (the page and the exit code say it apart: closing_lines)."""
    why = [f"the run FAILED (exit {run.code}): {run.folder}"] if run.code else []
    why += [f"count difference not explained: {c}" for c in counts or []]
    why += [f"timing {t}" for t in failing(_verdicts(timings))]
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
    (bench.report.printer.WIDTH): each side's timing verdict, then a last line OK, FAILED with its
    reasons, or INCONCLUSIVE (nothing failed, a timing check undecided on a disturbed
    machine), naming the page. Where that is too wide, the reasons stand above it, one a
    line (the last line counts them), and then the page's path too."""
    lines = [f"{prog}: timing {t.text()}" for t in timings]
    unsure = inconclusive(timings)
    said = ("FAILED: " + "; ".join(why) if why else
            f"INCONCLUSIVE: {len(unsure)} timing check(s) undecided on a disturbed machine"
            if unsure else "OK")
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


def exact_checks(rows: list[dict], run: Part, hazards: Part, counts: list[str] | None
                 ) -> int:
    """How many exact checks the review made: the run's own end, the matrix's end, every
    other side's hazard cell held against the reference's (a refused one is not), and under
    --strict-counts the counts of every side against the reference's."""
    names = list(dict.fromkeys(r["protocol"] for r in rows))
    held = sum(1 for r in rows if r["protocol"] in names[1:] and r["outcome"] != REFUSED)
    return 2 + held + (counts is not None)


def strict_counts(got: RunRows, explained: tuple[str, ...]) -> list[str]:
    """The count differences no `explained` site accounts for (bench.analysis.side_lead
    count_changes); none where the run wrote no summary (its failure says why)."""
    if got.summary is None or got.requests is None or not got.plan:
        return []
    return count_changes(got.summary, got.requests, got.plan, explained)


def page(sides: list[str], found: Findings, got: RunRows, explained: tuple[str, ...] = ()
         ) -> list[str]:
    """The page's lines (markdown)."""
    run, hazards, rows, consensus = found.run, found.hazards, found.rows, found.consensus
    counts, timings = found.counts, found.timings
    why = verdict(run, hazards, rows, consensus, counts, timings)
    changed = changes(rows, consensus)
    return [f"# Review: {', '.join(sides[1:])} against {sides[0]}", "",
            _said(why, _verdicts(timings), len(changed)),
            "", f"- run: `{run.command}` -> {run.folder} (exit {run.code})",
            f"- hazards: `{hazards.command}` -> {hazards.folder} (exit {hazards.code})", "",
            "## The run's headline", "", *_block(_headline(got)), "",
            "## Timings at the gate's thresholds", "", TIMING_RULE, "",
            *timing_lines(_verdicts(timings)), "",
            *getattr(timings, "about", list)(),
            "## Counts side by side, by call site", "", *_block(_counts(got)), "",
            *_strict(counts, explained),
            "## Hazard cells that changed", "",
            *(change_table(rows, consensus) or ["No hazard cells were run."]), "",
            *_refused(rows),
            f"Every cell, each side's: {hazards.folder}/hazards.md."]


def _refused(rows: list[dict]) -> list[str]:
    """The cells a side refused before serving (bench.hazards.matrix.refusal): not run
    there, never counted as failed."""
    found = [r for r in rows if r["outcome"] == REFUSED]
    if not found:
        return []
    return ["Refused before serving (the side cannot run the cell; not counted as failed):",
            "", *[f"- {r['scenario']} on {r['protocol']}: {r['detail']}" for r in found], ""]


def _verdicts(timings) -> list[Verdict]:
    """The verdicts of `timings`: a list of them, or the review's stages
    (bench.hazards.review_stages.Timings, whose `about` lines the page adds)."""
    return list(getattr(timings, "verdicts", timings) or [])


def _said(why: list[str], timings: list[Verdict], changed: int) -> str:
    """The page's verdict line: FAILED with every reason, INCONCLUSIVE, or OK."""
    if why:
        return "**FAILED**: " + "; ".join(why) + "."
    unsure = inconclusive(timings)
    if unsure:
        return (f"**INCONCLUSIVE**: nothing failed, but {len(unsure)} timing check(s) stayed "
                "undecided at the budget on a disturbed machine: " + "; ".join(unsure) + ".")
    return f"**OK**: the run ended OK and no hazard cell got worse ({changed} changed)."


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
