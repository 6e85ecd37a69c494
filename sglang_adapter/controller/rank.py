"""A rank of the controller rig's own checks (make sglang-check, `bench sglang-poll`'s
controller run): requests one at a time through SGLang's controller path
(sglang_adapter.controller.rig.ControllerRig), stepped until SGLang's poll lets each end,
the threads settled, and each request's collectives as SGLang issued them (the door's
calls, by the role of the frame that issued them) beside what the project's model of the
release prices for this rank's stage."""

from __future__ import annotations

import dataclasses
import threading
import zlib
from collections import Counter
from dataclasses import dataclass

import torch
import torch.distributed as dist

from hicache.memory.hashing import page_hashes
from hicache.memory.storage import StorageSpec, make_storage
from hicache.spec.cost_model import Expected, Setting, expected_per_request
from sglang_adapter.controller.rig import (
    PAGE_ELEMS,
    POOL,
    STEP_WAIT_S,
    ControllerRig,
    RigSetup,
)
from sglang_adapter.decisions.cache import P2P_OPS
from sglang_adapter.decisions.poll import STEP_S, grid_groups
from sglang_adapter.door import Door
from sglang_adapter.loader import LoadError, load, native_hash
from sglang_adapter.source import DEFAULT_CACHE, Source
from sglang_adapter.target import modelled_protocol


@dataclass(frozen=True)
class ControllerCase:
    """One request through SGLang's controller path: its prompt's pages, how many of them
    storage holds, its stop policy and timeout budget (virtual seconds), and whether its
    reads stall (a slow storage node: `Tier.stall_s`)."""

    rid: str
    policy: str
    pages: int
    stored: int
    budget_s: float = 3.5
    slow: bool = False

    def tokens(self, page_size: int) -> list[int]:
        """The prompt, the same on every rank (crc32, not the salted hash())."""
        return [zlib.crc32(f"{self.rid}:{i}".encode()) % 30000 + 1
                for i in range(self.pages * page_size)]


def serve_one(rig: ControllerRig, door: Door, case: ControllerCase,
              max_steps: int = 400) -> dict:
    """Issues one prefetch through SGLang's `prefetch_from_storage`, then steps (SGLang's
    `check_hicache_events`, then its poll) until the poll says it may end. Returns what
    the model of the release needs to price it: the polls that found it ongoing, the pages
    it fetched (its agreed hit, cut to the host slots it got), whether it went to IO."""
    rig.configure(case.policy, rig.page_size, case.budget_s, 0.0)
    door.rid = case.rid
    handle = rig.issue(case.rid, case.tokens(rig.page_size), case.slow)
    info = rig.cache.ongoing_prefetch.get(handle)
    ongoing_polls = 0
    for polls in range(1, max_steps + 1):
        door.rid = f"{case.rid}/step"
        rig.step()
        door.rid = case.rid
        ongoing = handle in rig.cache.ongoing_prefetch
        ongoing_polls += ongoing
        ready = bool(rig.cache.check_prefetch_progress(handle))
        door.rid = None
        if ready:
            op = info.operation if info is not None else None
            io = op is not None and op.host_indices is not None
            return {"issued": op is not None, "polls": polls, "ongoing_polls": ongoing_polls,
                    "io_issued": io, "hit_pages": len(op.hash_value) if io else 0,
                    "ended_by": "poll" if ongoing else "drain",
                    "deadline": bool(getattr(op, "deadline_expired", False))}
        rig.clock.now += STEP_S
        threading.Event().wait(STEP_WAIT_S)  # SGLang's threads run between steps
    raise AssertionError(f"{case.rid}: SGLang's poll never let it end in {max_steps} steps")


def settle(rig: ControllerRig, door: Door, max_steps: int = 1000) -> int:
    """Steps until SGLang's threads and queues are idle and every host slot is back (a
    prefetch a poll ended may still be reading; its acks are reduced and drained all the
    same), on every rank alike: the idleness is MIN-agreed over the TP group each step."""
    ctl = rig.cache.cache_controller
    door.rid = "settle/step"
    for steps in range(1, max_steps + 1):
        rig.step()
        idle = all(q.empty() for q in (ctl.prefetch_queue, ctl.prefetch_buffer,
                                       ctl.prefetch_sync_queue, ctl.prefetch_hit_queue,
                                       ctl.ack_prefetch_queue, ctl.host_mem_release_queue))
        free = rig.host.available_size() + sum(len(s) for _, s, _ in rig.tree.inserted)
        flag = torch.tensor([int(idle and free == rig.host.size)])
        # The rig's own agreement, on the world group (no group the door holds against
        # torch's sequence numbers): not SGLang's.
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        if flag.item():
            door.rid = None
            return steps
        threading.Event().wait(STEP_WAIT_S)
    raise AssertionError("SGLang's controller never went idle")


