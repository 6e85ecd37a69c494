"""Session-wide fixtures: what several tests read is built once per session.

`bench_run(name, *argv)` is a real `python -m bench run ARGV` (no plots), made the first time
a test asks for that name and those arguments and kept in a temporary folder until the
session ends. A test that edits a run copies it first (test_compare's `doctor`); one that
writes files into it (test_timeline's traces) takes a name no other test uses. Two runs of
the same arguments need two names (test_compare's A and B).
Under pytest-xdist each worker has its own session, so a run is built once per worker that
needs it (with `--dist loadfile`, once per file at worst).
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers import PRELOAD, START
from tests.tiers import OPT_IN, TIMED

REPO = Path(__file__).resolve().parent.parent
# Every `bench run` a test makes (in process or not) draws no plots unless the test's
# environment says otherwise: four PNGs cost 1-3.5 s of a 9 s run here, and the plots are
# tested where they are drawn (tests/test_report.py, which passes `plots=` itself).
os.environ.setdefault("BENCH_NO_PLOTS", "1")
# The tests' ranks fork from one server that imported torch and the project once
# (tests/helpers.py, START); it starts at the first launch, with the environment above.
if START == "forkserver":
    multiprocessing.get_context("forkserver").set_forkserver_preload(PRELOAD)


@pytest.hookimpl(tryfirst=True)  # before -m selects: the marker must be there
def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.stem in TIMED:
            item.add_marker(pytest.mark.timed)
    expr = config.getoption("markexpr") or ""
    left_out = [m for m in OPT_IN if m not in expr]
    keep, drop = [], []
    for item in items:
        (drop if any(item.get_closest_marker(m) for m in left_out) else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.fixture(scope="session")
def bench_run(tmp_path_factory) -> Callable[..., Path]:
    built: dict[tuple[str, ...], Path] = {}
    root = tmp_path_factory.mktemp("bench_runs")

    def run(name: str, *argv: str, timeout: float = 200) -> Path:
        key = (name, *argv)
        if key not in built:
            out = root / f"{len(built):02d}_{name}"
            done = subprocess.run([sys.executable, "-m", "bench", "run", *argv, "--out",
                                   str(out)], cwd=REPO, capture_output=True, text=True,
                                  timeout=timeout, env={**os.environ, "BENCH_NO_PLOTS": "1"})
            assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
            built[key] = out
        return built[key]

    return run


@pytest.hookimpl(trylast=True)  # after every other summary but pytest's own short one
def pytest_terminal_summary(terminalreporter):
    """One line per reason anything was skipped, with its count, at the very end: a skip is
    for a machine that cannot run a test (no CUDA, no package index), and says so."""
    reasons: dict[str, int] = {}
    for report in terminalreporter.stats.get("skipped", []):
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        reason = reason.removeprefix("Skipped: ")
        reasons[reason] = reasons.get(reason, 0) + 1
    if reasons:
        terminalreporter.write_sep("-", "skipped, by reason")
        for reason, n in sorted(reasons.items(), key=lambda kv: -kv[1]):
            terminalreporter.write_line(f"skipped {n}: {reason}")
