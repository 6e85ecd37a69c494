"""The real `hicache.comm.comm.Comm` and `hicache.comm.groups.Groups` at TP x PP layouts up to
TP2 x PP3, one thread per rank over `tests.doubles.ThreadWorld` (torch.distributed's calls, in
one process).

What runs where (docs/design.md section 3): `reduce_tp_then_pp` is SGLang's `_all_reduce`
(PP stage 0 reduces over its TP group, later stages take stage 0's result point to point,
stage i from i-1, then on to i+1); a background reduction (`all_reduce_groups`) is one
all-reduce per group in turn; a one-rank group issues nothing. Each op is counted at its
call site, and the counter equals the groups' own sequence numbers. The two-process gloo
test of the same paths is tests/test_comm_pp.py.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

import hicache.comm.groups
from hicache.agreement.protocols import make_protocol
from hicache.cache.controller import CacheController, ControllerSettings
from hicache.cache.operations import KV, Ack, PrefetchOp
from hicache.comm.comm import (
    DECISION,
    HARNESS_STOP,
    HIT_QUERY,
    REQUEST_BROADCAST,
    CollectiveCounter,
    CollectiveError,
    Comm,
)
from hicache.comm.groups import HIT_GROUPS, Groups, Layout
from hicache.memory.pools import PagePool
from hicache.memory.storage import SimStorage, StorageSpec
from tests.doubles import ThreadWorld, hashes_of, patch_dist, tokens
from tests.test_protocols import CASES, TWO_RANKS


def _comms(monkeypatch, tp: int, pp: int, timeout_s: float = 10.0):
    world = ThreadWorld(tp * pp, timeout_s)
    patch_dist(monkeypatch, world)

    def run(fn):
        """fn(comm) on every rank; returns [(comm, result)] by rank, exceptions raised."""
        def on_rank(rank):
            layout = Layout(rank, tp, pp)
            comm = Comm(layout, Groups(layout, "gloo", timeout_s), CollectiveCounter())
            return comm, fn(comm)
        out = world.run(on_rank)
        for r in out:
            if isinstance(r, Exception):
                raise r
        return out
    return world, run


def _hop_value(comm: Comm) -> list[int]:
    # Rank r contributes [r + 10, 30 - r]: MIN over a stage differs from any one rank's.
    t = torch.tensor([comm.layout.rank + 10, 30 - comm.layout.rank])
    comm.reduce_tp_then_pp(t, dist.ReduceOp.MIN, DECISION, "r0")
    comm.drain_sends()
    return t.tolist()


def test_groups_partition_the_grid(monkeypatch):
    """TP groups are the stages' contiguous ranks, PP groups the TP columns (rank 5 of TP2 x
    PP3 is TP rank 1 of stage 2)."""
    ranks = {}
    for rank in range(6):
        patch_dist(monkeypatch, ThreadWorld(6))
        ranks[rank] = Groups(Layout(rank, 2, 3), "gloo", 1.0).ranks
    assert ranks[5]["tp_cpu"] == ranks[5]["data"] == ranks[5]["ack"] == [4, 5]
    assert ranks[5]["pp_cpu"] == ranks[5]["prefetch_pp"] == ranks[5]["ack_pp"] == [1, 3, 5]
    assert ranks[0]["sched"] == ranks[0]["consensus"] == list(range(6))
    assert ranks[2]["prefetch"] == [2, 3] and ranks[2]["prefetch_pp"] == [0, 2, 4]


@pytest.mark.parametrize("data_backend", ["gloo", "nccl"])
def test_every_group_is_gloo_but_the_data_plane_with_the_run_timeout(monkeypatch,
                                                                     data_backend):
    patch_dist(monkeypatch, ThreadWorld(4))
    groups = Groups(Layout(3, 2, 2), data_backend, 7.5)
    assert set(groups.pg) == set(hicache.comm.groups.GROUP_NAMES)
    for name, pg in groups.pg.items():
        want = data_backend if name == "data" else "gloo"
        assert (pg.backend, groups.backend(name)) == (want, want), name
        assert pg.timeout == timedelta(seconds=7.5), name


def test_one_rank_has_no_groups(monkeypatch):
    patch_dist(monkeypatch, None)  # world size 1 never touches dist
    groups = Groups(Layout(0, 1, 1), "gloo", 1.0)
    assert set(groups.pg.values()) == {None} and groups.sequence_numbers() == {}
    assert groups.size("tp_cpu") == 1


def test_sequence_numbers_leave_out_a_data_plane_that_is_not_gloo(monkeypatch):
    patch_dist(monkeypatch, ThreadWorld(2))
    assert "data" not in Groups(Layout(0, 2, 1), "nccl", 1.0).sequence_numbers()
    patch_dist(monkeypatch, ThreadWorld(2))
    seq = Groups(Layout(0, 2, 1), "gloo", 1.0).sequence_numbers()
    assert seq == dict.fromkeys(hicache.comm.groups.GROUP_NAMES, 0)


def test_counter_accumulates_every_view():
    """Several ops per key: each view adds up (scheduler sites per step and per rid, with
    their seconds; model all-reduces per step but not in seconds; background sites by rid
    only)."""
    c = CollectiveCounter()
    c.step = 3
    c.record(DECISION, "tp_cpu", 1, "r0", 0.25)
    c.record(DECISION, "tp_cpu", 1, "r0", 0.5)
    c.record("pp_hop", "pp_cpu", 1, "r0", 1.0)
    c.record(REQUEST_BROADCAST, "sched", 2, None, 0.125)
    c.record("model_allreduce", "data", 1, None, 4.0)
    c.record(HIT_QUERY, "prefetch", 1, "r0", 8.0)
    c.record(HIT_QUERY, "prefetch_pp", 1, "r1", 8.0)
    assert c.by_site == {DECISION: 2, "pp_hop": 1, REQUEST_BROADCAST: 1,
                         "model_allreduce": 1, HIT_QUERY: 2}
    assert c.raw_by_group == {"tp_cpu": 2, "pp_cpu": 1, "sched": 2, "data": 1,
                              "prefetch": 1, "prefetch_pp": 1}
    assert c.by_rid == {"r0": {DECISION: 2, "pp_hop": 1, HIT_QUERY: 1}, "r1": {HIT_QUERY: 1}}
    assert c.by_step == {3: {DECISION: 2, "pp_hop": 1, REQUEST_BROADCAST: 1,
                             "model_allreduce": 1}}
    assert c.sched_seconds_by_step == {3: 1.875}
    assert c.sched_seconds_by_step_site == {3: {DECISION: 0.75, "pp_hop": 1.0,
                                                REQUEST_BROADCAST: 0.125}}
    assert c.sched_seconds_by_rid == {"r0": 1.75}


def test_tp2pp2_stage_zero_reduces_and_the_later_stage_adopts(monkeypatch):
    world, run = _comms(monkeypatch, 2, 2)
    out = run(_hop_value)
    assert [v for _, v in out] == [[10, 29]] * 4  # stage 0's TP MIN, everywhere
    assert world.ops == {
        0: [("all_reduce", (0, 1), None), ("isend", (0, 2), 2)],
        1: [("all_reduce", (0, 1), None), ("isend", (1, 3), 3)],
        2: [("recv", (0, 2), 0)],  # no TP all-reduce on a later stage
        3: [("recv", (1, 3), 1)],
    }
    by_site = [dict(c.counter.by_site) for c, _ in out]
    assert by_site == [{DECISION: 1, "pp_hop": 1}] * 2 + [{"pp_hop": 1}] * 2
    assert [dict(c.counter.by_rid["r0"]) for c, _ in out] == by_site


def test_middle_stage_receives_then_sends(monkeypatch):
    world, run = _comms(monkeypatch, 1, 3)
    out = run(_hop_value)
    assert [v for _, v in out] == [[10, 30]] * 3  # rank 0's value (TP1: nothing to reduce)
    assert world.ops == {0: [("isend", (0, 1, 2), 1)],
                         1: [("recv", (0, 1, 2), 0), ("isend", (0, 1, 2), 2)],
                         2: [("recv", (0, 1, 2), 1)]}
    assert [c.counter.by_site["pp_hop"] for c, _ in out] == [1, 2, 1]


def test_pp1_is_a_tp_all_reduce_only(monkeypatch):
    world, run = _comms(monkeypatch, 2, 1)
    out = run(_hop_value)
    assert [v for _, v in out] == [[10, 29]] * 2
    assert world.ops == {0: [("all_reduce", (0, 1), None)], 1: [("all_reduce", (0, 1), None)]}


def test_sends_are_drained_once(monkeypatch):
    """A send is waited for at the next drain (backpressure on a lagging stage), then
    forgotten."""
    _, run = _comms(monkeypatch, 1, 2)

    def hop(comm):
        comm.reduce_tp_then_pp(torch.tensor([1]), dist.ReduceOp.MIN, DECISION)
        pending = list(comm._sends)
        comm.drain_sends()
        return pending, list(comm._sends)
    (_, (pending, left)), (_, (nothing, _)) = run(hop)
    assert len(pending) == 1 and pending[0].waited and left == []
    assert nothing == []  # the last stage sends nothing


def test_the_later_stage_gets_the_value_at_send_time(monkeypatch):
    """The caller may reuse its tensor as soon as the hop returns: the send is a copy."""
    _, run = _comms(monkeypatch, 1, 2)
    reused = threading.Event()

    def hop(comm):
        t = torch.tensor([comm.layout.rank + 5])
        if comm.layout.rank == 1:
            assert reused.wait(10.0)  # receive only after stage 0 overwrote its tensor
        comm.reduce_tp_then_pp(t, dist.ReduceOp.MIN, DECISION)
        if comm.layout.rank == 0:
            t.fill_(99)
            reused.set()
        comm.drain_sends()
        return t.tolist()
    assert [v for _, v in run(hop)] == [[99], [5]]


def test_background_reduction_spans_tp_then_pp(monkeypatch):
    world, run = _comms(monkeypatch, 2, 2)

    def hit(comm):
        t = torch.tensor([[8, 3, 6, 5][comm.layout.rank]])
        comm.all_reduce_groups(t, dist.ReduceOp.MIN, HIT_GROUPS, HIT_QUERY, "r0")
        return t.tolist()
    out = run(hit)
    assert [v for _, v in out] == [[3]] * 4  # the global MIN on every rank of the grid
    assert world.ops[3] == [("all_reduce", (2, 3), None), ("all_reduce", (1, 3), None)]
    assert all(c.counter.by_site == {HIT_QUERY: 2} for c, _ in out)
    assert all(c.counter.raw_by_group == {"prefetch": 1, "prefetch_pp": 1} for c, _ in out)


def test_one_rank_groups_issue_nothing(monkeypatch):
    """TP1: no TP all-reduce (SGLang skips TP = 1), only the PP group's."""
    world, run = _comms(monkeypatch, 1, 2)

    def hit(comm):
        t = torch.tensor([comm.layout.rank])
        comm.all_reduce(t, dist.ReduceOp.MAX, "tp_cpu", DECISION)
        comm.all_reduce_groups(t, dist.ReduceOp.MAX, HIT_GROUPS, HIT_QUERY)
        return t.tolist()
    out = run(hit)
    assert [v for _, v in out] == [[1], [1]]
    assert world.ops == {r: [("all_reduce", (0, 1), None)] for r in range(2)}
    assert all(c.counter.by_site == {HIT_QUERY: 1} for c, _ in out)


