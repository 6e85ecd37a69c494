"""The README and docs/ hold together in a fresh clone: the README stays short, every link
and every "docs/..." or "docs/design.md section N" a file cites exists, and nothing cites a
file a clone does not have (the first spec and the team's shared folder lived outside the
repository)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
README_LIMIT_BYTES = 10 * 1024
# Pages other branches are writing, cited before they land (remove an entry once it has).
PENDING: dict[str, str] = {}  # doc paths cited before they land: path -> the branch bringing it
OUTSIDE = re.compile(r"SPEC(\.md| section \d| \d\b)|\.\./shared|/work/shared")
DOC_PATH = re.compile(r"\bdocs/[\w./-]*\w\.(?:md|png)")
SECTION = re.compile(r"docs/design\.md,? sections? (\d+(?:\.\d+)?)")
LINK = re.compile(r"\]\(([^)\s]+)\)")

pytestmark = pytest.mark.timeout(30)


def _sources() -> list[Path]:
    """The text files a clone carries: code, tests, scripts, docs, README, Makefile."""
    files = [REPO / "README.md", REPO / "Makefile", REPO / "pyproject.toml"]
    for top in ("hicache", "bench", "tests", "scripts", "docs"):
        files += [p for p in (REPO / top).rglob("*")
                  if p.suffix in (".py", ".sh", ".md") and "__pycache__" not in p.parts]
    return sorted(files)


def _slug(heading: str) -> str:
    """GitHub's anchor of a markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    return {_slug(line.lstrip("#")) for line in page.read_text().splitlines()
            if line.startswith("#")}


def test_the_readme_stays_under_10_kb():
    size = len((REPO / "README.md").read_bytes())
    assert size <= README_LIMIT_BYTES, f"README.md is {size} bytes; move detail into docs/"


def test_nothing_cites_a_file_outside_the_repository():
    hits = [f"{path.relative_to(REPO)}:{n}: {line.strip()}" for path in _sources()
            if path != Path(__file__)  # its own patterns
            for n, line in enumerate(path.read_text().splitlines(), 1) if OUTSIDE.search(line)]
    assert not hits, "cite docs/design.md section N instead:\n" + "\n".join(hits)


def test_every_cited_docs_file_and_design_section_exists():
    headings = [line for line in (REPO / "docs" / "design.md").read_text().splitlines()
                if line.startswith(("## ", "### "))]
    numbers = {h.split()[1].rstrip(".") for h in headings}
    bad = []
    for path in _sources():
        text = path.read_text()
        bad += [f"{path.relative_to(REPO)} cites {m}" for m in sorted(set(DOC_PATH.findall(text)))
                if not (REPO / m).exists() and m not in PENDING]
        bad += [f"{path.relative_to(REPO)} cites docs/design.md section {n}, which it lacks"
                for n in sorted(set(SECTION.findall(" ".join(text.split())))) if n not in numbers]
    assert not bad, "\n".join(bad)


def test_every_relative_link_resolves():
    bad = []
    for page in [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]:
        for target in LINK.findall(page.read_text()):
            if re.match(r"[a-z]+:", target):
                continue  # http(s), mailto
            file, _, anchor = target.partition("#")
            dest = (page.parent / file).resolve() if file else page
            rel = dest.relative_to(REPO).as_posix() if dest.is_relative_to(REPO) else str(dest)
            if not dest.exists():
                if rel not in PENDING:
                    bad.append(f"{page.relative_to(REPO)}: {target}: no such file")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                bad.append(f"{page.relative_to(REPO)}: {target}: no heading with that anchor")
    assert not bad, "\n".join(bad)


def test_the_options_page_is_the_parsers_own():
    """docs/options.md is generated from the verbs' parsers (scripts/options_doc.py)."""
    from bench.commands.options_doc import options_markdown

    text = options_markdown()
    assert "| `--preset` | `default` |" in text and "## `bench gate RUN_DIR`" in text
    assert (REPO / "docs" / "options.md").read_text() == text, \
        "docs/options.md is stale: run python scripts/options_doc.py"
