"""The extra-pool race of PR #27550 (docs/design.md section 5), caught by the page checksums.

Side-car pages are read after the KV pages and take 16 ms each (128 ms for a request's
8 pages), while the scheduler polls every few ms. pre27010 without the guard sees
`completed` as soon as the KV pages are in and terminates during that window; load-back
then copies side-car slots the IO thread has not written yet. The window is far wider
than a step, so every request hits it; the test needs only one of 8. (At 8 ms a page and
4 requests it once did not fire on a machine loaded 8-30 deep, where steps grew past the
window.)
"""

from __future__ import annotations

import pytest

from tests.helpers import case, run_cases

pytestmark = pytest.mark.dist

STORAGE = {"latency_ms": 5.0, "sidecar_page_ms": 16.0}
SAFE = [("pre27010", "wait_complete", True), ("pre27010", "timeout", True),
        ("pr27010", "wait_complete", True), ("pr36425", "wait_complete", True),
        ("step-batched", "wait_complete", True), ("step-clock", "wait_complete", True)]
RACY = ("pre27010", "wait_complete", False)


@pytest.fixture(scope="module")
def results():
    variants = [RACY, *SAFE]
    cases = [case({"protocol": p, "policy": q, "race_guard": g, "tp": 2, "extra_pool": True},
                  STORAGE, n=8, gap_s=0.01) for p, q, g in variants]
    return dict(zip(variants, run_cases(2, cases, timeout_s=100), strict=True))


@pytest.mark.timeout(120)
def test_unguarded_pre27010_loads_half_written_sidecar_pages(results):
    for rank, res in enumerate(results[RACY]):
        rows = res["rows"]
        assert sum(r["data_errors"] for r in rows) > 0, f"rank {rank}: the race never fired"
        # The KV pages were complete: what went wrong is the side-car data that was used.
        bad = [r for r in rows if r["data_errors"]]
        assert all(r["loaded_tokens"] == r["prefetched_tokens"] > 0 for r in bad)
        assert all(r["data_errors"] <= r["loaded_tokens"] // 64 for r in bad)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("variant", SAFE,
                         ids=[f"{p}-{q}{'' if g else '-noguard'}" for p, q, g in SAFE])
def test_guard_and_ack_protocols_never_load_wrong_data(results, variant):
    for rank, res in enumerate(results[variant]):
        rows = res["rows"]
        assert all(r["data_errors"] == 0 for r in rows), f"rank {rank}"
        # ...and they did load the prefix: zero errors is not zero pages.
        assert sum(r["loaded_tokens"] for r in rows) > 0