def test_broadcast_object_is_one_counted_collective_of_two_ops(monkeypatch):
    _, run = _comms(monkeypatch, 2, 1)
    msg = {"now": 12.5, "reqs": [("r0", [1, 2, 3])]}

    def bcast(comm):
        return comm.broadcast_object(msg if comm.layout.rank == 0 else None, REQUEST_BROADCAST)
    out = run(bcast)
    assert [v for _, v in out] == [msg, msg]
    assert all(c.counter.by_site == {REQUEST_BROADCAST: 1} for c, _ in out)
    assert all(c.counter.raw_by_group == {"sched": 2} for c, _ in out)


def test_counter_equals_the_groups_sequence_numbers(monkeypatch):
    _, run = _comms(monkeypatch, 2, 2)

    def mixed(comm):
        _hop_value(comm)
        comm.all_reduce_groups(torch.tensor([1]), dist.ReduceOp.MIN, HIT_GROUPS, HIT_QUERY)
        comm.broadcast_object("x", REQUEST_BROADCAST)
        return comm.groups.sequence_numbers()
    for comm, seq in run(mixed):
        counted = comm.counter.raw_by_group
        assert {g: n for g, n in seq.items() if n} == dict(counted), comm.layout


def test_a_peer_that_never_joins_is_a_collective_error_naming_the_call(monkeypatch):
    _, run = _comms(monkeypatch, 2, 1, timeout_s=0.3)

    def one_sided(comm):
        comm.counter.step = 7
        if comm.layout.rank == 0:
            with pytest.raises(CollectiveError) as e:
                comm.all_reduce(torch.tensor([1]), dist.ReduceOp.MAX, "tp_cpu", DECISION, "r3")
            return str(e.value)
        return None
    (c0, msg), _ = run(one_sided)
    assert msg.startswith("collective at call site 'decision' on group 'tp_cpu' (ranks "
                          "[0, 1]) failed on rank 0 at step 7 for request r3: Timed out"), msg
    assert c0.counter.by_site == {}  # a failed collective is not counted


