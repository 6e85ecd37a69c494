"""scripts/test_all.py (make test-all): pytest's closing lines are read per tier, the record
replaces only its own block of docs/testing.md, and a bad tier is refused with exit 2."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "test_all.py"
spec = importlib.util.spec_from_file_location("test_all", SCRIPT)
test_all = importlib.util.module_from_spec(spec)
spec.loader.exec_module(test_all)

pytestmark = pytest.mark.timeout(30)


def test_closing_lines_are_read_per_pytest_call():
    out = ("....\n2058 passed, 6 skipped in 83.22s (0:01:23)\nmake: ...\n"
           "==== 1 failed, 25 passed in 6.11s ====\n")
    assert test_all.closing_lines(out) == "2058 passed, 6 skipped in 83.22s (0:01:23); " \
        "1 failed, 25 passed in 6.11s"
    assert test_all.closing_lines("no tests ran") == ""


def test_the_record_replaces_only_its_block(tmp_path, monkeypatch):
    doc = tmp_path / "testing.md"
    doc.write_text(f"# Testing\nbefore\n{test_all.BEGIN}\nold\n{test_all.END}\nafter\n")
    monkeypatch.setattr(test_all, "DOC", doc)
    rows = [{"tier": "test", "command": "make test", "result": "FAIL",
             "pytest": "1 failed, 2 passed in 3s", "seconds": 9}]
    test_all.record(rows)
    text = doc.read_text()
    assert text.startswith("# Testing\nbefore\n") and text.endswith(f"{test_all.END}\nafter\n")
    assert "old" not in text
    assert "| test | `make test` | FAIL | 1 failed, 2 passed in 3s | 9 |" in text


def test_a_doc_without_markers_is_refused(tmp_path, monkeypatch):
    doc = tmp_path / "testing.md"
    doc.write_text("# Testing\n")
    monkeypatch.setattr(test_all, "DOC", doc)
    with pytest.raises(SystemExit, match="markers"):
        test_all.record([])
    assert doc.read_text() == "# Testing\n"


def test_an_unknown_tier_exits_2(capsys):
    assert test_all.main(["nope"]) == 2
    assert "unknown tier 'nope'" in capsys.readouterr().err


def test_the_doc_carries_the_markers():
    text = (SCRIPT.parent.parent / "docs" / "results" / "test_all.md").read_text()
    assert text.count(test_all.BEGIN) == 1 and text.count(test_all.END) == 1
