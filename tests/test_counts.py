"""Collective counts on real gloo groups equal docs/design.md section 4, request by request.

One launch per layout runs every protocol x policy back to back (plus a variant whose
timeout is shorter than the IO, so timeout decisions really fire). For every request the
per-call-site counts are compared with `cost_model.expected_per_request`, computed from
that request's own polls, agreed hit and whether its prefetch was issued and went to IO;
the counter itself is checked against torch's process-group sequence numbers and against
the flight recorder.

Storage reads take 15 ms per batch, longer than a scheduler step, so wait_complete and
timeout poll a pending prefetch several times. best_effort polls once: that first poll
comes before the hit query returns and revokes the prefetch (as in SGLang), so its rows
are checked for counts, not for prefetched tokens.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from hicache.agreement.protocols import make_protocol
from hicache.spec.cost_model import (
    PIPELINED,
    POLICIES,
    PROTOCOLS,
    Expected,
    Setting,
    decision_per_poll,
    expected_per_request,
    per_step,
)
from tests.helpers import case, run_cases
from tests.test_protocols import SPEC_PER_POLL

pytestmark = pytest.mark.dist

PAGE = 64
STORAGE = {"latency_ms": 15.0}
N_REQUESTS = 6
PREFIX = 512  # tokens per request in storage (8 pages); 64 new tokens follow
SITES = ("decision", "completion", "pp_hop", "hit_query", "ack", "ticket")
# timeout shorter than one read: decisions by the clock, prefetches cut short or revoked.
FAST_TIMEOUT = {"timeout_base_s": 0.01, "timeout_per_ki_token_s": 0.0}
BUFFER_ONLY = {"host_memory": "buffer_only"}  # with PP > 1: 0.5.23's PP-ticket path

# (protocol, policy, tags): "fast" the short timeout, "buffer" buffer_only host memory.
VARIANTS = [(p, q, "") for p, q in itertools.product(PROTOCOLS, POLICIES)]
VARIANTS += [(p, "timeout", "fast") for p in PROTOCOLS]
VARIANTS += [("sglang-0.5.23", q, "buffer") for q in POLICIES]
VARIANTS += [("sglang-0.5.23", "timeout", "buffer-fast")]
# The write path on (SGLang's default write_through): each request's computed page goes
# device -> host -> storage, its acks agreed in the per-step reduction.
WRITE_THROUGH = {"write_policy": "write_through"}
VARIANTS += [(p, q, "wt") for p, q in itertools.product(PROTOCOLS, ("wait_complete", "timeout"))]
# pre27010 lets PP stages schedule different prefills (SGLang #22607); with write-through a
# later stage is then told to ack host copies it never made, and the run fails saying so
# (hicache.cache.tiers). Its write-through rows are checked at TP2 only.
VARIANTS_PP = [v for v in VARIANTS if not (v[0] == "pre27010" and v[2] == "wt")]


def _host_memory(tags: str) -> str:
    return "buffer_only" if "buffer" in tags else "cache"


def _cases(tp: int, pp: int, variants: list, **cfg_kw) -> list[dict]:
    return [case({"protocol": p, "policy": q, "tp": tp, "pp": pp,
                  **(FAST_TIMEOUT if "fast" in v else {}),
                  **(BUFFER_ONLY if "buffer" in v else {}),
                  **(WRITE_THROUGH if v == "wt" else {}), **cfg_kw}, STORAGE, n=N_REQUESTS,
                 prefix_tokens=PREFIX, new_tokens=64)
            for p, q, v in variants]


def _launch(tp: int, pp: int, timeout_s: float) -> dict:
    variants = VARIANTS if pp == 1 else VARIANTS_PP
    results = run_cases(tp * pp, _cases(tp, pp, variants), timeout_s=timeout_s,
                        flight_recorder=True)
    return dict(zip(variants, results, strict=True))


@pytest.fixture(scope="module")
def tp2():
    return _launch(2, 1, timeout_s=100)


@pytest.fixture(scope="module")
def tp2pp2():
    return _launch(2, 2, timeout_s=150)


def _id(v):
    return f"{v[0]}-{v[1]}{'-' + v[2] if v[2] else ''}"


def _expected(proto: str, policy: str, tp: int, pp: int, row: dict, pp_rank: int,
              tags: str = "") -> Expected:
    e = expected_per_request(Setting(proto, policy, tp, pp, host_memory=_host_memory(tags),
                                     extra_pool="trail" in tags, trailing_sidecar="trail" in tags),
                             row["polls"], row["hit_tokens"] // PAGE, row["op_issued"],
                             row["io_issued"], row["terminated_by"] == "poll",
                             absent_polls=row["absent_polls"], ops=row["prefetch_ops"])
    # With write-through ("wt") the expectation stands as is: copies and backups issue no
    # collective of their own, they ride in the per-step reduction (docs/design.md section 12).
    if pp_rank == 0:
        return e
    # A later PP stage mirrors stage 0 (cost_model counts rank 0): for a decision that hops,
    # it does no TP all-reduce and receives once per poll (the last stage sends nothing);
    # pre27010 decides on its own TP group, so it all-reduces as stage 0 does. It receives
    # each ticket before it knows the request's id: not counted per request there.
    hops = make_protocol(proto, policy).scope == "tp_pp"
    return replace(e, decision=0 if hops else e.decision, ticket=0)


def _measured(row: dict) -> Expected:
    return Expected(*(row.get(f"coll_{s}", 0) for s in SITES))


def _check_layout(results: dict, variant: tuple, tp: int, pp: int) -> None:
    proto, policy, tags = variant
    per_rank = results[variant]
    for rank, res in enumerate(per_rank):
        _, pp_rank = res["layout"]
        rows = res["rows"]
        assert len(rows) == N_REQUESTS
        for row in rows:
            want = _expected(proto, policy, tp, pp, row, pp_rank, tags)
            assert _measured(row) == want, f"rank {rank} {row['rid']}: polls={row['polls']}"
            assert row["data_errors"] == 0
        assert res["host_slots_unaccounted"] == 0, f"rank {rank}: host slots leaked"
        # Our counter against torch's own sequence numbers, every group, every rank.
        for group, (counted, seq) in res["crosscheck"].items():
            assert counted == seq, f"rank {rank} group {group}: counted {counted}, seq {seq}"
        # ...and against the flight recorder (gloo records collectives, not p2p sends).
        for group, entries in res["fr"].items():
            if group != "pp_cpu":
                assert entries == res["raw_by_group"].get(group, 0), (rank, group)
    rows0 = per_rank[0]["rows"]
    polls = sum(r["polls"] + (r["absent_polls"] if proto == "pr38284" else 0) for r in rows0)
    ticketed = "buffer" in tags and pp > 1  # a ticket's poll waits for it, any policy
    if policy == "best_effort" and not ticketed:
        assert all(r["polls"] == 1 for r in rows0)  # the first poll always ends it
    elif "fast" not in tags:  # a 10 ms timeout may end every prefetch at its first poll
        assert polls > N_REQUESTS, "the scenario must poll pending prefetches repeatedly"
    # Per poll, measured on rank 0, equals the hand-written table of docs/design.md
    # section 4.5 (SPEC_PER_POLL: T, P).
    t, p = _per_poll(proto, policy, tp, pp, tags)
    assert sum(r.get("coll_decision", 0) for r in rows0) == t * polls
    assert sum(r.get("coll_pp_hop", 0) for r in rows0) == p * polls


@pytest.mark.timeout(150)
@pytest.mark.parametrize("variant", VARIANTS, ids=_id)
def test_counts_tp2(tp2, variant):
    _check_layout(tp2, variant, 2, 1)


@pytest.mark.slow
@pytest.mark.timeout(200)
@pytest.mark.parametrize("variant", VARIANTS_PP, ids=_id)
def test_counts_tp2pp2(tp2pp2, variant):
    _check_layout(tp2pp2, variant, 2, 2)


@pytest.mark.timeout(150)
def test_fast_timeout_really_times_out(tp2):
    """The fast variant's decisions come from the clock: prefetches cut short or revoked.
    sglang-0.5.23's clock starts at the first blocked poll: no poll ends one at its first."""
    for proto in PROTOCOLS:  # storage holds the 512-token prefix, not the new tokens
        rows = tp2[(proto, "timeout", "fast")][0]["rows"]
        if proto in ("sglang-0.5.23", "pr39267"):  # pr39267 is on 0.5.23
            assert all(r["polls"] >= 2 for r in rows if r["terminated_by"] == "poll"), rows
            continue
        assert any(r["prefetched_tokens"] < PREFIX for r in rows), proto
    for proto in PROTOCOLS:  # with the default timeout every prefetch completes
        rows = tp2[(proto, "timeout", "")][0]["rows"]
        assert all(r["hit_tokens"] == r["prefetched_tokens"] == PREFIX for r in rows), proto


