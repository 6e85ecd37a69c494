"""scripts/gate_history.py's pieces with fakes (no serving): the commits it gates, the lock
it holds around each gate, the seam it patches in bench.gate.ab, and a sitting that keeps
each fake gate's decision.json in a history and goes on where it stopped."""

from __future__ import annotations

import fcntl
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from tests.history_fakes import decision, write

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "scripts"))
import gate_history  # noqa: E402

pytestmark = pytest.mark.timeout(120)


def _repo(tmp: Path, n: int) -> tuple[Path, list[str]]:
    repo = tmp / "repo"
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    shas = []
    for i in range(n):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q",
                        "--allow-empty", "-m", f"c{i}"], cwd=repo, check=True)
        shas.append(subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, text=True,
                                   capture_output=True, check=True).stdout.strip())
    return repo, shas


def test_it_gates_the_newest_first_parent_commits_oldest_first(tmp_path):
    repo, shas = _repo(tmp_path, 5)
    assert gate_history.first_parents(repo, "main", 3) == shas[2:]


def test_each_gate_holds_the_cpu_lock_exclusively(tmp_path):
    lock = tmp_path / "cpu.lock"
    with gate_history.holding(lock), open(lock) as other:
        with pytest.raises(BlockingIOError):
            fcntl.flock(other, fcntl.LOCK_SH | fcntl.LOCK_NB)
    with open(lock) as other:  # released after the gate
        fcntl.flock(other, fcntl.LOCK_SH | fcntl.LOCK_NB)


def test_the_seam_it_patches_is_where_it_expects():
    import inspect

    import bench.gate.ab as gate_ab

    assert inspect.getsource(gate_ab).count(gate_history.SEAM) >= 1


def test_a_sitting_keeps_each_decision_and_resumes_where_it_stopped(tmp_path, monkeypatch):
    _, shas = _repo(tmp_path, 4)
    out = tmp_path / "sitting"
    state = {"branch": "main", "commits": shas, "baseline": str(tmp_path), "machine": "box",
             "gates": {}}
    rng = random.Random(0)
    gated = []

    def fake_run(clone, commit, where):
        return where / "runs" / commit[:12]

    def fake_gate(commit, run, baseline):
        gated.append(commit)
        if len(gated) == 3:
            raise KeyboardInterrupt  # the sitting stops mid-way
        d = decision(len(gated), lambda m, p: 1.0, rng, n_metrics=1)
        write(run / "ab", d, "decision.json")
        return d["exit_code"]

    with pytest.raises(KeyboardInterrupt):
        gate_history.run_all(out, state, tmp_path / "lock", fake_gate, fake_run)
    saved = json.loads((out / "gate_history.json").read_text())
    assert list(saved["gates"]) == shas[:2] and gate_history.todo(saved) == shas[2:]
    gate_history.run_all(out, saved, tmp_path / "lock", fake_gate, fake_run)
    assert gated == shas[:3] + shas[2:]  # the interrupted commit gated again, no other
    kept = sorted(p.parent.name for p in (out / "history" / "box").glob("*/*.json"))
    assert kept == sorted(shas)  # keyed by the gated commit, not the result's own
    final = json.loads((out / "gate_history.json").read_text())
    assert all("kept" in g["kept"] for g in final["gates"].values())
    assert gate_history.todo(final) == []


def test_an_inconclusive_commit_is_gated_again_and_its_first_gate_kept(tmp_path):
    """--again-inconclusive: the INCONCLUSIVE commit alone is gated again; its first record
    stays under `earlier`, its first A/B folder as ab.1, its first result in the history."""
    _, shas = _repo(tmp_path, 2)
    out = tmp_path / "sitting"
    state = {"branch": "main", "commits": shas, "baseline": str(tmp_path), "machine": "box",
             "gates": {}}
    rng, gated = random.Random(1), []

    def fake_gate(commit, run, baseline):
        gated.append(commit)
        d = decision(len(gated), lambda m, p: 1.0, rng, n_metrics=1)
        first = len(gated) == 1  # the first commit's first gate: undecided on a busy machine
        d.update(verdict="INCONCLUSIVE" if first else "PASS", exit_code=77 if first else 0)
        for m in d["metrics"]:
            m["verdict"] = d["verdict"]
        write(run / "ab", d, "decision.json")
        return d["exit_code"]

    def fake_run(clone, commit, where):
        return where / "runs" / commit[:12]

    gate_history.run_all(out, state, tmp_path / "lock", fake_gate, fake_run)
    saved = json.loads((out / "gate_history.json").read_text())
    assert gate_history.again_inconclusive(saved) == shas[:1]
    assert gate_history.todo(saved) == shas[:1]
    gate_history.run_all(out, saved, tmp_path / "lock", fake_gate, fake_run)
    assert gated == [shas[0], shas[1], shas[0]]
    final = json.loads((out / "gate_history.json").read_text())
    assert final["gates"][shas[0]]["exit"] == 0 and final["earlier"][shas[0]][0]["exit"] == 77
    first = out / "runs" / shas[0][:12]
    assert (first / "ab.1" / "decision.json").exists() and (first / "ab" / "decision.json").exists()
    assert len(list((out / "history" / "box" / shas[0]).glob("*.json"))) == 2
