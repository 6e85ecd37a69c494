"""CI's perf gate step (.ci/gate): an INCONCLUSIVE gate is run once more and a second is a
notice; each fresh decision can be kept in a history (GATE_HISTORY)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench.rundir import decision
from tests.test_gate_decision import a_decision

pytestmark = pytest.mark.timeout(300)

# ---- CI: .ci/gate reruns an INCONCLUSIVE gate once ----------------------------------------

FAKE_MAKE = """#!/usr/bin/env bash
# make gate, faked: the next code of $CODES; a new results/latest run, and its decision.json
# unless the code is "none" (a failure before the gate judged); make's own exit 2 on failure
read -r code rest < "$CODES"; echo "$rest" > "$CODES"
n=$(ls results 2>/dev/null | grep -c '^run') || true
mkdir -p "results/run$n/ab" && ln -sfn "run$n" results/latest
[ "$code" = 0 ] && exit 0
[ "$code" = none ] || cp "$FIXTURES/$code.json" "results/run$n/ab/decision.json"
exit 2
"""


NOTICE = "gate INCONCLUSIVE: the machine was too noisy to decide; not a failure"


def _ci_gate(tmp_path: Path, codes: str, **extra: str) -> tuple[subprocess.CompletedProcess,
                                                                  Path]:
    """.ci/gate in a scratch repo whose `make` fakes the gate's exit codes `codes`."""
    from tests.test_served import REPO

    root, fixtures, bin_ = tmp_path / "repo", tmp_path / "fixtures", tmp_path / "bin"
    for d in (root / ".ci", fixtures, bin_):
        d.mkdir(parents=True)
    shutil.copy(REPO / ".ci" / "gate", root / ".ci" / "gate")
    for code, verdict, at in ((1, "FAIL", "06:09"), (77, "INCONCLUSIVE", "06:01")):
        decision.write(a_decision(verdict=verdict, exit_code=code,
                                  created=f"2026-12-07T{at}:02Z"), tmp_path / "d")
        shutil.copy(tmp_path / "d" / "decision.json", fixtures / f"{code}.json")
    (bin_ / "make").write_text(FAKE_MAKE)
    (bin_ / "make").chmod(0o755)
    (tmp_path / "codes").write_text(codes + "\n")
    env = dict(os.environ, PATH=f"{bin_}:{os.environ['PATH']}", CODES=str(tmp_path / "codes"),
               FIXTURES=str(fixtures), PYTHONPATH=str(REPO),
               VENV=str(Path(sys.executable).parent.parent), **extra)
    done = subprocess.run(["bash", str(root / ".ci" / "gate")], env=env, capture_output=True,
                          text=True, timeout=120)
    return done, root


@pytest.mark.parametrize("codes, want, notice, keep", [
    ("0", 0, "", ""), ("1", 1, "", ""), ("none", 2, "", ""),
    ("77 0", 0, "running it once more", ""), ("77 1", 1, "running it once more", ""),
    ("77 none", 2, "running it once more", ""), ("77 77", 0, NOTICE, ""),
    ("77 77", 77, NOTICE, "77"),  # INCONCLUSIVE_EXIT=77: for a CI that marks it
])
def test_ci_runs_an_inconclusive_gate_once_more_and_a_second_is_a_notice(tmp_path, codes, want,
                                                                         notice, keep):
    done, root = _ci_gate(tmp_path, codes, INCONCLUSIVE_EXIT=keep or "0")
    assert done.returncode == want, done.stdout + done.stderr
    assert (notice in done.stdout) if notice else "INCONCLUSIVE" not in done.stdout
    runs = len(codes.split())
    assert len(list((root / "results").glob("run*"))) == runs  # at most one rerun


def test_ci_keeps_each_fresh_decision_in_the_history_it_is_given(tmp_path):
    """GATE_HISTORY: both decisions of an INCONCLUSIVE-then-FAIL gate are kept (the later is
    the commit's result); a failure before the gate judged keeps nothing."""
    history = tmp_path / "history"
    done, _ = _ci_gate(tmp_path, "77 1", GATE_HISTORY=str(history), GATE_MACHINE="box")
    assert done.returncode == 1, done.stdout + done.stderr
    assert len(list((history / "box").glob("*/*.json"))) == 2, done.stdout + done.stderr
    done, _ = _ci_gate(tmp_path / "again", "none", GATE_HISTORY=str(tmp_path / "h2"))
    assert done.returncode == 2 and not (tmp_path / "h2").exists()
