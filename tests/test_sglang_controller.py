"""SGLang's own controller path on real gloo ranks (sglang_adapter.controller.rig,
docs/sglang.md "SGLang's own controller path"): `prefetch_from_storage`, the controller's
hit-query, IO and ack-sync threads with their collectives on the groups SGLang makes, the
drains in `check_hicache_events`, the poll, the end of a prefetch, over the harness's
storage tier through a subclass of the wheel's own `HiCacheStorage`; counted at the door
per request, held against torch's sequence numbers and against the project's model of the
release. The wheel comes from the release cache (a test whose wheel is absent is skipped,
never passed)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from bench.run.launch import launch
from bench.sglang_poll import controller as check
from sglang_adapter.controller.rank import controller_rank
from sglang_adapter.source import resolve, unpack
from tests.sglang_wheels import sglang_wheel

# make sglang-check: in make test SGLang 0.5.23's controller path runs inside `bench run
# --cache sglang --sglang-path controller` (tests/test_sglang_run.py), one TP2 launch for both.
pytestmark = [pytest.mark.dist, pytest.mark.sglang_matrix]

HIT = ("managers/cache_controller.py:_all_reduce:447",
       "_sync_prefetch_hit_query:1502 < prefetch_thread_func:1356")
ACK = ("managers/cache_controller.py:_all_reduce:447",
       "_reduce_prefetch_ack:1482 < _reduce_prefetch_ack:1922 < prefetch_sync_thread_func:1947")
STEP = "_all_reduce:386 < _sync_hicache_ready_counts:3459 < check_hicache_events:3681"
DECISION = "_all_reduce:386 < _can_terminate_prefetch:2311 < check_prefetch_progress:2405"
# The check's six requests: a 130-page hit is read in two 128-page batches; "to-cut"'s
# reads stall past its budget.
CASES = check.CASES


def _wheel(version: str):
    # SGLang names storage pages with its own C++ extension, compiled from the wheel on
    # first use (sglang_adapter.loader.native_hash): it needs a C++ compiler and OpenSSL's
    # headers, as the wheel needs a GPU box's toolchain.
    if shutil.which(os.environ.get("CXX", "c++")) is None or \
            not Path("/usr/include/openssl/sha.h").exists():
        pytest.skip("no C++ compiler or OpenSSL headers to build SGLang's page-hash extension")
    return resolve(str(sglang_wheel(version)))


def _by_request(calls) -> dict[str, Counter]:
    out: dict[str, Counter] = {}
    for site, group, op, rid, via, n in calls:
        out.setdefault(rid, Counter())[(group, op, site, via)] += n
    return out


@pytest.fixture(scope="module")
def served():
    return launch(2, controller_rank, (_wheel("0.5.23"), 2, CASES), timeout_s=280)


def test_every_rank_ends_every_prefetch_at_the_same_poll_the_same_way(served):
    assert served[0]["outcomes"] == served[1]["outcomes"]
    out = served[0]["outcomes"]
    assert all(o["issued"] for o in out.values())
    assert (out["wc-miss"]["io_issued"], out["wc-part"]["hit_pages"],
            out["wc-long"]["hit_pages"]) == (False, 3, 130)
    # wait_complete ends in the ack drain; the stalled read's deadline (6 polls, some 50 ms
    # of real time, against a 0.5 s stall) ends it at a poll, its read in flight when its
    # hit was drained by then (the usual case; else revoked before its IO).
    assert out["wc-part"]["ended_by"] == out["wc-long"]["ended_by"] == "drain"
    assert out["to-cut"] == {**out["to-cut"], "ended_by": "poll", "deadline": True}


def test_every_request_costs_what_the_model_of_the_release_says(served):
    """Decision, completion, PP hop, hit-query and ack collectives per request, SGLang's
    own against `hicache.spec.cost_model.expected_per_request` for sglang-0.5.23."""
    for r in served:
        assert r["protocol"] == "sglang-0.5.23"
        assert r["sglang"] == r["model"], {k: (r["sglang"][k], r["model"][k])
                                           for k in r["model"]}


def test_the_hit_query_and_acks_are_sglangs_on_its_own_groups(served):
    for r in served:
        calls = _by_request(r["calls"])
        for case in CASES:
            assert calls[case.rid][("sglang_hit", "all_reduce", *HIT)] == 1, case.rid
        acks = {c.rid: calls[c.rid][("sglang_ack", "all_reduce", *ACK)] for c in CASES}
        # one MIN per 128-page batch read (the final ack is passed on unreduced), also for
        # a read a poll cut short; none for a miss revoked in the hit drain.
        cut = int(r["outcomes"]["to-cut"]["io_issued"])
        assert (acks["wc-part"], acks["wc-long"], acks["wc-miss"], acks["to-cut"]) == \
            (1, 2, 0, cut), acks


def test_decisions_and_the_step_are_sglangs_on_the_tp_group(served):
    site = "mem_cache/unified_radix_cache.py:_all_reduce_attn_groups:359"
    for r in served:
        calls = _by_request(r["calls"])
        for case in CASES:
            out = r["outcomes"][case.rid]
            decisions = calls[case.rid][("tp", "all_reduce", site, DECISION)]
            assert decisions == (out["ongoing_polls"] if case.policy == "timeout" else 0)
            assert calls[f"{case.rid}/step"][("tp", "all_reduce", site, STEP)] == out["polls"]


def test_what_sglang_loaded_is_what_storage_holds(served):
    """Every page SGLang's IO thread wrote into a host slot and its ack drain inserted is
    the stored page (digest against the tier's content), on every rank."""
    for r in served:
        pages, good = r["loaded"]
        assert pages >= 3 + 130 and good == pages


def test_the_door_missed_nothing_on_any_group(served):
    """Counted at the door = torch's sequence numbers, on the TP group and on each group
    SGLang made for itself (its hit and completion groups)."""
    for r in served:
        assert set(r["crosscheck"]) == {"tp", "sglang_hit", "sglang_ack"}
        assert all(counted == seen > 0 for counted, seen in r["crosscheck"].values()), \
            r["crosscheck"]


def test_sglangs_page_names_are_the_tiers_for_an_unnamespaced_prompt(served):
    """SGLang's chain (0.5.23's compiled hash_binding.cpp, built from the wheel) and the
    project's (hicache/memory/hashing.py) name every page of these prompts alike."""
    for r in served:
        names = r["names"]
        assert len(names) == sum(c.pages for c in CASES)
        assert all(k == v for k, v in names.items())


@pytest.mark.sglang_matrix
def test_sglang_0519s_controller_path_costs_what_pr36425_says():
    """0.5.19 (its hit-query MIN inline in prefetch_thread_func, keyed by rid; no deadline
    flag): the same serve, every request held against the project's model of 0.5.19."""
    served = launch(2, controller_rank, (_wheel("0.5.19"), 2, CASES), timeout_s=280)
    assert served[0]["outcomes"] == served[1]["outcomes"]
    for r in served:
        assert r["protocol"] == "pr36425"
        assert r["sglang"] == r["model"], r["sglang"]
        assert r["loaded"][0] == r["loaded"][1] >= 3 + 130
        assert all(counted == seen > 0 for counted, seen in r["crosscheck"].values())
    assert served[0]["outcomes"]["to-cut"]["ended_by"] == "poll"


PLANT_BEFORE = "        reduced = packed.tolist()\n"
PLANTED = ("        self._all_reduce(packed, torch.distributed.ReduceOp.MIN, "
           "self.prefetch_hits_sync_groups)  # planted\n")


def _planted_tree(wheel: Path, dest: Path) -> int:
    """0.5.23's Python files (and its page-hash sources) unpacked to `dest` as `resolve`
    unpacks a wheel, with a second MIN of the packed hit planted in
    HybridCacheController._sync_prefetch_hit_query (the same values: it changes no result,
    only the count); returns the planted line."""
    unpack(wheel, dest)
    path = dest / "sglang/srt/mem_cache/hybrid_cache/hybrid_cache_controller.py"
    text = path.read_text()
    at = text.index(PLANT_BEFORE, text.index("def _sync_prefetch_hit_query"))
    path.write_text(text[:at] + PLANTED + text[at:])
    return text[:at].count("\n") + 1


@pytest.mark.sglang_matrix
def test_a_planted_hit_query_min_shows_once_per_request_at_its_line(tmp_path):
    """SGLang's hit query is measured where SGLang issues it: a MIN planted in a copied
    tree's `_sync_prefetch_hit_query` is one more hit-query collective per request, on
    SGLang's own hit group, named at the planted line, and the model is off by exactly it."""
    line = _planted_tree(Path(_wheel("0.5.23").wheel), tmp_path / "tree")
    served = launch(2, controller_rank, (resolve(str(tmp_path / "tree")), 2, CASES),
                    timeout_s=280)
    planted = ("managers/cache_controller.py:_all_reduce:447",
               f"_sync_prefetch_hit_query:{line} < prefetch_thread_func:1356")
    for r in served:
        calls = _by_request(r["calls"])
        for case in CASES:
            assert calls[case.rid][("sglang_hit", "all_reduce", *planted)] == 1, case.rid
            sglang, model = r["sglang"][case.rid], r["model"][case.rid]
            assert (sglang.hit_query, sglang.ack, sglang.decision) == \
                (model.hit_query + 1, model.ack, model.decision)
        assert all(counted == seen > 0 for counted, seen in r["crosscheck"].values())


def test_the_verb_says_ok_for_this_serve_and_refuses_bad_input_in_one_line(served):
    table, ok = check.rows(served)
    assert ok and [row[0] for row in table] == [c.rid for c in CASES]
    assert all(row[-1] is True for row in table)
    for argv, says in ((["--sglang", "nope", "--controller"], "no such release"),
                       (["--sglang", "0.5.23", "--controller", "--tp", "4"], "TP2 x PP1")):
        done = subprocess.run([sys.executable, "-m", "bench", "sglang-poll", *argv],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and done.stdout == "", done
        assert len(done.stderr.strip().splitlines()) == 1 and says in done.stderr
