"""`bench history` on a history of 100 commits (eight checks each) renders its page and
figures within a generous bound of this process's CPU seconds (a busy neighbour stretches
the wall clock, not them); the measured seconds, wall and CPU, are printed."""

from __future__ import annotations

import random
import time

import pytest

from bench.commands.history import main
from bench.history import store
from tests.history_fakes import decision, write

pytestmark = pytest.mark.timeout(300)
BOUND_S = 30.0  # CPU seconds; the target is 10 s of wall clock on a quiet machine


def test_100_commits_render_within_the_bound(tmp_path, capsys):
    rng = random.Random(9)
    hist = tmp_path / "hist"
    for i in range(100):
        store.add(hist, write(tmp_path / "in", decision(i, lambda m, p: 1.0, rng)))
    t0, cpu0 = time.perf_counter(), time.process_time()
    assert main([str(hist), "--no-git", "--out", str(tmp_path / "page")]) == 0
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    with capsys.disabled():
        print(f"\nbench history: 100 commits x 8 checks rendered in {wall:.1f} s wall, "
              f"{cpu:.1f} s CPU")
    assert len(list((tmp_path / "page").glob("*.png"))) == 8
    assert cpu < BOUND_S
