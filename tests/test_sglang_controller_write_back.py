"""SGLang 0.5.23's write_back on the controller path (`bench run --cache sglang
--write-policy write_back`, sglang_adapter.controller.writes, docs/sglang.md "The write path on the
controller path"): a device leaf with no host copy is copied as the harness's device
eviction takes it, then SGLang's own `_track_write_through_node` (no lock),
`writing_check(write_back=True)`, `write_backup_storage`, its backup thread and
`_drain_backup` take it to storage, and what they wrote is what the harness computed.
Counts and correctness, never latencies.

`writing_check(write_back=True)` waits for every ack itself and issues no collective; the
backup acks ride in the packed per-step MIN as under write_through: per request the write
path costs nothing, per step nothing more.
"""

from __future__ import annotations

import os
import subprocess
import sys
import types
from pathlib import Path

import pandas as pd
import pytest

from sglang_adapter.controller.writes import ControllerWrites
from sglang_adapter.target import Target, pick_path, run_unfit
from tests.sglang_wheels import sglang_wheel
from tests.test_sglang_controller_write import costs_no_write_collective
from tests.test_tiers import _prompt, _tiers

REPO = Path(__file__).resolve().parent.parent
UNIFIED = Target("/nowhere", "0.5.23", "0.5.23", "unified", "sglang-0.5.23")


class _SGLang:
    """What ControllerWrites calls on SGLang's cache, recorded in order (a test double)."""

    def __init__(self, writes: list):
        self.calls, self.writes = [], writes
        self.tree_core = types.SimpleNamespace()
        self.cache_controller = types.SimpleNamespace(write_policy="write_through",
                                                      ack_write_queue=[])
        self.is_write_back = False
        self.ongoing_write_through = {}

    def inc_lock_ref(self, node_id):
        self.calls.append(("inc_lock_ref", node_id))

    def _track_write_through_node(self, node_id, lock, publish_node_ids):
        self.calls.append(("track", node_id, lock, publish_node_ids))

    def writing_check(self, write_back=False):
        """Which copies are still on the device when it runs (their leaf not demoted)."""
        on_device = [i for i, (node, _, _) in self.writes[0].backups.items()
                     if node.dev is not None]
        self.calls.append(("writing_check", write_back, on_device))


class _SGLang0519(_SGLang):
    """0.5.19's `_track_write_through_node`: one node, no nodes to publish."""

    def _track_write_through_node(self, node_id, lock_params):
        self.calls.append(("track", node_id, lock_params, None))


def _adopted(sglang=_SGLang):
    tiers, _ = _tiers("write_back", dev_pages=2)
    box: list = []
    sgl = sglang(box)
    writes = ControllerWrites.adopt(tiers, sgl, tier=None, ack_class=types.SimpleNamespace,
                                    stats=None)
    box.append(writes)
    return writes, sgl


def _cache(writes: ControllerWrites, rid: str, tokens: list[int]) -> None:
    """One prefill placed and cached as the harness's cache does (no load-back here)."""
    m = writes.tree.match(tokens)
    dev, hit, _ = writes.place(tokens, m)
    writes.writer = rid
    writes.cache_prefill(tokens, writes.computed(tokens, m, dev, hit), dev, hit)
    writes.writer = None


def test_an_evicted_leaf_goes_to_sglangs_write_back_path_before_it_is_demoted():
    writes, sgl = _adopted()
    # as SGLang's __init__ reads it off its controller
    assert sgl.cache_controller.write_policy == "write_back" and sgl.is_write_back
    _cache(writes, "a", _prompt(1, 2))
    assert sgl.calls == []  # write_back copies nothing at prefill
    _cache(writes, "b", _prompt(2, 2))  # evicts a's leaf: copied, then handed to SGLang
    # no inc_lock_ref (lock_params None), tracked, then writing_check(write_back=True) while
    # the leaf is still on the device (the eviction loop's), then _evict's after the pass
    assert sgl.calls == [("track", 1, None, [1]), ("writing_check", True, [1]),
                         ("writing_check", True, [])]
    ack, = sgl.cache_controller.ack_write_queue  # as start_writing posts it: finished
    assert ack.node_ids == [1] and ack.finish_event.query() and ack.num_tokens == 2 * 4
    node, op, rid = writes.backups[1]
    assert rid == "a" and len(op.slots) == 2 and writes.host_copied_pages == 2
    assert writes.backups_in_flight == 0  # SGLang's write_backup_storage pins it, not this


@pytest.mark.parametrize("sglang, published", [(_SGLang, [1]), (_SGLang0519, None)])
def test_a_copy_is_tracked_as_the_release_defines_the_call(sglang, published):
    """0.5.23 names the nodes the ack publishes; 0.5.19 takes the node alone (it refused
    the keyword: write_back on 0.5.19's controller path failed at the first eviction)."""
    writes, sgl = _adopted(sglang)
    _cache(writes, "a", _prompt(1, 2))
    _cache(writes, "b", _prompt(2, 2))
    assert sgl.calls[0] == ("track", 1, None, published)


