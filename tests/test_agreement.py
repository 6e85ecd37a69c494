"""Every rank makes the same prefetch decisions, for the protocols that promise it.

`decisions` maps each request to (how its prefetch ended, usable tokens, agreed hit) on one
rank; agreement means the dicts are equal on all ranks. The scenarios make the decision
contested: per-rank storage jitter, and a timeout close to the read time, so that each
rank's own clock and IO progress would decide differently if nothing made them agree.

pre27010 agrees within a TP group (one MAX, then a MIN of the usable length) but has no PP
communication: with PP=2 and a slow second stage it can be shown to disagree (SGLang issue
#22607), while pr27010 in the same scenario agrees.
"""

from __future__ import annotations

import functools

import pytest

from hicache.memory.storage import SimStorage, StorageSpec
from hicache.spec.cost_model import POLICIES, PROTOCOLS
from tests.helpers import case, run_cases

pytestmark = pytest.mark.dist

# Reads of 20 ms times a per-rank factor in [1, 2] and lognormal noise (sigma 0.5). Eight
# requests arrive 5 ms apart and queue behind each other on each rank's IO thread: the first
# finish well inside the 100 ms timeout, the last time out for sure, and those in between
# finish on one rank's clock and not on the other's unless the protocol makes them agree.
JITTER = {"latency_ms": 20.0, "jitter": 1.0}
CONTESTED = {"timeout_base_s": 0.1, "timeout_per_ki_token_s": 0.0}


def _ids(variants):
    return [f"{p}-{q}" for p, q in variants]


def _assert_agree(per_rank: list[dict], what: str) -> None:
    d0 = per_rank[0]["decisions"]
    assert d0, f"{what}: no decisions recorded"
    for rank, res in enumerate(per_rank[1:], start=1):
        assert res["decisions"] == d0, f"{what}: rank {rank} differs from rank 0"


# ---- TP2: every protocol promises agreement ------------------------------------------------

TP2_VARIANTS = [(p, q) for p in PROTOCOLS for q in POLICIES]


@pytest.fixture(scope="module")
def tp2():
    cases = [case({"protocol": p, "policy": q, "tp": 2, **CONTESTED}, {**JITTER, "seed": 3},
                  n=8, gap_s=0.005) for p, q in TP2_VARIANTS]
    return dict(zip(TP2_VARIANTS, run_cases(2, cases, timeout_s=100), strict=True))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("variant", TP2_VARIANTS, ids=_ids(TP2_VARIANTS))
def test_tp2_ranks_agree(tp2, variant):
    _assert_agree(tp2[variant], f"{variant} at TP2")


@pytest.mark.timeout(120)
def test_tp2_timeout_scenario_is_contested(tp2):
    """Not a vacuous agreement: the clock cut some prefetches short and let others finish."""
    usable = [u for proto in PROTOCOLS
              for _, u, _ in tp2[(proto, "timeout")][0]["decisions"].values()]
    assert min(usable) < 512 and max(usable) == 512, usable


# ---- TP2 x PP2: a slow second stage --------------------------------------------------------

@functools.cache
def slow_stage_seed(jitter: float = 1.0) -> int:
    """The first storage seed whose per-rank slowdown puts both stage-0 ranks (0, 1) near
    the fast end and both stage-1 ranks (2, 3) near the slow end of the jitter range."""
    for seed in range(10_000):
        f = [SimStorage(StorageSpec(jitter=jitter, seed=seed), r, r % 2).rank_factor
             for r in range(4)]
        if max(f[:2]) < 1 + 0.2 * jitter and min(f[2:]) > 1 + 0.8 * jitter:
            return seed
    raise AssertionError("no seed found")


# Stage 1 reads about 1.8x slower than stage 0. Requests arrive every 32 ms: stage 0's IO
# thread (about 25 ms per read) keeps up, stage 1's (about 43 ms) falls further behind with
# every request, so its later prefetches time out (100 ms, counted from enqueue) while
# stage 0's complete. A decision that crosses PP keeps them together, whatever the clocks.
PP_TIMEOUT = {"timeout_base_s": 0.1, "timeout_per_ki_token_s": 0.0}
PP_VARIANTS = [(p, "timeout") for p in PROTOCOLS if p != "pre27010"]
PP_VARIANTS += [(p, q) for p in PROTOCOLS if p != "pre27010" for q in ("best_effort",
                                                                        "wait_complete")]
# pre27010's hazard is shown the way the hazard matrix decides its cells: structurally, not
# by whose clock runs late. Stage 1's rank 2 lacks page 2 of requests 0-3 (its hit query
# still counted it: tests.helpers.populate), so its read ends there; pre27010's TP MIN
# carries the short count to rank 3, and nothing carries it to stage 0, which reads all 8
# pages. The timeout (30 s) never fires, so a stalled host cannot make stage 0 end short.
# (On the wall clock the slow-stage scenario left both stages alike about one run in six.)
PP_HAZARD = ("pre27010", "timeout")
STAGE1_HOLES = tuple((2, i, 2, "kv") for i in range(4))
NO_TIMEOUT = {"timeout_base_s": 30.0, "timeout_per_ki_token_s": 0.0}


