"""A node without scipy (a GPU node as shipped, no package index), for real: `bench run`,
`bench gate`, `bench ab` and a two-side `--cache sglang` run with scipy unimportable in
every process they start (ranks, block runs, their ranks), each ending OK with exact counts
and the intervals empty for the reason docs/metrics.md ("Without scipy") gives.

scipy is hidden by a sitecustomize.py on PYTHONPATH: every Python process started with this
environment (spawned ranks, `bench ab`'s block runs, which prepend their tree to PYTHONPATH
and keep the rest) installs a meta-path finder that refuses scipy, and notes its pid, so
the test can tell that the children ran under it too. It hides perfetto as well, the other
optional package (scripts/setup_env.sh): only `bench timeline` imports it, and
tests/test_timeline.py covers that verb without it; no run path needs it. matplotlib is no
optional dependency (setup_env.sh: a run needs it)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from bench.ab import size_args
from tests.scratch_git import commit, harmless, scratch_repo

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parent.parent
NO_SCIPY = "scipy is not installed"
SIZE = size_args({"requests": 4, "bystanders": 4})
SITECUSTOMIZE = '''\
import os
import sys


HIDDEN = ("scipy", "perfetto")


class _Hidden:
    """Refuses scipy and perfetto and their submodules, as on a node without them."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in HIDDEN:
            raise ImportError(f"No module named {name!r} (hidden by the test)")
        return None


sys.meta_path.insert(0, _Hidden())
with open(os.environ["NO_SCIPY_LOG"], "a") as f:
    f.write(f"{os.getpid()}\\n")
'''


@pytest.fixture(scope="module")
def hidden(tmp_path_factory) -> tuple[dict, Path]:
    """An environment whose every Python process cannot import scipy, and its pid log."""
    root = tmp_path_factory.mktemp("no_scipy")
    (root / "site").mkdir()
    (root / "site" / "sitecustomize.py").write_text(SITECUSTOMIZE)
    log = root / "pids.log"
    path = os.pathsep.join(filter(None, [str(root / "site"), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, "NO_SCIPY_LOG": str(log),
            "BENCH_NO_PLOTS": "1"}, log


def bench(env: dict, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bench", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=800)


def last_line(done: subprocess.CompletedProcess) -> str:
    lines = done.stdout.strip().splitlines()
    return lines[-1] if lines else ""


def pids(log: Path) -> set[str]:
    return set(log.read_text().split()) if log.exists() else set()


@pytest.mark.parametrize("module", ["scipy.special", "scipy.stats", "perfetto.trace_builder"])
def test_the_finder_hides_them(hidden, module):
    env, log = hidden
    done = subprocess.run([sys.executable, "-c", f"import {module}"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "hidden by the test" in done.stderr
    assert pids(log)


def test_run_and_gate_without_scipy(hidden, tmp_path):
    env, log = hidden
    before = pids(log)
    run = tmp_path / "run"
    # 3 repeats, so an interval is empty for want of scipy, not for too few repeats
    done = bench(env, REPO, "run", "--preset", "ci", "--protocols", "pr27010,pr36425",
                 "--policies", "wait_complete", *SIZE, "--repeats", "3", "--out", str(run))
    assert done.returncode == 0 and last_line(done).startswith("OK"), done.stdout[-3000:] + \
        done.stderr[-3000:]
    assert len(pids(log) - before) >= 3  # the command and its 2 ranks ran without scipy
    summary = pd.read_csv(run / "summary.csv")
    assert set(summary.interval_note) == {NO_SCIPY}
    assert (summary.decision_collectives_per_req
            == summary.expected_decision_collectives_per_req).all()
    baseline = tmp_path / "baseline"
    assert bench(env, REPO, "gate", str(run), "--baseline", str(baseline),
                 "--update-baseline").returncode == 0
    gated = bench(env, REPO, "gate", str(run), "--baseline", str(baseline))
    assert gated.returncode == 0 and "Traceback" not in gated.stdout + gated.stderr
    assert f"NOT JUDGED ({NO_SCIPY})" in gated.stdout
    # every metric NOT JUDGED on the last line; the reason on the line above it (120 columns)
    last = last_line(gated)
    assert last.startswith("OK: ") and "NOT JUDGED" in last and "step_mean" in last, last
    assert NO_SCIPY in "\n".join(gated.stdout.strip().splitlines()[-2:])


@pytest.mark.long  # make test-long: a served A/B end to end without scipy
def test_ab_without_scipy(hidden, tmp_path):
    env, log = hidden
    repo, base = scratch_repo(tmp_path / "repo")
    other = commit(repo, "docs: a harmless edit", harmless)
    before = pids(log)
    done = bench(env, repo, "ab", base, other, "--preset", "ci", "--protocols", "pr36425",
                 "--policies", "wait_complete", *SIZE, "--repeats", "3", "--out",
                 str(tmp_path / "ab"))
    out = done.stdout + done.stderr
    assert done.returncode == 0 and "Traceback" not in out, out[-4000:]
    assert last_line(done).startswith("ab: "), out[-2000:]
    # the command, and per side of the one served run its bench run and its 2 ranks
    assert len(pids(log) - before) >= 1 + 2 * 3
    table = pd.read_csv(tmp_path / "ab" / "ab.csv")
    timings = table[table.kind == "timing"]
    assert len(timings) and set(timings.note) == {NO_SCIPY}
    assert timings.ratio_ci_low.isna().all() and timings.wilcoxon_p.isna().all()
    assert timings.sign_p.notna().any()  # exact without scipy
    md = (tmp_path / "ab" / "ab.md").read_text()
    assert f"No Wilcoxon p: {NO_SCIPY}" in md


@pytest.mark.long  # make test-long: SGLang sides end to end without scipy
def test_sglang_sides_without_scipy(hidden, tmp_path):
    """Two SGLang sides (an A/A of 0.5.23) end OK with exact counts, and the sides'
    headline says its intervals are empty for want of scipy, not for too few repeats."""
    from sglang_adapter.source import DEFAULT_CACHE

    if not sorted(DEFAULT_CACHE.glob("sglang-0.5.23-*.whl")):
        pytest.skip("no sglang 0.5.23 wheel cached (make sglang-fetch)")
    env, log = hidden
    before = pids(log)
    run = tmp_path / "run"
    done = bench(env, REPO, "run", "--cache", "sglang", "--sglang", "a=0.5.23,b=0.5.23",
                 "--preset", "ci", "--requests", "3", "--bystanders", "1",
                 "--output-tokens", "4", "--policies", "timeout", "--repeats", "3",
                 "--out", str(run))
    out = done.stdout + done.stderr
    assert done.returncode == 0 and last_line(done).startswith("OK"), out[-4000:]
    assert "Traceback" not in out
    assert len(pids(log) - before) >= 1 + 2 * 2  # the command and each side's 2 ranks
    assert f"No intervals: {NO_SCIPY}." in done.stdout
    summary = pd.read_csv(run / "summary.csv")
    assert set(summary.interval_note.dropna()) == {NO_SCIPY}
    assert (summary.decision_collectives_per_req
            == summary.expected_decision_collectives_per_req).all()
