"""One rank's system under test, assembled; and the process-level distributed setup.

`build_system` wires storage, pools, tree, controller threads, protocol, scheduler and
model for one configuration. The process groups are created once per process
(`setup_distributed`) and reused by every configuration the process runs.
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

from hicache.agreement.consensus import ConsensusChecker
from hicache.cache.cache import HiCache
from hicache.cache.operations import KV, SIDECAR
from hicache.comm.comm import Comm
from hicache.comm.groups import Groups, Layout
from hicache.comm.records import Stats
from hicache.memory.events import EventLog
from hicache.memory.hashing import page_hashes
from hicache.memory.storage import make_storage
from hicache.model.gpu_model import GpuModel
from hicache.model.toy_model import Model
from hicache.serve.scheduler import Request, Scheduler
from hicache.serve.seam import CacheFactory
from hicache.spec.config import HiCacheConfig
from hicache.spec.shapes import get_shape


def setup_distributed(layout: Layout, device: torch.device, timeout_s: float,
                      data_backend: str | None = None) -> Groups:
    """Initialises the default (harness) group from the env:// variables and creates every
    system group. A no-op at world size 1. The data plane is NCCL on CUDA unless told
    otherwise (gloo: ranks sharing a GPU, where NCCL refuses to run)."""
    data_backend = data_backend or ("nccl" if device.type == "cuda" else "gloo")
    if layout.world_size > 1 and not dist.is_initialized():
        # The default group is gloo even on GPU nodes: it carries only harness objects.
        dist.init_process_group("gloo", rank=layout.rank, world_size=layout.world_size,
                                timeout=timedelta(seconds=timeout_s))
    return Groups(layout, data_backend, timeout_s)


def pick_device(kind: str, local_rank: int) -> torch.device:
    """Local rank r uses GPU r % GPUs: one GPU per rank, or shared when there are fewer."""
    if kind == "cuda":
        index = local_rank % torch.cuda.device_count()
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    return torch.device("cpu")


def make_model(cfg: HiCacheConfig, device: torch.device, comm: Comm, seed: int = 0):
    """The forward a step runs. CUDA with a model shape: `GpuModel`, real TP-sharded matmuls
    (2 x layers model all-reduces per forward at TP > 1). Otherwise the toy `Model` (CPU
    compute of `cfg.layers` small matmuls, `cfg.layers` all-reduces per forward)."""
    if device.type == "cuda" and cfg.model != "toy":
        return GpuModel(get_shape(cfg.model), cfg.tp, device, comm, seed)
    return Model(cfg.layers, cfg.hidden, cfg.allreduce_tokens, device, comm, seed)


class System:
    """One rank's system. The cache is built by `make_cache` (hicache.serve.seam): HiCache, or a
    second implementation behind the same seam; nothing here reaches past the seam."""

    def __init__(self, cfg: HiCacheConfig, layout: Layout, groups: Groups,
                 device: torch.device, seed: int = 0, make_cache: CacheFactory = HiCache):
        self.cfg, self.layout, self.groups = cfg, layout, groups
        self.stats = Stats(events=EventLog() if cfg.timeline else None)
        self.comm = Comm(layout, groups, self.stats.counter, cfg.collective_delay_ms)
        self.storage = make_storage(cfg.storage, layout.rank, layout.tp_rank)
        self.storage.paced = cfg.schedule != "pinned"  # pinned: modelled time is virtual
        # another writer's pages land at a scheduler step (TP rank 0 first, the others later)
        self.storage.land_step = cfg.land_step + (cfg.land_skew_steps if layout.tp_rank else 0)
        self.consensus = (ConsensusChecker(self.comm, cfg.consensus_interval_s)
                          if cfg.consensus_check else None)
        self.cache = make_cache(cfg, layout, self.comm, self.storage, device, self.stats,
                                self.consensus)
        self.model = make_model(cfg, device, self.comm, seed)
        self.scheduler = Scheduler(cfg, layout, self.comm, self.cache, self.model, self.stats,
                                   self.consensus)
        self._seq0 = groups.sequence_numbers()

    def populate(self, prompts: list[list[int]]) -> int:
        """Writes every full page of `prompts` to this rank's storage (KV and side-car)."""
        hashes = sorted({h for p in prompts for h in page_hashes(p, self.cfg.page_size)})
        self.storage.put(hashes, KV, self.cfg.kv_page_elems)
        if self.cfg.extra_pool:
            self.storage.put(hashes, SIDECAR, self.cfg.sidecar_page_elems)
        if self.cfg.hazard == "span_skew" and self.layout.pp_rank == 0:
            # Stage 0 cached the first half of each prefix already (an earlier request's
            # prefill chunks); the later stages, a micro-batch behind, have not yet.
            page = self.cfg.page_size
            self.cache.warm_host([p[: len(p) // (2 * page) * page] for p in prompts])
        return len(hashes)

    def run(self, requests: list[Request], step_base: int = 0) -> Stats:
        """Serves the requests (rank 0's list; other ranks pass []) and returns the stats;
        `steps_run` says how many scheduler steps it took."""
        self.cache.start()
        if self.consensus is not None:
            self.consensus.start()
        try:
            self.steps_run = self.scheduler.run(requests, step_base)
            self.cache.finish_pipeline()  # pr39903: the last step's agreement, in flight
        except BaseException:
            self._abandon()
            raise
        self._shutdown()
        return self.stats

    def _abandon(self) -> None:
        """After a failure: tell the threads to stop, wait for none of them. One may be
        blocked in a collective no other rank will join, and the error must reach the
        launcher now, not a collective timeout later (the threads are daemons)."""
        if self.consensus is not None:
            self.consensus.stop(0.0)
        self.cache.stop(0.0)

    def _shutdown(self) -> None:
        """After the last step: each thread gets up to the collective timeout to finish (a
        blocked collective has failed by then); a thread's error fails the run, since its
        collectives did not pair the same way on every rank."""
        grace_s = self.cfg.collective_timeout_s + 1.0
        self.comm.drain_sends()  # gloo's timeout bounds each wait
        if self.consensus is not None:
            self.consensus.stop(grace_s)
        self.cache.stop(grace_s)
        self.cache.settle()  # frees what outlived the last step; the self-checks
        if self.consensus is not None and self.consensus.error is not None:
            raise self.consensus.error
        error = self.cache.error()
        if error is not None:
            raise RuntimeError(f"rank {self.layout.rank}: background thread failed after the "
                               f"last step: {error}") from error

    def crosscheck(self) -> dict[str, tuple[int, int]]:
        """Per group: (ops our counter saw, ops torch's sequence number saw) since build."""
        now = self.groups.sequence_numbers()
        # the cache's own groups (made with it: counted from 0, as torch's numbers are)
        now.update({g: pg._get_sequence_number_for_group()
                    for g, pg in self.cache.own_groups.items() if pg is not None})
        counted = self.stats.counter.raw_by_group.copy()
        if self.cache.beside_counter is not None:  # a twin protocol's polls (hicache.cache.twin)
            counted.update(self.cache.beside_counter.raw_by_group)
        return {g: (counted.get(g, 0), now[g] - self._seq0.get(g, 0)) for g in now}

    def close(self) -> None:
        self.storage.close()
        self.cache.close()