# ---- the system's reductions over the real Comm: each rank's input differs ---------------

@pytest.mark.parametrize("pp", [1, 2])
@pytest.mark.parametrize(("proto", "policy", "guard", "f0", "f1", "want"), TWO_RANKS,
                         ids=[f"{r[0]}-{r[1]}-{r[3]}+{r[4]}{'' if r[2] else '-noguard'}"
                              for r in TWO_RANKS])
def test_poll_decides_over_the_real_comm(monkeypatch, proto, policy, guard, f0, f1, want,
                                         pp):
    """The decision table's two-rank cases on every rank of TP2 (x PP2, where stage 1
    knows what stage 0 knows): the same answer everywhere, one counted decision
    collective per poll that votes a list, attributed to the request."""
    _, run = _comms(monkeypatch, 2, pp)
    p = make_protocol(proto, policy, guard)

    def poll(comm):
        f = replace((CASES[f0], CASES[f1])[comm.layout.tp_rank], pp_rank=comm.layout.pp_rank)
        return p.poll(f, comm, "r7")
    out = run(poll)
    assert [d for _, d in out] == [want] * (2 * pp)
    reduces = isinstance(p.vote(CASES[f0]), list)
    hop = int(reduces and pp > 1 and p.scope == "tp_pp")
    want_sites = {k: v for k, v in {DECISION: int(reduces), "pp_hop": hop}.items() if v}
    assert dict(out[0][0].counter.by_site) == want_sites
    assert dict(out[0][0].counter.by_rid.get("r7", {})) == want_sites


