"""The README and docs/ hold together in a fresh clone: the README stays short, every link
and every "docs/..." or "docs/design.md section N" a file cites exists, and nothing cites a
file a clone does not have (the first spec and the team's shared folder lived outside the
repository)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
README_LIMIT_BYTES = 8 * 1024
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
    for top in ("hicache", "bench", "sglang_adapter", "tests", "scripts", "docs"):
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


def test_the_readme_stays_under_8_kb():
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


# ---- every option and module a page names exists -------------------------------------------

OPTION = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]+)")
MODULE_PATH = re.compile(
    r"(?<![\w/.])((?:hicache|bench|sglang_adapter|scripts|tests)/[\w/]+\.(?:py|sh))\b")
DOTTED = re.compile(r"(?<![\w./-])((?:hicache|bench|sglang_adapter)(?:\.[A-Za-z_]\w*)+)")
# Options of other tools that the docs quote: torchrun, SGLang's bench_serving, pytest and
# its plugins, mutmut, venv, SGLang's server.
EXTERNAL_OPTIONS = {"--nnodes", "--nproc-per-node", "--rdzv-backend", "--rdzv-endpoint",
                    "--dataset-name", "--hicache-ratio", "--mooncake-slowdown-factor",
                    "--dist", "--durations", "--junitxml", "--max-children",
                    "--system-site-packages", "--dist-timeout"}
COMMIT_PAGE = re.compile(r"_([0-9a-f]{7,40})\.md$")


def _pages() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def _defined_options() -> set[str]:
    """Every option string a parser, script or target of the repository spells."""
    text = " ".join(p.read_text() for top in ("bench", "scripts", "sglang_adapter", "hicache")
                    for p in (REPO / top).rglob("*.py"))
    text += " ".join(p.read_text() for p in (REPO / "scripts").glob("*.sh"))
    text += (REPO / "Makefile").read_text() + (REPO / ".ci" / "run").read_text()
    return set(re.findall(r"""["'](--[a-z][a-z0-9-]+)""", text))


def test_every_option_the_docs_name_exists():
    defined = _defined_options() | EXTERNAL_OPTIONS
    bad = [f"{page.relative_to(REPO)} names {o}" for page in _pages()
           for o in sorted(set(OPTION.findall(page.read_text())))
           if o not in defined and not _option_existed_at(page, o)]
    assert not bad, "no parser defines these:\n" + "\n".join(bad)


def _option_existed_at(page: Path, option: str) -> bool:
    """A dated results page (…_<commit>.md) may name an option as it was at its commit."""
    m = COMMIT_PAGE.search(page.name)
    if not m:
        return False
    import subprocess

    done = subprocess.run(["git", "grep", "-q", "-F", "-e", f'"{option}"', m.group(1), "--",
                           "bench", "scripts"], cwd=REPO, capture_output=True)
    return done.returncode == 0


def _existed_at(page: Path, path: str) -> bool:
    """A dated results page (…_<commit>.md) may name a file as it was at its commit."""
    m = COMMIT_PAGE.search(page.name)
    if not m:
        return False
    import subprocess

    done = subprocess.run(["git", "cat-file", "-e", f"{m.group(1)}:{path}"], cwd=REPO,
                          capture_output=True)
    return done.returncode == 0


