"""The real `hicache.comm.comm.Comm` at PP > 1 on two gloo ranks (TP1 x PP2), in the fast tier.

The one-process tests use `tests.doubles.RecordingComm`, whose TP-then-PP reduction is a
stand-in; this file runs the real one. Stage 0's value must reach stage 1 unchanged (stage 1
adopts it, whatever its own), each hop is one counted point-to-point op on each side (a
send on stage 0, a recv on stage 1), a background reduction spans the PP group too, and our
counter equals torch's sequence numbers on every group. A short collective timeout turns a
hop that one side drops into an error within seconds, not a hang.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from hicache.comm.comm import DECISION, HIT_QUERY, CollectiveCounter, Comm
from hicache.comm.groups import HIT_GROUPS, Layout
from hicache.serve.system import setup_distributed
from tests.helpers import launch

pytestmark = pytest.mark.dist

TIMEOUT_S = 5.0  # collective timeout: a dropped hop fails the probe instead of hanging it
STAGE_VALUES = ([3, 7], [1, 9])  # stage 0's and stage 1's own values: MIN would give [1, 7]


def _probe(rank: int, world: int) -> dict:
    torch.set_num_threads(1)
    layout = Layout(rank, 1, world)
    groups = setup_distributed(layout, torch.device("cpu"), TIMEOUT_S)
    seq0 = groups.sequence_numbers()
    comm = Comm(layout, groups, CollectiveCounter())
    hop = torch.tensor(STAGE_VALUES[layout.pp_rank], dtype=torch.int64)
    comm.reduce_tp_then_pp(hop, dist.ReduceOp.MIN, DECISION, "r0")
    comm.drain_sends()
    hit = torch.tensor([4 if layout.pp_rank == 0 else 2], dtype=torch.int64)
    comm.all_reduce_groups(hit, dist.ReduceOp.MIN, HIT_GROUPS, HIT_QUERY, "r0")
    seq = groups.sequence_numbers()
    counter = comm.counter
    return {"hop": hop.tolist(), "hit": hit.tolist(), "by_site": dict(counter.by_site),
            "by_rid": dict(counter.by_rid["r0"]), "raw": dict(counter.raw_by_group),
            "seq": {g: seq[g] - seq0[g] for g in seq}}


@pytest.fixture(scope="module")
def probe():
    return launch(2, _probe, timeout_s=60)


@pytest.mark.timeout(90)
def test_stage_one_adopts_stage_zeros_value(probe):
    assert [r["hop"] for r in probe] == [STAGE_VALUES[0], STAGE_VALUES[0]]


@pytest.mark.timeout(90)
def test_each_side_of_the_hop_is_one_counted_op(probe):
    """TP1: no TP all-reduce at the decision site, one hop (send / recv) per rank, and the
    hit query's MIN once, on the PP group (its TP group has one rank)."""
    for res in probe:
        assert res["by_site"] == {"pp_hop": 1, "hit_query": 1}
        assert res["by_rid"] == {"pp_hop": 1, "hit_query": 1}
        assert res["raw"] == {"pp_cpu": 1, "prefetch_pp": 1}


@pytest.mark.timeout(90)
def test_background_reduction_spans_the_pp_group(probe):
    assert [r["hit"] for r in probe] == [[2], [2]]


@pytest.mark.timeout(90)
def test_counter_equals_torch_sequence_numbers(probe):
    for rank, res in enumerate(probe):
        for group, ops in res["seq"].items():
            assert res["raw"].get(group, 0) == ops, (rank, group, res["raw"], res["seq"])