def _per_poll(proto: str, policy: str, tp: int, pp: int, tags: str) -> tuple[int, int]:
    """(T, P) per poll from the hand-written table of docs/design.md section 4.5."""
    per_poll = SPEC_PER_POLL[(proto, policy)][0 if pp == 1 else 1]
    if "buffer" in tags and pp > 1:
        per_poll = (1, 1)  # the ticket's readiness: T + P on every poll, whatever the policy
    return (per_poll[0] if tp > 1 else 0), per_poll[1]  # the table is TP2's


def count_table(results: dict, tp: int, pp: int) -> list[list[str]]:
    """Measured decision counts on rank 0 per protocol x policy, as the cells of a markdown
    table (header first); `pytest -s` prints it."""
    cells = [["protocol", "policy", "layout", "requests", "polls/req", "decision/poll",
              "pp_hop/poll", "decision/req", "expected decision/req"]]
    for variant, per_rank in results.items():
        proto, policy, v = variant
        rows = per_rank[0]["rows"]
        # pr38284 also all-reduces where the prefetch is absent: those calls are polls too.
        polls = sum(r["polls"] + (r["absent_polls"] if proto == "pr38284" else 0)
                    for r in rows)
        n, dec = len(rows), sum(r.get("coll_decision", 0) for r in rows)
        hop = sum(r.get("coll_pp_hop", 0) for r in rows)
        exp = sum(_expected(proto, policy, tp, pp, r, 0, v).decision for r in rows)
        cells.append([proto, policy + (f" ({v})" if v else ""),
                      f"TP{tp}" + (f"xPP{pp}" if pp > 1 else ""), str(n), f"{polls / n:.2f}",
                      f"{dec / polls:.2f}", f"{hop / polls:.2f}", f"{dec / n:.2f}",
                      f"{exp / n:.2f}"])
    return cells


