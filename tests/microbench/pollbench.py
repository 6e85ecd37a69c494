"""Both ranks of the poll micro-benchmark: a real 2-rank gloo group (TP2), one HiCache per
protocol x policy, and polls issued in lock-step.

Rank 0 lives in the pytest process (`PollGroup`); rank 1 is a spawned peer (`peer_main`)
that obeys rank 0's commands on the default group (the harness group, never counted):
  ("poll", protocol, policy) -> before every poll the ranks all-reduce a "one more" flag,
      then both install a fresh pending prefetch and poll it; a 0 flag ends the series and
      the peer sends back what its polls returned and the collectives they cost;
  ("stop",) -> the peer leaves the group and exits.
Because rank 0 drives every poll, both ranks poll exactly as often, in the same order,
however many rounds pytest-benchmark runs (one when benchmarks are disabled).
"""

from __future__ import annotations

import multiprocessing as mp
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from bench.run.launch import reserve_port
from hicache.cache.cache import HiCache
from hicache.cache.operations import PrefetchOp
from hicache.comm.comm import COMPLETION, DECISION
from hicache.comm.groups import Groups, Layout
from hicache.comm.records import RequestStats
from hicache.memory.hashing import page_hashes
from hicache.serve.system import System, setup_distributed
from hicache.spec.config import HiCacheConfig

TP = 2
TIMEOUT_S = 60.0
RID = "bench-r0"
PAGES = 8  # the pending prefetch's agreed hit: 8 pages of 64 tokens


def build_cache(groups: Groups, rank: int, protocol: str, policy: str) -> HiCache:
    """One rank's HiCache; controller threads are not started (a poll does not need them).
    The timeout is effectively infinite, so a timeout-policy poll says "not yet"."""
    cfg = HiCacheConfig(protocol=protocol, policy=policy, tp=TP, timeout_base_s=1e9,
                        collective_timeout_s=TIMEOUT_S, host_pool_pages=64,
                        device_pool_pages=64)
    return System(cfg, Layout(rank, TP, 1), groups, torch.device("cpu")).cache


def install_pending(cache: HiCache) -> None:
    """A fresh prefetch whose hit is agreed and whose IO was issued but has not completed:
    polling it is the decision a waiting request costs per scheduler step. best_effort (and
    pre27010's) polls terminate it, so every round gets a new one."""
    tokens = list(range(PAGES * cache.page))
    cache.stats.requests[RID] = RequestStats(RID, arrival=0.0)
    cache.prompts[RID] = tokens
    cache.matches[RID] = [cache.tree.match([])]  # nothing cached on the host yet
    op = PrefetchOp(RID, tokens, None, time.monotonic(), 0.0, page_size=cache.page)
    op.hashes = op.hash_value = page_hashes(tokens, cache.page)
    op.hit_drained = True
    op.host_slots = list(range(PAGES))
    cache.ongoing[RID] = op


def more(flag: int) -> bool:
    """Rank 0 says whether another poll follows; the MIN doubles as the barrier in front of
    every timed poll (blocks until both ranks are here)."""
    t = torch.tensor([flag], dtype=torch.int32)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return bool(t.item())


def counts(cache: HiCache) -> dict[str, int]:
    by_site = cache.stats.counter.by_site
    return {"decision": by_site[DECISION], "completion": by_site[COMPLETION]}


def init_group(rank: int, port: int) -> Groups:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=TP, timeout=timedelta(seconds=TIMEOUT_S))
    # Every system group (new_group is collective: the peer creates them in the same order).
    return setup_distributed(Layout(rank, TP, 1), torch.device("cpu"), TIMEOUT_S)


def peer_main(port: int) -> None:
    """Rank 1: follows rank 0's commands until ("stop",)."""
    torch.set_num_threads(1)
    groups = init_group(1, port)
    try:
        while (cmd := _receive())[0] == "poll":
            cache = build_cache(groups, 1, cmd[1], cmd[2])
            results = []
            while True:
                install_pending(cache)  # before the flag, as rank 0's setup does
                if not more(1):
                    break
                results.append(cache.check_prefetch_progress(RID))
            dist.gather_object({"results": results, "counts": counts(cache)}, dst=0)
    finally:
        dist.destroy_process_group()


def _receive() -> tuple:
    box = [None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


class PollGroup:
    """Rank 0's end: owns the default group and the system groups of this process."""

    def __init__(self) -> None:
        self.held = reserve_port()  # until close(): no other process binds it first
        port = self.held.getsockname()[1]
        self.peer = mp.get_context("spawn").Process(target=peer_main, args=(port,),
                                                    daemon=True, name="poll-peer")
        self.peer.start()
        self.groups = init_group(0, port)
        self.broken = False

    def start(self, protocol: str, policy: str) -> HiCache:
        if self.broken:
            raise RuntimeError("the poll group broke in an earlier benchmark")
        dist.broadcast_object_list([("poll", protocol, policy)], src=0)
        return build_cache(self.groups, 0, protocol, policy)

    def finish(self) -> dict:
        """Ends the series; returns the peer's poll results and collective counts."""
        more(0)
        out = [None, None]
        dist.gather_object(None, out, dst=0)
        return out[1]

    def close(self) -> None:
        try:
            if not self.broken:
                dist.broadcast_object_list([("stop",)], src=0)
        finally:
            dist.destroy_process_group()
            self.peer.join(10)
            if self.peer.is_alive():
                self.peer.kill()
            self.held.close()