def _background(comm, uses_acks: bool, leading: int, terminated: bool = False):
    """Runs one op through this rank's prefetch-thread loop (on the calling thread), with
    `leading` of its 8 pages in this rank's storage; then reduces a per-batch ack of
    `leading` pages and an extra-pool ack."""
    storage = SimStorage(StorageSpec(latency_ms=0.0, exists_latency_ms=0.0), 0, 0)
    storage.put(hashes_of(8, 16)[:leading], KV, 4)
    ctrl = CacheController(comm, storage, PagePool(KV, 16, 4), None,
                            ControllerSettings(16, uses_acks))
    op = PrefetchOp("r5", tokens(8, 16), None, 0.0, 0.0, page_size=16)
    if terminated:
        op.terminated.set()
    ctrl.prefetch_queue.put(op)
    ctrl.prefetch_queue.put(None)
    ctrl._prefetch_loop()
    acks = ctrl._reduce(Ack(op, tokens=leading * 16)), ctrl._reduce(Ack(op, pool_pages=leading))
    return len(ctrl.hit_queue.get_nowait().hash_value), acks[0].tokens, acks[1].pool_pages


def test_hit_query_and_acks_reduce_to_the_grids_min(monkeypatch):
    _, run = _comms(monkeypatch, 2, 2)
    out = run(lambda comm: _background(comm, True, [8, 6, 7, 5][comm.layout.rank]))
    assert [v for _, v in out] == [(5, 5 * 16, 5)] * 4
    for comm, _ in out:  # T + P each: TP group, then PP group
        assert comm.counter.by_rid["r5"] == {HIT_QUERY: 2, "ack": 4}