def _check_count_table(results: dict, tp: int, pp: int) -> None:
    """The printed table says what docs/design.md section 4.5 says: per poll (T, P) from
    the hand-written table, and measured decisions per request equal to the model's, on
    every row."""
    cells = count_table(results, tp, pp)
    print("\n" + "\n".join("| " + " | ".join(c) + " |" for c in cells[:1] + [["---"] * 9]
                           + cells[1:]))
    assert len(cells) == 1 + len(results)
    for (proto, policy, tags), row in zip(results, cells[1:], strict=True):
        t, p = _per_poll(proto, policy, tp, pp, tags)
        assert row[:3] == [proto, row[1], f"TP{tp}" + (f"xPP{pp}" if pp > 1 else "")]
        assert row[3] == str(N_REQUESTS), row
        assert (row[5], row[6]) == (f"{t:.2f}", f"{p:.2f}"), row
        assert row[7] == row[8], row


@pytest.mark.timeout(150)
def test_count_table_tp2(tp2):
    _check_count_table(tp2, 2, 1)


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_count_table_tp2pp2(tp2pp2):
    _check_count_table(tp2pp2, 2, 2)


# ---- the corrections of docs/design.md section 4.7, in hand-written numbers -----------------

ACK_PROTOCOLS = [p for p in PROTOCOLS if p != "pre27010"]


