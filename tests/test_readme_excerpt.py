"""scripts/readme_excerpt.py: the README's output excerpt is rebuilt from a run directory's
files, only between its two markers, and bad input leaves the README as it was.

The run directory is the committed CI baseline (a real ci run's env.json and summary.csv)
plus a verdict.json written here.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from bench.verdict.run_rules import Verdict

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "readme_excerpt.py"
_spec = importlib.util.spec_from_file_location("readme_excerpt", SCRIPT)
rx = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rx)

pytestmark = pytest.mark.timeout(60)
OK = Verdict()
HEAD, TAIL = "# Title\n\nintro line\n", "\n## After\n\nlast line\n"


def _run_dir(tmp_path: Path, verdict: Verdict | None = OK) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    for name in ("env.json", "summary.csv"):
        shutil.copy(REPO / "results" / "baseline" / name, run / name)
    if verdict is not None:
        verdict.write(run)
    return run


def _readme(tmp_path: Path, inner: str = "old excerpt\n") -> Path:
    path = tmp_path / "README.md"
    path.write_text(f"{HEAD}{rx.BEGIN}\n{inner}{rx.END}{TAIL}")
    return path


def test_rewrites_only_the_block_between_the_markers(tmp_path):
    run, readme = _run_dir(tmp_path, Verdict(("ranks disagreed on 1 request(s)",))), \
        _readme(tmp_path)
    assert rx.main([str(run), "--readme", str(readme)]) == 0
    text = readme.read_text()
    assert text.startswith(f"{HEAD}{rx.BEGIN}\n") and text.endswith(f"{rx.END}{TAIL}")
    block = text[len(HEAD) + len(rx.BEGIN) + 1: -len(rx.END + TAIL)].splitlines()
    assert "old excerpt" not in block
    # Provenance from env.json: the committed baseline is a ci run at TP2 on CPU.
    env = json.loads((REPO / "results" / "baseline" / "env.json").read_text())
    assert block[0] == (f"What `bench run` printed at commit {env['git']['commit'][:7]} "
                        f"({env['utc_time']}), preset ci, TP2 x PP1 on cpu/gloo, "
                        f"{env['cpu_count']} CPU cores:")
    code = block[block.index("```") + 1: len(block) - 1]
    # A pinned run (the ci baseline) leads with its cost decomposition, never a TTFT or ITL
    # heading: its TTFT and ITL are not a server's.
    assert block[-1] == "```" and code[0].startswith(
        "Cost decomposition, ratios to pr27010 [95% CI over repeats], pinned schedule")
    h = next(i for i, line in enumerate(code) if line.startswith("protocol"))  # title wraps
    assert code[h].split()[:3] == ["protocol", "policy", "coll/req"]
    assert "TTFT" not in code[h] and "ITL" not in code[h]
    # every protocol x policy of the ci run, in each of the table's two column groups
    cells = [[p, pol] for pol in ("best_effort", "wait_complete", "timeout")
             for p in ("pre27010", "pr27010", "pr36425", "step-batched", "step-clock")]
    assert [line.split()[:2] for line in code[h + 1:h + 16]] == cells
    assert code[h + 16].split()[:2] == ["protocol", "policy"] and "step x" in code[h + 16]
    assert [line.split()[:2] for line in code[h + 17:h + 32]] == cells
    assert code[h + 32].startswith(("Resolvable differences", "No intervals"))
    assert "Not a headline: TTFT and ITL on a pinned schedule" in " ".join(code[h + 32:])
    assert max(map(len, code)) <= 120
    assert code[-1] == "FAILED: ranks disagreed on 1 request(s)"


def test_a_free_run_leads_with_the_end_to_end_headline(tmp_path):
    run, readme = _run_dir(tmp_path), _readme(tmp_path)
    summary = pd.read_csv(run / "summary.csv")
    summary["schedule"] = "free"
    summary.to_csv(run / "summary.csv", index=False)
    assert rx.main([str(run), "--readme", str(readme)]) == 0
    code = readme.read_text().split("```\n")[1].splitlines()
    assert code[0].startswith("Headline, end to end, ratios to pr27010 [95% CI over "
                              "repeats], free schedule (what a server sees")
    # Two tables and their prose, each line under 120 characters (the title wraps).
    assert max(len(line) for line in code[:-1]) <= 120, max(code, key=len)
    h = next(i for i, line in enumerate(code) if line.startswith("protocol"))
    assert code[h].split()[:5] == ["protocol", "policy", "step", "ms", "step"]
    assert "TTFT p50 x prefetch" in code[h] and "ITL p50 x" in code[h]
    assert code[h + 7].split()[:3] == ["protocol", "policy", "polls/step"]
    assert "e2e p50 x" in code[h + 7] and "TTFT p99 x bystander" in code[h + 7]
    runs = [[p, pol] for pol in ("wait_complete", "timeout")
            for p in ("pr27010", "pr36425", "step-clock")]
    assert [line.split()[:2] for line in code[h + 1:h + 7]] == runs
    assert [line.split()[:2] for line in code[h + 8:h + 14]] == runs
    assert code[h + 14].startswith(("Resolvable differences", "No intervals"))


def test_a_second_rewrite_changes_nothing(tmp_path):
    run, readme = _run_dir(tmp_path), _readme(tmp_path)
    assert rx.main([str(run), "--readme", str(readme)]) == 0
    once = readme.read_text()
    assert rx.main([str(run), "--readme", str(readme)]) == 0
    assert readme.read_text() == once and "\nOK\n```\n" in once


@pytest.mark.parametrize("case", ["no verdict", "no headline rows", "no end marker",
                                  "markers reversed", "no run dir"])
def test_bad_input_is_one_line_exit_2_and_the_readme_untouched(tmp_path, capsys, case):
    run = _run_dir(tmp_path, None if case == "no verdict" else Verdict())
    readme = _readme(tmp_path)
    if case == "no headline rows":  # only pre27010 rows: nothing for the headline
        summary = pd.read_csv(run / "summary.csv")
        summary[summary["protocol"] == "pre27010"].to_csv(run / "summary.csv", index=False)
    if case == "no end marker":
        readme.write_text(f"{HEAD}{rx.BEGIN}\nold\n{TAIL}")
    if case == "markers reversed":
        readme.write_text(f"{HEAD}{rx.END}\nold\n{rx.BEGIN}{TAIL}")
    before = readme.read_text()
    target = tmp_path / "absent" if case == "no run dir" else run
    assert rx.main([str(target), "--readme", str(readme)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("readme_excerpt: ") and err.count("\n") == 1, err
    assert readme.read_text() == before


def test_the_repository_readme_carries_the_markers_once():
    lines = (REPO / "README.md").read_text().splitlines()
    assert lines.count(rx.BEGIN) == 1 and lines.count(rx.END) == 1
    assert lines.index(rx.BEGIN) < lines.index(rx.END)


def test_runs_as_a_script_from_another_directory(tmp_path):
    run, readme = _run_dir(tmp_path), _readme(tmp_path)
    out = subprocess.run([sys.executable, str(SCRIPT), str(run), "--readme", str(readme)],
                         cwd=tmp_path, text=True, capture_output=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "Cost decomposition, ratios to pr27010" in readme.read_text()
