"""Faults the system must survive or report: failing and stalling storage, a rank that dies
(killed by fault injection or from outside) and a rank that hangs.

Survive: every request is still served, the loaded data verifies and all ranks agree.
Report: the launch fails within the collective timeout and names the rank, or the call
site, step and ranks of the collective that could not complete; nobody hangs.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import threading
import time

import pytest
import torch

from hicache.agreement.consensus import compare_decisions
from hicache.cache.cache import HiCache
from hicache.comm.comm import CollectiveCounter, CollectiveError, Comm
from hicache.comm.groups import Groups, Layout
from hicache.comm.records import Stats
from hicache.memory.storage import StorageSpec, make_storage
from hicache.spec.config import HiCacheConfig
from tests.fault_helpers import launch_timed, stamped_scenario, wait_for_stamps
from tests.helpers import case, launch_to_end, run_cases, scenario

T = 5.0  # collective timeout in these tests (the product default is 60 s)
SLACK_S = 10.0  # process start-up, populate and the steps before the fault, on a busy CI box
SITE_RE = re.compile(r"call site '\w+' on group '\w+' \(ranks \[[\d, ]+\]\) failed on rank \d "
                     r"at step \d+")


def _served_and_agreed(per_rank: list[dict]) -> None:
    for res in per_rank:
        for row in res["rows"]:
            assert row["first_token"] is not None, f"{row['rid']} never got its first token"
            assert row["data_errors"] == 0, f"{row['rid']}: {row['data_errors']} bad pages"
    agree, first = compare_decisions([res["decisions"] for res in per_rank])
    assert agree and all(agree.values()), first


# ---- no process group ---------------------------------------------------------------------


def test_collective_error_names_site_group_ranks_step_and_request():
    counter = CollectiveCounter()
    groups = Groups(Layout(0, 1, 1), "gloo", 1.0)
    groups.ranks["tp_cpu"] = [0, 1]
    comm = Comm(Layout(0, 2, 1), groups, counter)
    counter.step = 12

    def boom():
        raise RuntimeError("Timed out waiting 5000ms for recv\nsecond line")

    with pytest.raises(CollectiveError) as e:
        comm._run(boom, "decision", "tp_cpu", 1, "r007")
    assert str(e.value) == ("collective at call site 'decision' on group 'tp_cpu' (ranks [0, 1]) "
                            "failed on rank 0 at step 12 for request r007: "
                            "Timed out waiting 5000ms for recv")


def test_agreed_queue_wait_is_bounded_by_the_collective_timeout():
    cfg = HiCacheConfig(collective_timeout_s=0.2)
    layout = Layout(0, 1, 1)
    stats = Stats()
    comm = Comm(layout, Groups(layout, "gloo", 1.0), stats.counter)
    cache = HiCache(cfg, layout, comm, make_storage(StorageSpec(), 0, 0), torch.device("cpu"),
                    stats)
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="agreed queue count not reached within 0.2s"):
        cache._get(queue.Queue())
    assert time.monotonic() - t0 < 2.0


# ---- storage faults: survived -------------------------------------------------------------

# Failing reads: 16-token pages, so a 128-page read batch is 2048 tokens and a 4096-token
# prefix takes two batches; a failed second batch leaves a prefetch half done.
FAIL_CASES = [("pr36425", "timeout"), ("step-clock", "wait_complete"),
              ("pre27010", "wait_complete")]
# Stalling tier: every read takes 300 ms more, the timeout policy gives up after 100 ms.
STALL_CASES = ["pr36425", "step-clock", "pre27010"]


@pytest.fixture(scope="module")
def storage_faults() -> dict:
    """Every storage-fault configuration in one launch (start-up is the expensive part)."""
    fail = [case({"protocol": p, "policy": q, "tp": 2, "page_size": 16,
                  "collective_timeout_s": T}, {"fail_rate": 0.3, "latency_ms": 5.0}, n=10,
                 prefix_tokens=4096, new_tokens=64, gap_s=0.02) for p, q in FAIL_CASES]
    stall = [case({"protocol": p, "policy": "timeout", "tp": 2, "timeout_base_s": 0.1,
                   "timeout_per_ki_token_s": 0.0, "collective_timeout_s": T},
                  {"stall_ms": 300.0}, n=6, gap_s=0.02) for p in STALL_CASES]
    t0 = time.monotonic()
    results = run_cases(2, fail + stall, timeout_s=75)
    keys = [("fail", p, q) for p, q in FAIL_CASES] + [("stall", p) for p in STALL_CASES]
    return {**dict(zip(keys, results, strict=True)), "wall_s": time.monotonic() - t0}


@pytest.mark.dist
@pytest.mark.timeout(90)
@pytest.mark.parametrize(("protocol", "policy"), FAIL_CASES)
def test_failing_reads_end_short_but_every_request_is_served_and_verified(
        storage_faults, protocol, policy):
    per_rank = storage_faults[("fail", protocol, policy)]
    _served_and_agreed(per_rank)
    rows = [row for res in per_rank for row in res["rows"]]
    failed = {r["rid"] for r in rows if r["io_error"]}
    assert failed, "no read failed"
    # The usable length is the MIN over ranks (the acks, or pre27010's completion MIN), so
    # a failure on either rank cuts the prefix short on both.
    short = {r["rid"] for r in per_rank[0]["rows"]
             if r["io_issued"] and r["prefetched_tokens"] < r["hit_tokens"]}
    assert failed <= short, f"reads failed for {failed}, prefixes short only for {short}"
    assert any(r["prefetched_tokens"] > 0 for r in per_rank[0]["rows"]), "nothing landed"


@pytest.mark.dist
@pytest.mark.timeout(90)
@pytest.mark.parametrize("protocol", STALL_CASES)
def test_stalling_storage_is_cut_short_by_the_timeout_policy(storage_faults, protocol):
    per_rank = storage_faults[("stall", protocol)]
    _served_and_agreed(per_rank)
    cut = [r for r in per_rank[0]["rows"]
           if r["terminated_by"] in ("poll", "revoked") and r["prefetched_tokens"] == 0]
    assert len(cut) >= 4, f"only {len(cut)} of 6 prefetches were cut by the timeout"
    # Reads of ops cut before their IO started are skipped: nobody waits 300 ms per op.
    assert storage_faults["wall_s"] < 60


@pytest.mark.dist
@pytest.mark.timeout(90)
@pytest.mark.parametrize("key", [("fail", p, q) for p, q in FAIL_CASES]
                         + [("stall", p) for p in STALL_CASES], ids=str)
def test_every_host_slot_is_in_the_tree_or_free_after_the_run(storage_faults, key):
    """A timeout cuts prefetches whose reads outlive the last scheduler step (the stalling
    tier): their tail slots are freed once the IO stops, at the latest at shutdown, and
    the run's own self-check says so."""
    for rank, res in enumerate(storage_faults[key]):
        leaked = res["host_pages"] - res["host_free"] - res["host_in_tree"]
        assert leaked == 0, f"rank {rank}: {leaked} host slot(s) neither in the tree nor free"
        assert res["host_slots_unaccounted"] == 0, f"rank {rank}: self-check missing or wrong"