def test_write_through_still_locks_and_leaves_the_ack_to_the_per_step_min():
    writes, sgl = _adopted()
    writes.policy = sgl.cache_controller.write_policy = "write_through"
    sgl.inc_lock_ref = lambda node_id: types.SimpleNamespace(to_dec_params=lambda: "lock")
    _cache(writes, "a", _prompt(1, 2))
    assert sgl.calls == [("track", 1, "lock", [1])]  # no writing_check: the step's MIN acks


def test_the_controller_path_serves_write_back_but_not_buffer_only():
    """write_back is served, auto takes the controller path for it (no longer the decisions
    path); buffer_only stays refused with it (tests/test_sglang_controller_pp.py has the
    refusals' table)."""
    system = {"write_policy": "write_back"}
    assert run_unfit(1, system) is None
    assert pick_path(UNIFIED, None, 1, system).controller
    buffer_only = {**system, "host_memory": "buffer_only"}
    assert not pick_path(UNIFIED, None, 1, buffer_only).controller


# TP2 in make test; PP > 1 and 0.5.19 (TP2 x PP2) in make sglang-check.
LAYOUTS = [pytest.param(("0.5.23", 2, 1), id="tp2"),
           pytest.param(("0.5.23", 1, 2), marks=pytest.mark.sglang_matrix, id="tp1pp2"),
           pytest.param(("0.5.19", 2, 2), marks=[pytest.mark.sglang_matrix, pytest.mark.slow],
                        id="0.5.19-tp2pp2")]


@pytest.fixture(scope="module", params=LAYOUTS)
def written_back(request, tmp_path_factory) -> tuple[Path, int, int, str]:
    """One serve on SGLang 0.5.23's controller path with write_back, at TP x PP, on a device
    pool of 51 pages (--kv-budget-gib 0.2 of llama3-8b's 4 MiB pages at TP2), which the
    serve's prompts overflow: leaves are evicted, and copied on the way."""
    release, tp, pp = request.param
    out = tmp_path_factory.mktemp("ctl_write_back") / "run"
    argv = ["--preset", "ci", "--requests", "4", "--bystanders", "2", "--output-tokens", "2",
            "--repeats", "1", "--seed", "3", "--schedule", "free", "--tp", str(tp), "--pp",
            str(pp), "--policies", "wait_complete", "--cache", "sglang",
            "--sglang", str(sglang_wheel(release)), "--sglang-path", "controller",
            "--write-policy", "write_back", "--kv-budget-gib", "0.2", "--out", str(out)]
    done = subprocess.run([sys.executable, "-m", "bench", "run", *argv], cwd=REPO,
                          capture_output=True, text=True, timeout=80,
                          env={**os.environ, "BENCH_NO_PLOTS": "1"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1].startswith("OK"), done.stdout[-2000:]
    return out, tp, pp, release


@pytest.mark.long  # make test-long: SGLang's write-back at each layout
@pytest.mark.dist
@pytest.mark.timeout(120)
def test_sglangs_write_back_writes_what_the_harness_computed(written_back):
    out, tp, pp, _ = written_back
    ranks = pd.read_csv(out / "ranks.csv")
    assert len(ranks) == tp * pp and (ranks["write_policy"] == "write_back").all()
    assert (ranks["device_evicted_pages"] > 0).all() and (ranks["host_copy_pages"] > 0).all()
    # every leaf copied on eviction went through SGLang's writing_check(write_back=True),
    # write_backup_storage and backup thread to storage, was drained by _drain_backup and
    # holds the computed KV (else data_ok is False below)
    assert (ranks["storage_write_pages"] == ranks["host_copy_pages"]).all()
    assert ranks["host_copy_pages"].nunique() == 1  # the ranks evicted and copied alike
    assert ranks["crosscheck_ok"].all() and (ranks["host_slots_unaccounted"] == 0).all()
    assert (ranks["device_slots_unaccounted"] == 0).all()
    reqs = pd.read_csv(out / "requests.csv")
    assert reqs["data_ok"].all() and reqs["ranks_agree"].all()


@pytest.mark.long  # make test-long: the same write-back serves
@pytest.mark.dist
@pytest.mark.timeout(120)
def test_write_back_costs_no_collective_per_eviction_request_or_step(written_back):
    """Per request: SGLang's hit-query and ack MINs as the model prices them, none at a
    frame of the write path (writing_check(write_back=True) waits for its acks, it does not
    reduce a count); per step: the packed MIN and the harness's agreement, nothing more."""
    costs_no_write_collective(*written_back)
