"""Every time README.md and docs/ quote for a job (make bench, make test, CI, the gate...)
comes from one measured source, docs/results/times.json: each job's command, measured
seconds, commit, date and machine, and the words each page uses. A quote must agree with
the seconds (within half a minute, or 5 s for a figure in seconds), and a page line that
names a job beside a time must quote it from that file. The make test-all block of
docs/testing.md is a dated record its script writes, and is left out."""

from __future__ import annotations

import json
import re
from fractions import Fraction
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TIMES = REPO / "docs" / "results" / "times.json"

pytestmark = pytest.mark.timeout(30)

JOB = re.compile(r"make (?:bench|test|test-fast|test-all|test-stats|gate|sglang-slice|"
                 r"sglang-check|mutate|delay-sweep|gpu-check)\b|\bCI\b|preset delay-sweep|"
                 r"`delay-sweep`|bench review")
NUMBER = r"\d+(?:\.\d+)?[½¼¾]?|[½¼¾]"
TIME = re.compile(rf"(?:about |~|over |under )?(?:{NUMBER})(?:-(?:{NUMBER}))?"
                  rf"(?:\s?(?:minutes?|min)\b|\s?s\b(?!\w))|\d+[½¼¾]"
                  rf"|(?:about |~)\d+\b(?!\.\d|\s*[A-Za-z%])")  # "about 7 (all of CI"
# A configured bound is no measured time: a budget, a timeout, an aim.
BOUND = re.compile(r"(?:up to|budget|timeout|bounded at|in under|under|within|or less|"
                   r"target)\W+(?:\w+\W+){0,2}$", re.I)
GENERATED = re.compile(r"<!-- test-all: begin -->.*?<!-- test-all: end -->", re.S)
FRACTIONS = {"½": Fraction(1, 2), "¼": Fraction(1, 4), "¾": Fraction(3, 4)}


def _number(text: str) -> float:
    whole = re.match(r"\d+(?:\.\d+)?", text)
    return (float(whole.group(0)) if whole else 0.0) + float(FRACTIONS.get(text[-1], 0))


def quoted_range(text: str) -> tuple[float, float, str]:
    """(low, high, how) in seconds of a quote: '3½ minutes', '13-15', 'about 40 s',
    'over 41 min'; how is 'over' or 'range'. Without a unit a quote is in minutes."""
    m = re.search(rf"({NUMBER})(?:-({NUMBER}))?", text)
    assert m, f"no figure in the quote {text!r}"
    unit = 1 if re.search(rf"(?:{NUMBER})\s?s\b", text) else 60
    low = _number(m.group(1))
    high = _number(m.group(2)) if m.group(2) else low
    return low * unit, high * unit, "over" if "over" in text else "range"


def agrees(text: str, seconds: list[float]) -> bool:
    """A quote holds its measured seconds within rounding: 15 s for a figure in minutes, 5 s
    for one in seconds, or 5 % where that is more."""
    low, high, how = quoted_range(text)
    step = 5 if re.search(rf"(?:{NUMBER})\s?s\b", text) else 15
    if how == "over":
        return min(seconds) >= low - max(step, 0.05 * low)
    return (low - max(step, 0.05 * low) <= min(seconds)
            and max(seconds) <= high + max(step, 0.05 * high))


def _jobs() -> dict:
    return json.loads(TIMES.read_text())["jobs"]


def _flat(text: str) -> str:
    return " ".join(text.split())


def test_every_job_says_where_its_seconds_come_from():
    for name, job in _jobs().items():
        assert job["seconds"] and all(s > 0 for s in job["seconds"]), name
        for key in ("command", "commit", "date", "machine", "source", "quotes"):
            assert job.get(key), f"times.json: {name} lacks {key}"
        assert re.fullmatch(r"\d{4}-\d\d-\d\d", job["date"]), name


def test_every_quote_is_on_its_page_and_agrees_with_the_measured_seconds():
    bad = []
    for name, job in _jobs().items():
        for quote in job["quotes"]:
            page = REPO / quote["page"]
            if _flat(quote["text"]) not in _flat(page.read_text()):
                bad.append(f"{quote['page']} no longer says {quote['text']!r} ({name})")
            elif not agrees(quote["text"], job["seconds"]):
                bad.append(f"{quote['page']}: {quote['text']!r} against {name}'s measured "
                           f"{job['seconds']} s")
    assert not bad, "\n".join(bad)


def _pages() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def unsourced_times(page: str, text: str, quotes: list[str]) -> list[str]:
    """Each time on a line that names a job and is in none of the page's quotes."""
    out = []
    for n, line in enumerate(GENERATED.sub("", text).splitlines(), 1):
        if not JOB.search(line):
            continue
        for m in TIME.finditer(line):
            if BOUND.search(line[:m.start()]) or any(m.group(0) in q for q in quotes):
                continue
            out.append(f"{page}:{n}: {m.group(0)!r}")
    return out


def test_no_page_quotes_a_jobs_time_that_times_json_lacks():
    quotes: dict[str, list[str]] = {}
    for job in _jobs().values():
        for q in job["quotes"]:
            quotes.setdefault(q["page"], []).append(q["text"])
    bad = []
    for page in _pages():
        rel = page.relative_to(REPO).as_posix()
        bad += unsourced_times(rel, page.read_text(), quotes.get(rel, []))
    assert not bad, ("quote these from docs/results/times.json (measure and add them there "
                     "first):\n" + "\n".join(bad))


@pytest.mark.parametrize("text, seconds, ok", [
    ("`make bench` took 3½ minutes", [212], True), ("about 4 minutes", [212], False),
    ("all of CI: 13-15", [779.8, 906.6], True), ("all of CI: 10½", [779.8, 906.6], False),
    ("about 40 s", [42], True), ("over 41 min", [2460], True), ("about 7 min", [437], True),
    ("about 7 min", [453], False), ("about 2 min", [104], False)])
def test_a_quote_is_held_to_its_seconds(text, seconds, ok):
    assert agrees(text, seconds) is ok


def test_the_scan_catches_a_time_no_measurement_backs():
    text = ("On 2 cores `make test` takes about 6 minutes.\nThe gate's budget is 420 s "
            "(`make gate`).\n`make bench` about 3 (CI: 10½).")
    assert unsourced_times("p.md", text, []) == ["p.md:1: 'about 6 minutes'", "p.md:3: 'about 3'",
                                                 "p.md:3: '10½'"]
    assert unsourced_times("p.md", text, ["about 6 minutes", "about 3 (CI: 10½)"]) == []