# ---- a rank dies or hangs: reported, fast -------------------------------------------------

def _args(cfg_kw: dict, n: int, gap_s: float) -> tuple:
    return ({"tp": 2, "collective_timeout_s": T, **cfg_kw}, {}, n, 512, 64, gap_s)


@pytest.mark.dist
@pytest.mark.timeout(60)
def test_rank_killed_at_a_step_is_named(tmp_path):
    out = launch_timed(2, stamped_scenario, _args({"kill_rank": 1, "kill_step": 5}, 20, 0.05),
                       str(tmp_path), timeout_s=45)
    assert out.error is not None and "rank 1 died (exit code 17)" in out.error, out.error
    print(f"kill_rank=1 kill_step=5: LaunchError after {out.run_s:.2f}s from the ranks' start "
          f"({out.wall_s:.2f}s wall)")
    assert out.run_s < T + SLACK_S


def _signal_rank_later(stamp_dir: str, rank: int, sig: int, after_s: float, box: dict) -> None:
    pid = wait_for_stamps(stamp_dir, 2, timeout_s=30)[rank][0]
    time.sleep(after_s)
    box["t"] = time.monotonic()
    os.kill(pid, sig)


def _launch_and_signal(tmp_path, sig: int):
    box: dict = {}
    th = threading.Thread(target=_signal_rank_later, args=(str(tmp_path), 1, sig, 1.0, box))
    th.start()
    # 40 requests 0.1 s apart: still running when the signal lands.
    out = launch_timed(2, stamped_scenario, _args({}, 40, 0.1), str(tmp_path), timeout_s=45)
    th.join()
    return out, time.monotonic() - box["t"]


@pytest.mark.dist
@pytest.mark.timeout(60)
def test_external_sigkill_is_named(tmp_path):
    out, since_kill = _launch_and_signal(tmp_path, signal.SIGKILL)
    assert out.error is not None and "rank 1 died (exit code -9)" in out.error, out.error
    print(f"SIGKILL rank 1: LaunchError {since_kill:.2f}s after the kill")
    assert since_kill < T


@pytest.mark.dist
@pytest.mark.timeout(60)
def test_hung_rank_makes_its_peer_fail_at_the_collective_timeout(tmp_path):
    # SIGSTOP: rank 1 is alive but never joins another collective. Rank 0 must not wait
    # forever: gloo's group timeout fails its collective, naming site, step and ranks.
    out, since_stop = _launch_and_signal(tmp_path, signal.SIGSTOP)
    assert out.error is not None and "rank 0 failed: " in out.error, out.error
    assert SITE_RE.search(out.error), out.error
    print(f"SIGSTOP rank 1: LaunchError {since_stop:.2f}s after the stop: {out.error[:160]}")
    assert T - 1.0 < since_stop < T + 5.0


@pytest.mark.dist
@pytest.mark.slow
@pytest.mark.timeout(60)
def test_survivors_of_a_dead_rank_end_on_their_own():
    # No launcher kills the survivor here: it must see the death itself and stop.
    got, dead = launch_to_end(2, scenario, _args({"kill_rank": 1, "kill_step": 5}, 20, 0.05),
                              timeout_s=45)
    assert dead.get(1, (None,))[0] == 17, (got, dead)
    assert 0 in got, "rank 0 neither finished nor failed before the deadline"
    t_report, status, msg = got[0]
    assert status == "error" and SITE_RE.search(msg), msg
    print(f"rank 0 failed {t_report - dead[1][1]:.2f}s after rank 1 died: {msg[:160]}")
    assert t_report - dead[1][1] < T
