"""The controller's background threads in one process, with recorded collectives and reads:
which groups the hit query and the acks reduce over, which acks are reduced at all, the
order in which KV and side-car pages are read, and what a short read keeps.

SGLang source these follow (sgl-project/sglang): managers/cache_controller.py
(`_create_sync_groups`, `_all_reduce`, `_page_transfer`, `_page_transfer_kv_batch`,
`_reduce_prefetch_ack`) and mem_cache/hybrid_cache/hybrid_cache_controller.py
(`_page_transfer_sidecar`, `_reduce_prefetch_ack`) for the ack protocols; the pre-PR-#27010
`_page_transfer` (per-page progress, `mark_terminate` on a short batch) for pre27010.
"""

from __future__ import annotations

import queue
import time

import pytest

from hicache.cache.controller import CacheController, ControllerSettings
from hicache.cache.operations import KV, SIDECAR, PrefetchOp
from hicache.memory.pools import PagePool, verify_pages
from tests.doubles import RecordingComm, RecordingStorage, hashes_of, tokens

PS = 16  # tokens per page
PAGES = 256  # two 128-page read batches
ELEMS = 8


def _setup(uses_acks: bool, sidecar: bool = False, kv_holes=(), side_holes=(), on_read=None):
    hs = hashes_of(PAGES, PS)
    storage = RecordingStorage(hs, on_read)
    # A hole is stored only under the other pool: the hit query (any pool) still counts it.
    storage.put([h for i, h in enumerate(hs) if i not in kv_holes], KV, ELEMS)
    storage.put([h for i, h in enumerate(hs) if i in kv_holes or (sidecar and i not in
                                                                  side_holes)], SIDECAR, ELEMS)
    host_kv = PagePool(KV, PAGES + 8, ELEMS)
    host_side = PagePool(SIDECAR, PAGES + 8, ELEMS) if sidecar else None
    comm = RecordingComm()
    ctrl = CacheController(comm, storage, host_kv, host_side, ControllerSettings(PS, uses_acks))
    op = PrefetchOp("r0", tokens(PAGES, PS), None, time.monotonic(), 0.0, page_size=PS)
    op.hashes = op.hash_value = hs
    op.host_slots = host_kv.alloc(PAGES)
    return ctrl, storage, comm, op


def _run_io(ctrl: CacheController, op: PrefetchOp) -> list:
    """Runs one op's IO through the threads; returns the acks the scheduler would drain."""
    ctrl.start()
    ctrl.io_queue.put(op)
    assert op.io_done.wait(10), "IO never finished"
    ctrl.stop(5.0)  # in pipeline order: every ack is synced before the ack thread ends
    assert ctrl.error is None, ctrl.error
    acks = []
    while True:
        try:
            acks.append(ctrl.synced_acks.get_nowait())
        except queue.Empty:
            return acks


def _batch_tokens(acks) -> list:
    """Cumulative completed tokens of the per-batch acks, in order."""
    return [a.tokens for a in acks if not a.final and a.tokens is not None]


def _ack_groups(comm: RecordingComm) -> list[str]:
    return [g for g, site in comm.calls if site == "ack"]


# ---- background groups: TP and PP for the ack protocols, TP only before ------------------

@pytest.mark.parametrize("uses_acks", [True, False], ids=["ack-protocols", "pre27010"])
def test_hit_query_reduces_over_tp_then_pp_for_ack_protocols(uses_acks):
    ctrl, _, comm, op = _setup(uses_acks)
    ctrl.start()
    ctrl.prefetch_queue.put(op)
    assert ctrl.hit_queue.get(timeout=10) is op
    ctrl.stop(5.0)
    want = ["prefetch", "prefetch_pp"] if uses_acks else ["prefetch"]
    assert [g for g, site in comm.calls if site == "hit_query"] == want


# ---- acks: one reduced per batch; the final one costs nothing ----------------------------

def test_only_per_batch_acks_are_reduced():
    ctrl, _, comm, op = _setup(uses_acks=True)
    acks = _run_io(ctrl, op)
    assert _batch_tokens(acks) == [128 * PS, 256 * PS]
    assert acks[-1].final and acks[-1].tokens is None  # delivered last, carries nothing
    # One reduction per batch, each over TP then PP; none for the final ack.
    assert _ack_groups(comm) == ["ack", "ack_pp"] * 2