@pytest.mark.timeout(150)
def test_pre27010_poll_before_host_slots_pays_no_completion_min(tp2):
    """A poll that ends a prefetch before its hit was agreed (no host slots) revokes it with
    no completion MIN; only ops holding host slots agree on a usable length."""
    rows = [r for res in tp2[("pre27010", "best_effort", "")] for r in res["rows"]]
    revoked = [r for r in rows if r["terminated_by"] == "poll" and not r["io_issued"]]
    assert revoked, "no poll ended a prefetch before its hit was agreed"
    assert all(r.get("coll_completion", 0) == 0 for r in revoked)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("proto", ACK_PROTOCOLS)
def test_final_ack_costs_no_collective(tp2, proto):
    """8 pages = one read batch: one reduced ack per request, the final ack is free."""
    for res in tp2[(proto, "wait_complete", "")]:
        for row in res["rows"]:
            assert row["io_issued"] and row["hit_tokens"] == PREFIX
            assert row.get("coll_ack", 0) == 1, row["rid"]


@pytest.mark.timeout(150)
@pytest.mark.parametrize("variant", VARIANTS, ids=_id)
def test_one_packed_per_step_min_without_pp(tp2, variant):
    for res in tp2[variant]:
        assert all(s.get("coll_per_step_min", 0) == 1 for s in res["steps"])


@pytest.mark.slow
@pytest.mark.timeout(200)
@pytest.mark.parametrize("variant", [v for v in VARIANTS_PP if v[0] not in PIPELINED], ids=_id)
def test_per_step_agreement_with_pp(tp2pp2, variant):
    """check_hicache_events with PP > 1 as the release that ships the protocol issues it
    (cost_model.per_step): 0.5.19's two relayed reductions, each a TP MIN on stage 0 and
    the PP hop; pre27010 0.5.18's two relayed ones and a stage-local queue MIN. A step's
    other hops are its polls' decisions."""
    proto, policy, tags = variant
    hop_per_poll = decision_per_poll(proto, policy, 2, 2, _host_memory(tags))[1]
    for res in tp2pp2[variant]:
        tp_ars, hops = per_step(proto, 2, 2, res["layout"][1], _host_memory(tags))
        for s in res["steps"]:
            assert s.get("coll_per_step_min", 0) == tp_ars, s
            polls = s["polled"] + s["polled_extra"]  # the walk's, and the open PRs' others
            assert s.get("coll_pp_hop", 0) == hops + polls * hop_per_poll, s


@pytest.mark.slow
@pytest.mark.timeout(200)
@pytest.mark.parametrize("policy", POLICIES)
def test_pre27010_per_step_is_5_on_stage_0_and_3_on_stage_1(tp2pp2, policy):
    """By hand, 0.5.18 at TP2 x PP2: stage 0 two relayed TP MINs (2 + 2 sends) and its
    queue MIN; stage 1 two receives and its own queue MIN. pre27010's polls never hop."""
    for res in tp2pp2[("pre27010", policy, "")]:
        want = 5 if res["layout"][1] == 0 else 3
        for s in res["steps"]:
            assert s.get("coll_per_step_min", 0) + s.get("coll_pp_hop", 0) == want, s


# TP1 x PP2 on 2 ranks (fast): the real Comm's PP hop, counted on both stages, with T = 0.
# The stage-local drain is a no-op without TP, so pre27010's per step stays two relays, as
# 0.5.19's two relayed reductions are; 0.5.23 relays once, and on its ticket path not at
# all. Decisions cross the stages on every poll (pr27010), on timeout polls only (pr36425),
# never (pre27010), or in the step-level flag (step-batched). A 10 s collective timeout: a
# hop that one stage drops fails the launch in seconds instead of hanging it.
TP1PP2 = [("pre27010", "wait_complete", ""), ("sglang-0.5.23", "wait_complete", ""),
          ("sglang-0.5.23", "wait_complete", "buffer"), ("pr27010", "timeout", ""),
          ("pr36425", "timeout", "fast"), ("step-batched", "timeout", "fast")]
TP1PP2_BY_HAND = {TP1PP2[0]: (0, 2), TP1PP2[1]: (0, 1), TP1PP2[2]: (0, 0),
                  TP1PP2[3]: (0, 2), TP1PP2[4]: (0, 2), TP1PP2[5]: (0, 2)}