@pytest.fixture(scope="module")
def tp2pp2():
    storage = {**JITTER, "seed": slow_stage_seed()}
    cases = [case({"protocol": p, "policy": q, "tp": 2, "pp": 2, **PP_TIMEOUT}, storage,
                  n=12, gap_s=0.032) for p, q in PP_VARIANTS]
    cases.append(case({"protocol": PP_HAZARD[0], "policy": PP_HAZARD[1], "tp": 2, "pp": 2,
                       **NO_TIMEOUT}, storage, n=6, gap_s=0.032, holes=STAGE1_HOLES))
    keys = [*PP_VARIANTS, PP_HAZARD]
    return dict(zip(keys, run_cases(4, cases, timeout_s=150), strict=True))


def test_slow_stage_seed_is_slow_on_stage_one():
    f = [SimStorage(StorageSpec(jitter=1.0, seed=slow_stage_seed()), r, r % 2).rank_factor
         for r in range(4)]
    assert max(f[:2]) < 1.2 < 1.8 < min(f[2:])


@pytest.mark.slow
@pytest.mark.timeout(200)
@pytest.mark.parametrize("variant", PP_VARIANTS, ids=_ids(PP_VARIANTS))
def test_tp2pp2_ranks_agree(tp2pp2, variant):
    _assert_agree(tp2pp2[variant], f"{variant} at TP2xPP2")


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_tp2pp2_pre27010_stages_disagree(tp2pp2):
    per_rank = tp2pp2[PP_HAZARD]
    stage0, stage1 = (per_rank[0]["decisions"], per_rank[1]["decisions"]), \
        (per_rank[2]["decisions"], per_rank[3]["decisions"])
    # Within a stage the TP all-reduces keep ranks together...
    assert stage0[0] == stage0[1] and stage1[0] == stage1[1]
    # ...across stages nothing does: exactly the requests with a hole on stage 1 end with
    # less there (at most the 2 pages before the hole) while stage 0 keeps all 8.
    differ = sorted(rid for rid in stage0[0] if stage1[0].get(rid) != stage0[0][rid])
    assert differ == [f"r{i:03d}" for i in range(4)], differ
    for rid in differ:
        assert stage0[0][rid][1] == 512 and stage1[0][rid][1] <= 128, (rid, stage0[0][rid],
                                                                         stage1[0][rid])


# ---- TP2 x PP2: failing storage reads -------------------------------------------------------

# Reads fail with probability 0.2 per batch, independently on every rank, at a random page of
# the batch: 16-token pages and a 4096-token prefix make two batches per request. Each rank
# cuts its own prefixes short; the hit-query and ack MINs over TP and then PP make every
# rank of every stage keep the same count (pre27010 has no such agreement across stages).
FAILING = {"fail_rate": 0.2, "latency_ms": 5.0, "seed": 1}
FAIL_VARIANTS = [(p, q) for p in PROTOCOLS if p != "pre27010" for q in POLICIES]


@pytest.fixture(scope="module")
def tp2pp2_failing():
    cases = [case({"protocol": p, "policy": q, "tp": 2, "pp": 2, "page_size": 16}, FAILING,
                  n=8, prefix_tokens=4096, gap_s=0.02) for p, q in FAIL_VARIANTS]
    return dict(zip(FAIL_VARIANTS, run_cases(4, cases, timeout_s=200), strict=True))


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("variant", FAIL_VARIANTS, ids=_ids(FAIL_VARIANTS))
def test_tp2pp2_failing_reads_ranks_agree(tp2pp2_failing, variant):
    _assert_agree(tp2pp2_failing[variant], f"{variant} at TP2xPP2 with failing reads")


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_tp2pp2_failing_reads_scenario_is_contested(tp2pp2_failing):
    """Not a vacuous agreement: reads failed on some ranks and not on others, and cut
    prefixes short on all of them."""
    for proto in (p for p in PROTOCOLS if p != "pre27010"):
        per_rank = tp2pp2_failing[(proto, "wait_complete")]
        failed = [{r["rid"] for r in res["rows"] if r["io_error"]} for res in per_rank]
        assert any(failed) and len({frozenset(f) for f in failed}) > 1, failed
        short = [r for r in per_rank[0]["rows"] if r["prefetched_tokens"] < r["hit_tokens"]]
        assert short, proto


def test_disagreement_scope_names_pp_stage_splits():
    """TP2 x PP2 (ranks 0,1 stage 0; 2,3 stage 1): a split along stages only is pre27010's
    known hazard; a split inside a stage's TP group is a failure for every protocol."""
    from bench.verdict.run_rules import known_hazard
    from hicache.agreement.consensus import disagreement_scope

    a, b = ("poll", 1280, 1280), ("poll", 128, 1280)
    logs = [{"r1": a, "r2": a, "r3": a}, {"r1": a, "r2": b, "r3": a},
            {"r1": b, "r2": b, "r3": a}, {"r1": b, "r2": b, "r3": a}]
    assert disagreement_scope(logs, tp=2) == {"r1": "pp_stages", "r2": "ranks"}
    assert known_hazard("pre27010", "pp_stages")
    assert not known_hazard("pr27010", "pp_stages") and not known_hazard("pre27010", "ranks")