def test_pre27010_hit_query_reduces_over_its_tp_group_only(monkeypatch):
    _, run = _comms(monkeypatch, 2, 2)
    out = run(lambda comm: _background(comm, False, [8, 6, 7, 5][comm.layout.rank])[0])
    assert [v for _, v in out] == [6, 6, 5, 5]  # no PP agreement before PR #27010
    assert all(c.counter.by_site[HIT_QUERY] == 1 for c, _ in out)


def test_a_terminated_op_joins_the_hit_min_with_zero_pages(monkeypatch):
    _, run = _comms(monkeypatch, 2, 1)
    out = run(lambda comm: _background(comm, True, 8, terminated=comm.layout.rank == 1)[0])
    assert [v for _, v in out] == [0, 0]


@pytest.mark.parametrize(("busy", "idle"), [((False, False), True), ((False, True), False),
                                            ((True, True), False)])
def test_all_idle_only_when_no_rank_is_busy(monkeypatch, busy, idle):
    """The harness's end-of-serve agreement: a MAX of "busy" on the default group, counted
    at its own site, never on a system group."""
    world, run = _comms(monkeypatch, 2, 1)
    out = run(lambda comm: comm.all_idle(busy[comm.layout.rank]))
    assert [v for _, v in out] == [idle, idle]
    assert all(c.counter.by_site == {HARNESS_STOP: 1} for c, _ in out)
    assert all(c.counter.raw_by_group == {"default": 1} for c, _ in out)
    assert world.ops[0] == [("all_reduce", (0, 1), None)]


@pytest.mark.parametrize("busy", [True, False])
def test_all_idle_at_one_rank_is_local(busy):
    comm = Comm(Layout(0, 1, 1), Groups(Layout(0, 1, 1), "gloo", 1.0), CollectiveCounter())
    assert comm.all_idle(busy) is (not busy) and comm.counter.by_site == {}


def test_broadcast_of_nothing_is_the_length_alone(monkeypatch):
    """obj None: only the length (0) travels, one op; a column's broadcast comes from PP
    stage 0 and is attributed to its request."""
    world, run = _comms(monkeypatch, 1, 2)
    out = run(lambda comm: comm.broadcast_object(None, REQUEST_BROADCAST))
    assert [v for _, v in out] == [None, None]
    assert all(c.counter.raw_by_group == {"sched": 1} for c, _ in out)
    msg = {"rid": "r4", "pages": 8}
    world, run = _comms(monkeypatch, 1, 2)
    out = run(lambda comm: comm.broadcast_object(msg if comm.layout.pp_rank == 0 else "x",
                                                 "ticket", group="pp_cpu", rid="r4"))
    assert [v for _, v in out] == [msg, msg]
    assert all(dict(c.counter.by_rid["r4"]) == {"ticket": 1} for c, _ in out)
    assert all(c.counter.raw_by_group == {"pp_cpu": 2} for c, _ in out)