@pytest.fixture(scope="module")
def tp1pp2():
    cases = _cases(1, 2, TP1PP2, collective_timeout_s=10.0)
    results = run_cases(2, cases, timeout_s=100, flight_recorder=True)
    return dict(zip(TP1PP2, results, strict=True))


@pytest.mark.timeout(150)
@pytest.mark.parametrize("variant", TP1PP2, ids=_id)
def test_counts_tp1pp2(tp1pp2, variant):
    _check_layout(tp1pp2, variant, 1, 2)
    proto, policy, tags = variant
    hop_per_poll = decision_per_poll(proto, policy, 1, 2, _host_memory(tags))[1]
    for res in tp1pp2[variant]:
        assert per_step(proto, 1, 2, res["layout"][1], _host_memory(tags)) == \
            TP1PP2_BY_HAND[variant]
        hops = TP1PP2_BY_HAND[variant][1]
        for s in res["steps"]:
            assert s.get("coll_per_step_min", 0) == 0, s
            polls = s["polled"] + s["polled_extra"]  # the walk's, and the open PRs' others
            assert s.get("coll_pp_hop", 0) == hops + polls * hop_per_poll, s


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_ticket_path_never_times_out(tp2pp2):
    """buffer_only at PP > 1: readiness is the final ack, whatever the policy, so even a
    10 ms timeout cuts nothing short; every rank took its whole hit."""
    for res in tp2pp2[("sglang-0.5.23", "timeout", "buffer-fast")]:
        for row in res["rows"]:
            assert row["terminated_by"] == "poll" and row["prefetched_tokens"] == PREFIX, row


@pytest.mark.slow
@pytest.mark.timeout(200)
@pytest.mark.parametrize("proto", PROTOCOLS)
def test_background_reductions_span_tp_and_pp(tp2pp2, proto):
    """Ack protocols: hit query and per-batch acks reduce over TP, then PP, on every rank
    (T + P = 2 each at TP2 x PP2); pre27010's background groups are TP only."""
    per = 2 if proto in ACK_PROTOCOLS else 1
    for res in tp2pp2[(proto, "wait_complete", "")]:
        for row in res["rows"]:
            assert row.get("coll_hit_query", 0) == per, row["rid"]
            assert row.get("coll_ack", 0) == (per if proto in ACK_PROTOCOLS else 0)
        pp_groups = {g: c for g, c in res["crosscheck"].items() if g.endswith("_pp")}
        if proto in ACK_PROTOCOLS:  # the PP groups are cross-checked like every other
            assert set(pp_groups) == {"prefetch_pp", "ack_pp"}
            assert all(counted == seq > 0 for counted, seq in pp_groups.values()), pp_groups


# ---- the write path (docs/design.md section 12) ----------------------------------------------

WT_VARIANTS = [v for v in VARIANTS if v[2] == "wt"]


def _check_write_path(results: dict, variant: tuple) -> None:
    """Every request's computed page went device -> host -> storage on every rank, with no
    collective of its own (the counts above), and its acks were drained before the end."""
    for res in results[variant]:
        wp = res["write_path"]
        assert wp["host_copy_pages"] == wp["storage_write_pages"] == N_REQUESTS, wp
        assert res["host_slots_unaccounted"] == 0 and wp["device_slots_unaccounted"] == 0
        for row in res["rows"]:
            assert row["computed_tokens"] == 64 and row["storage_hit_tokens"] == PREFIX


@pytest.mark.timeout(150)
@pytest.mark.parametrize("variant", WT_VARIANTS, ids=_id)
def test_write_through_tp2(tp2, variant):
    _check_write_path(tp2, variant)


@pytest.mark.slow
@pytest.mark.timeout(200)
@pytest.mark.parametrize("variant", [v for v in WT_VARIANTS if v in VARIANTS_PP],
                         ids=_id)
def test_write_through_tp2pp2(tp2pp2, variant):
    _check_write_path(tp2pp2, variant)