def test_pre27010_publishes_progress_rank_locally():
    ctrl, _, comm, op = _setup(uses_acks=False)
    assert _run_io(ctrl, op) == []
    assert op.completed_tokens == PAGES * PS and not op.terminated.is_set()
    assert _ack_groups(comm) == []


# ---- per-page reads: a short read keeps its leading pages and ends the IO ----------------

def test_missing_page_keeps_the_pages_before_it_and_skips_later_batches():
    ctrl, storage, comm, op = _setup(uses_acks=True, kv_holes={1})
    acks = _run_io(ctrl, op)
    assert storage.reads == [(KV, 0)]  # the second batch is never read
    # Every batch still acks (ranks pair their acks), with the page that landed.
    assert _batch_tokens(acks) == [PS, PS]
    assert op.io_error is not None
    # Ack protocols do not raise the shared `terminated` flag from the IO thread: pr36425
    # and the step protocols read it without a collective, so it must change on all ranks
    # at once (a poll, agreed); the agreed final ack ends the op (SGLang: `all_success`).
    assert not op.terminated.is_set()
    assert verify_pages(ctrl.host_kv, op.host_slots[:1], op.hash_value[:1], 0) == 0


def test_pre27010_short_read_keeps_its_pages_and_marks_the_op_terminated():
    ctrl, storage, _, op = _setup(uses_acks=False, kv_holes={1})
    _run_io(ctrl, op)
    assert storage.reads == [(KV, 0)]
    assert op.completed_tokens == PS  # rank-local progress counts the page that landed
    assert op.terminated.is_set()  # SGLang's mark_terminate: the poll's MAX sees it


def test_short_read_in_the_second_batch_keeps_the_first_batch_and_its_head():
    ctrl, _, _, op = _setup(uses_acks=True, kv_holes={200})
    acks = _run_io(ctrl, op)
    assert _batch_tokens(acks) == [128 * PS, 200 * PS]


# ---- extra pools --------------------------------------------------------------------------

def test_ack_protocols_read_the_sidecar_with_each_batch():
    """Newest source: a KV-derived side-car (the indexer) is read per batch, right after
    that batch's KV pages, and the batch counts min(KV, side-car) leading pages; one
    extra-pool ack (reduced) follows the batches."""
    ctrl, storage, comm, op = _setup(uses_acks=True, sidecar=True)
    acks = _run_io(ctrl, op)
    assert storage.reads == [(KV, 0), (SIDECAR, 0), (KV, 128), (SIDECAR, 128)]
    assert _batch_tokens(acks) == [128 * PS, 256 * PS]
    assert _ack_groups(comm) == ["ack", "ack_pp"] * 3  # two batches + the extra-pool ack
    assert acks[-1].final


def test_ack_protocols_cut_short_keep_whole_batches_with_their_sidecar():
    """Stopped while the first batch's side-car pages are read: that batch is kept (KV and
    side-car both landed), the second batch is never read."""
    def stop_during_first_sidecar_read(pool, at):
        if pool == SIDECAR and at == 0:
            op.terminated.set()

    ctrl, storage, _, op = _setup(uses_acks=True, sidecar=True,
                                  on_read=stop_during_first_sidecar_read)
    acks = _run_io(ctrl, op)
    assert storage.reads == [(KV, 0), (SIDECAR, 0)]
    assert _batch_tokens(acks) == [128 * PS, 128 * PS]


def test_ack_protocols_sidecar_hole_clamps_the_batch():
    ctrl, storage, _, op = _setup(uses_acks=True, sidecar=True, side_holes={130})
    acks = _run_io(ctrl, op)
    assert _batch_tokens(acks) == [128 * PS, 130 * PS]


def test_pre27010_reads_the_sidecar_after_every_kv_page():
    """pre27010 keeps the older order (side-car after all KV pages, pool_transfers_done
    only then): the window PR #27550's guard closes."""
    ctrl, storage, _, op = _setup(uses_acks=False, sidecar=True)
    _run_io(ctrl, op)
    assert storage.reads == [(KV, 0), (KV, 128), (SIDECAR, 0), (SIDECAR, 128)]
    assert op.sidecar_pages == PAGES and op.pool_transfers_done
