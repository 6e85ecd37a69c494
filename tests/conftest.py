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

REPO = Path(__file__).resolve().parent.parent
# Every `bench run` a test makes (in process or not) draws no plots unless the test's
# environment says otherwise: four PNGs cost 1-3.5 s of a 9 s run here, and the plots are
# tested where they are drawn (tests/test_report.py, which passes `plots=` itself).
os.environ.setdefault("BENCH_NO_PLOTS", "1")
# The tests' ranks fork from one server that imported torch and the project once
# (tests/helpers.py, START); it starts at the first launch, with the environment above.
if START == "forkserver":
    multiprocessing.get_context("forkserver").set_forkserver_preload(PRELOAD)


# Out of `make test` unless asked for by name: pyproject's addopts leaves them out with -m,
# but pytest keeps only the last -m, so `pytest -m "not slow"` (make test-fast) would bring
# them back. A -m expression that names one of them (make sglang-check, make test-stats,
# bench microbench) selects it as written.
OPT_IN = ("microbench", "sglang_matrix", "statistical")

# The files whose tests time what they check (marker `timed`): `make test` runs them alone,
# after the others have run on two workers, so no other test's ranks share the cores with them.
TIMED = {
    "test_gate_real": "real A/Bs judge step time and TTFT",
    "test_fidelity": "a pinned headline against a free run of its seed, on the wall clock",
    "test_step_pairing": "a planted spin must show in its side's host time",
    "test_duet": "both lanes must serve at the same time",
    "test_machine": "a run beside planted CPU burners must see them, and only them",
    "test_neighbour": "the planted neighbour's CPU share is measured",
    "test_race": "the side-car race must fire within its window",
    "test_faults": "a fault is named within a bound on the wall clock",
    "test_divergence": "a mispaired collective fails at its timeout, named in time",
    "test_hazards": "a deadlock is named within two collective timeouts",
    "test_sglang_hazards": "a deadlock is named within SGLang's collective timeout",
}


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