def _module_exists(name: str) -> bool:
    """`a.b.c` is a module, or a name its deepest module defines at top level (then one
    attribute of that, unchecked: a method or a field)."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        base = REPO.joinpath(*parts[:i])
        source = base.with_suffix(".py") if base.with_suffix(".py").exists() \
            else base / "__init__.py"
        if source.exists():
            break
    else:
        return False
    if i == len(parts):
        return True
    defined = re.compile(rf"^(?:class|def) {parts[i]}\b|^{parts[i]}\s*[:=]|"
                         rf"^from \S+ import .*\b{parts[i]}\b", re.M)
    return len(parts) - i <= 2 and bool(defined.search(source.read_text()))


def test_every_module_the_docs_and_docstrings_name_exists():
    bad = []
    for page in _pages():
        text = page.read_text()
        bad += [f"{page.relative_to(REPO)} names {m}"
                for m in sorted(set(MODULE_PATH.findall(text)))
                if not (REPO / m).exists() and not _existed_at(page, m)]
        if "results" not in page.parts:  # a dated page may name mutants of its commit
            bad += [f"{page.relative_to(REPO)} names {m}" for m in sorted(set(DOTTED.findall(text)))
                    if not _module_exists(m)]
    for path in _sources():
        if path.suffix == ".py" and path != Path(__file__):
            bad += [f"{path.relative_to(REPO)} names {m}"
                    for m in sorted(set(MODULE_PATH.findall(path.read_text())))
                    if not (REPO / m).exists()]
    assert not bad, "\n".join(bad)


def test_the_checks_catch_a_planted_name():
    assert not _module_exists("hicache.protocols.Pr36425")  # moved to hicache.agreement
    assert _module_exists("hicache.agreement.protocols.Pr36425")
    assert "--no-such-flag" not in _defined_options()


# ---- docs/ a user reads: sizes, no tracker history, one name per idea --------------------

DOCS_LIMIT_BYTES = 150_000  # docs/*.md outside docs/results/, all together
PAGE_LIMIT_BYTES = 30_000  # any one of them
# The tracker's issues and the rounds of work on them are history: git's and the dated pages'
# under docs/results/, never a reference page's (SGLang's issues read "#30760" or "SGLang
# #30760", never "issue 30760").
HISTORY = re.compile(r"\bissues? #?\d+|\b(?:first|second|third|fourth|fifth|sixth|this|each) "
                     r"round\b|\bround (?:one|two|three|\d+)\b|status against|"
                     r"written before the code", re.I)
RETIRED_OPTIONS = ("--sglang-controller",)  # now --sglang-path controller


def _user_pages() -> list[Path]:
    return sorted((REPO / "docs").glob("*.md"))


def test_the_docs_fit_their_size_limits():
    sizes = {p.name: len(p.read_bytes()) for p in _user_pages()}
    big = {name: size for name, size in sizes.items() if size > PAGE_LIMIT_BYTES}
    assert not big, f"pages over {PAGE_LIMIT_BYTES} bytes: {big}; split them by purpose"
    total = sum(sizes.values())
    assert total <= DOCS_LIMIT_BYTES, \
        f"docs/*.md hold {total} bytes, over {DOCS_LIMIT_BYTES}: link results, do not retell"


def test_no_page_outside_the_results_speaks_of_the_trackers_issues():
    pages = [REPO / "README.md", *_user_pages()]
    hits = [f"{p.relative_to(REPO)}:{n}: {m.group(0)!r}" for p in pages
            for n, line in enumerate(p.read_text().splitlines(), 1)
            for m in HISTORY.finditer(line)]
    assert not hits, "history belongs to git and docs/results/:\n" + "\n".join(hits)


def test_a_retired_option_is_named_nowhere():
    hits = [f"{path.relative_to(REPO)}:{n}" for path in _sources() if path != Path(__file__)
            for n, line in enumerate(path.read_text().splitlines(), 1)
            if any(o in line for o in RETIRED_OPTIONS)]
    assert not hits, "--sglang-controller is --sglang-path controller:\n" + "\n".join(hits)


def test_the_map_reaches_every_page_and_before_after_is_two_clicks_from_the_readme():
    index = (REPO / "docs" / "index.md").read_text()
    unlinked = [p.name for p in _user_pages()
                if p.name != "index.md" and f"]({p.name}" not in index]
    assert not unlinked, f"docs/index.md does not link {unlinked}"
    readme = (REPO / "README.md").read_text()
    assert "(docs/index.md)" in readme and "(before-after.md)" in index


HOW_TO = ("tutorial.md", "before-after.md", "sglang-ci.md", "traces.md", "gpu.md",
          "neighbour.md", "timeline.md")
COMMAND = re.compile(r"^(?:\.venv/bin/)?python3? -m bench (\w[\w-]*)(.*)$")


def _commands(page: Path) -> list[tuple[str, str]]:
    """(verb, arguments) of every `python -m bench VERB ...` line in the page's code blocks,
    continuation lines joined, comments dropped; a line with [optional] parts is a synopsis."""
    text, out, inside = page.read_text().replace("\\\n", " "), [], False
    for line in text.splitlines():
        if line.startswith("```"):
            inside = not inside
            continue
        m = COMMAND.match(line.strip()) if inside else None
        if m and "[" not in m.group(2):
            out.append((m.group(1), m.group(2).split(" #")[0]))
    return out


def test_the_tutorial_and_how_to_commands_parse_as_written():
    """Every command the tutorial and the how-to guides show is one its verb's parser takes
    (options, choices, arity), read as written."""
    import shlex

    from bench.commands.options_doc import verb_parser

    cmds = [(page.name, verb, args) for page in map((REPO / "docs").joinpath, HOW_TO)
            for verb, args in _commands(page)]
    assert len(cmds) >= 10
    bad = []
    for page, verb, args in cmds:
        try:
            verb_parser(verb).parse_args(shlex.split(args))
        except SystemExit:
            bad.append(f"{page}: python -m bench {verb}{args}")
    assert not bad, "commands their verb refuses:\n" + "\n".join(bad)