def held_against_model(protocol: str, outcome: dict, policy: str, tp: int, pp: int,
                       pp_rank: int = 0) -> Expected:
    """What the project's model of the release (`sglang-0.5.23`, `pr36425`) says a rank of
    PP stage `pp_rank` issues for this request, from what SGLang did with it (no side-car
    pool in this rig). The model prices rank 0; a later stage differs only in the poll's
    relayed decision, as SGLang's `_all_reduce` issues it (unified_radix_cache.py:376-407):
    only stage 0 all-reduces over its TP group, then `_pp_sync` relays the verdict, a send
    on stage 0, a receive on the last stage, both on a stage between. The hit query and
    the acks are the controller's `_all_reduce` over every group `_create_sync_groups` made
    (TP, then PP): the same on every stage."""
    want = expected_per_request(Setting(protocol, policy, tp, pp), outcome["ongoing_polls"],
                                outcome["hit_pages"], outcome["issued"], outcome["io_issued"],
                                outcome["ended_by"] == "poll")
    if pp_rank == 0:
        return want
    hops = int(pp_rank > 0) + int(pp_rank < pp - 1)
    return dataclasses.replace(want, decision=0, pp_hops=want.pp_hops * hops)


def counted(calls, rid: str) -> Expected:
    """SGLang's own collectives for one request, by the role of the frame that issued them."""
    by = Counter()
    for site, _group, op, who, via, n in calls:
        if who == rid:
            # the hit query's MIN: inline in prefetch_thread_func (0.5.19), in
            # _sync_prefetch_hit_query under it (0.5.23); the ack's under the ack thread;
            # at PP > 1 the poll's verdict relayed by _pp_sync (isend / recv)
            role = ("hit_query" if "prefetch_thread_func" in via else
                    "ack" if "prefetch_sync_thread_func" in via else
                    "pp_hop" if op in P2P_OPS and "_can_terminate_prefetch" in via else
                    "decision" if "_can_terminate_prefetch" in via else f"{site} < {via}")
            by[role] += n
    extra = set(by) - {"hit_query", "ack", "decision", "pp_hop"}
    assert not extra, f"{rid}: collectives of no known role: {extra}"
    return Expected(by["decision"], 0, by["pp_hop"], by["hit_query"], by["ack"])


def controller_rank(rank: int, world: int, source: Source, tp: int,
                    cases: list[ControllerCase], stall_s: float = 0.5, seed: int = 0,
                    pp: int = 1) -> dict:
    """A spawned rank (bench.run.launch): SGLang's controller path at TP `tp` x PP `pp`
    for each case; returns per request what it did, SGLang's collectives and the model's
    for this rank's stage, the pages loaded against storage and the door's crosscheck."""
    assert world == tp * pp, (world, tp, pp)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    loaded = load(source)
    if loaded.family != "unified":
        raise LoadError(f"sglang {source.label}: the controller rig drives UnifiedRadixCache "
                        "with a HybridCacheController (0.5.19 on), not HiRadixCache")
    native_hash(source, str(DEFAULT_CACHE))
    # SGLang's scheduler hands its cache the stage's TP CPU group and the TP column's PP
    # CPU group (kv_cache_builder.py:403-405); the controller copies both for its own.
    tp_group, pp_group = grid_groups(rank, tp, pp)
    storage = make_storage(StorageSpec(latency_ms=1.0, exists_latency_ms=0.1, seed=seed),
                           rank, rank % tp)
    door = Door(source.root)
    door.register("tp", tp_group)
    door.register("pp", pp_group)
    door.install()
    try:
        rig = ControllerRig(loaded, rank, tp, pp, tp_group, pp_group,
                            RigSetup(storage, host_tokens=4096 * 64, page_size=64,
                                     stall_s=stall_s))
        for name, group in rig.sync_groups().items():
            door.register(name, group)
        outcomes = {}
        for case in cases:
            storage.put(page_hashes(case.tokens(64), 64)[: case.stored], POOL, PAGE_ELEMS)
            outcomes[case.rid] = serve_one(rig, door, case)
        settle(rig, door)
        rig.stop()
    finally:
        door.uninstall()
    dist.barrier()
    return _report(rig, door, source, cases, outcomes)


def _report(rig: ControllerRig, door: Door, source: Source, cases: list[ControllerCase],
            outcomes: dict) -> dict:
    calls = [(c.site, c.group, c.op, c.rid, c.via, n) for c, n in door.calls.items()]
    protocol = modelled_protocol(source)
    rank, tp, pp = rig.layout
    return {"outcomes": outcomes, "loaded": rig.loaded_pages(), "names": rig.tier.names,
            "crosscheck": door.crosscheck(), "calls": calls, "protocol": protocol,
            "layout": rig.layout,
            "sglang": {c.rid: counted(calls, c.rid) for c in cases},
            "model": {c.rid: held_against_model(protocol, outcomes[c.rid], c.policy, tp, pp,
                                                rank // tp)
                      for c in cases}}
