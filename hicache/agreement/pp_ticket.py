"""SGLang 0.5.23's PP-ticket path (buffer_only host memory with PP > 1): how a ticket
reaches every PP stage and who holds its host memory (docs/releases.md).

Read in sglang 0.5.23, mem_cache/hybrid_cache/hybrid_cache_controller.py:
- PP stage 0 tickets a request (`submit_prefetch`); its command thread broadcasts the ticket
  down its TP column on a gloo group of its own (`pp_prefetch_command_thread_func`), and
  broadcasts an empty one when idle so the later stages' wait never times out;
- on every rank that thread then queries storage, cuts the hit to the free host memory, and
  itself allocates the host slots (`_allocate_pp_prefetch_buffers`; a hit below the
  threshold or that does not fit votes 0) before the hit MIN over TP then PP; the slots past
  the agreed hit are freed at once, and an agreed 0 marks the prefetch terminated; the IO
  thread reads it either way;
- the ack sync thread reduces its acks as for any prefetch but applies them itself, and the
  final ack makes the ticket ready (`prefetch_sync_thread_func`): nothing of it goes through
  the scheduler's per-step queue drain.

Runs on the prefetch thread, which owns `ticket` besides the hit-query groups.
"""

from __future__ import annotations

import queue

from hicache.comm.comm import TICKET, Comm
from hicache.memory.pools import PagePool

STOP = "stop"  # stage 0's last broadcast: the controller is stopping
TICKET_IDLE_S = 60.0  # SGLang's idle broadcast interval (hybrid_cache_controller.py:1307)


class TicketRelay:
    def __init__(self, comm: Comm, host_kv: PagePool, page_size: int, threshold: int,
                 idle_s: float):
        self.comm, self.host_kv, self.page_size = comm, host_kv, page_size
        self.threshold, self.idle_s = threshold, idle_s
        self.source = comm.layout.pp_rank == 0

    def next(self, ops: queue.Queue):
        """The next ticketed op, in stage 0's order; None after an idle broadcast; STOP."""
        if self.source:
            return self._send(ops)
        rid = self.comm.broadcast_object(None, TICKET, "ticket")  # blocks for stage 0's
        if rid is None or rid == STOP:
            return rid
        # This stage admitted the request in the same step (the request broadcast).
        op = ops.get(timeout=self.idle_s * 2)
        if op is None or op.rid != rid:
            raise RuntimeError(f"PP ticket order differs: stage 0 sent {rid}, this stage "
                               f"has {op.rid if op else None}")
        return op

    def _send(self, ops: queue.Queue):
        try:
            op = ops.get(timeout=self.idle_s)
        except queue.Empty:
            self.comm.broadcast_object(None, TICKET, "ticket")  # idle: keeps peers' wait short
            return None
        rid = STOP if op is None else op.rid
        self.comm.broadcast_object(rid, TICKET, "ticket", None if op is None else rid)
        return STOP if op is None else op

    def reserve(self, pages: int) -> list[int]:
        """Host slots for a hit of `pages`, cut to the free host memory; [] (a vote of 0)
        when what fits is below the threshold or the allocation fails."""
        pages = min(pages, self.host_kv.available)
        if pages == 0 or pages * self.page_size < self.threshold:
            return []
        return self.host_kv.alloc(pages) or []
