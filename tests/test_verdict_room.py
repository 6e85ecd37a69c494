"""The rules have one owner: bench/verdict/ alone binds the verdict words (PASS, FAIL,
INCONCLUSIVE, NOT JUDGED, UNRESOLVED, REFUSED) to names, every other module imports them; and
the room sits low, importing only the run directory's files and bench.stats, never a verb or
a room that judges with it. The scans: tests/layout_scan.py."""

from __future__ import annotations

import ast

import pytest

from tests import layout_scan as scan

pytestmark = pytest.mark.timeout(30)
ROOM = scan.REPO / "bench" / "verdict"
# What the rules may stand on: the run directory's files and the interval math.
BELOW = ("bench.verdict", "bench.rundir", "bench.stats")


def _word_constants() -> dict[str, list[tuple[int, str]]]:
    return {str(p.relative_to(scan.REPO)): hits for p in scan.code_files()
            if (hits := scan.verdict_word_constants(p.read_text()))}


def test_only_the_verdict_room_binds_the_verdict_words():
    found = _word_constants()
    own = found.pop("bench/verdict/words.py", [])
    assert len(own) >= 5, "the scan found too few words in words.py: it would pass vacuously"
    bad = [f"{f}:{n}: {name}" for f, hits in found.items() if not f.startswith("tests/")
           for n, name in hits]
    assert not bad, "import the verdict words from bench.verdict.words:\n" + "\n".join(bad)


@pytest.mark.parametrize("planted", [
    'PASS = "PASS"\n', 'PASS, FAIL, UNRESOLVED = "PASS", "FAIL", "UNRESOLVED"\n',
    'NOT_JUDGED: str = "NOT JUDGED"\n', 'class C:\n    KEEP = "INCONCLUSIVE"\n'])
def test_the_word_scan_catches_a_planted_constant(planted):
    assert scan.verdict_word_constants(planted)


def test_the_word_scan_passes_uses_of_the_words():
    assert not scan.verdict_word_constants(
        'from bench.verdict.words import PASS\nWORST = (PASS,)\nok = x == "PASS"\n'
        'def f():\n    state = "FAIL"\n    return state\nREFUSED = "refused"\n')


def _low_violations(edges: dict[str, set[str]]) -> list[str]:
    return [f"{m} imports {d}" for m, deps in edges.items() if m.startswith("bench.verdict")
            for d in deps if d.startswith("bench") and not d.startswith(BELOW)]


def test_the_verdict_room_sits_low():
    modules = scan.package_modules("bench")
    edges = {m: scan.imports_of(p) for m, p in modules.items() if m.startswith("bench.verdict")}
    assert len(edges) >= 6, "the scan found too few modules of bench/verdict/: vacuous"
    bad = _low_violations(edges)
    assert not bad, "bench/verdict/ judges; it imports no verb or consumer:\n" + "\n".join(bad)


@pytest.mark.parametrize("planted", ["bench.gate.evaluate", "bench.commands.gate",
                                     "bench.analysis.summarize"])
def test_the_low_check_catches_a_planted_import(planted):
    assert _low_violations({"bench.verdict.checks": {"bench.stats", planted}})


def test_the_verdict_room_has_a_one_line_docstring():
    doc = ast.get_docstring(ast.parse((ROOM / "__init__.py").read_text()))
    assert doc and "\n" not in doc.strip()
