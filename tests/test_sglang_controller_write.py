"""SGLang 0.5.23's write path on the controller path (`bench run --cache sglang
--write-policy write_through`, sglang_adapter.controller.writes, docs/sglang.md "The write path on
the controller path"): SGLang's write-through acks, `writing_check`, `write_backup_storage`,
its backup thread and `_drain_backup` take the harness's host copies to storage, and what
they wrote is what the harness computed. Counts and correctness, never latencies.

In 0.5.23 the write path issues no collective of its own (both its counts, finished host
copies and backup acks, ride in `_sync_hicache_ready_counts`' packed per-step MIN), as the
project's model says (hicache.cache.tiers): per request it costs nothing, per step nothing
more.
"""

from __future__ import annotations

import os
import subprocess
import sys
import types
from pathlib import Path

import pandas as pd
import pytest
import torch

from hicache.cache.operations import KV
from hicache.memory.pools import PagePool, expected_rows
from hicache.memory.storage import StorageSpec, make_storage
from hicache.spec.cost_model import Setting, expected_per_request, per_step
from sglang_adapter.controller.stand_ins import Tier
from sglang_adapter.controller.writes import ControllerWrites
from tests.sglang_wheels import sglang_wheel

REPO = Path(__file__).resolve().parent.parent
PAGE_ELEMS = 8
# Frames of SGLang's write path: a collective under any of them would be the write path's.
WRITE_FRAMES = ("writing_check", "_finish_write_through_ack", "write_backup_storage",
                "backup_thread_func", "_page_backup", "_drain_backup")


def costs_no_write_collective(out: Path, tp: int, pp: int, release: str = "0.5.23") -> None:
    """A controller-path run's counts with the write path on: per request SGLang's
    hit-query and ack MINs as the model of its release prices them, none at a frame of the
    write path; per step the packed MIN beside the harness's agreement, nothing more."""
    protocol = f"sglang-{release}@unified"  # modelled by its release's model
    reqs = pd.read_csv(out / "requests.csv")
    for _, r in reqs.iterrows():
        hit_pages = r["hit_tokens"] // r["page_size"] if r["io_issued"] else 0
        want = expected_per_request(Setting(protocol, r["policy"], tp, pp), r["polls"], hit_pages,
                                    r["op_issued"], r["io_issued"], r["terminated_by"] == "poll")
        got = (r["decision_collectives"], r["completion_collectives"], r["pp_hops"],
               r["hit_query_collectives"], r["ack_collectives"])
        assert got == (want.decision, want.completion, want.pp_hops, want.hit_query,
                       want.ack), r["rid"]
        sites = str(r["call_sites"]) if pd.notna(r["call_sites"]) else ""
        assert not any(f in sites for f in WRITE_FRAMES), (r["rid"], sites)
    steps = pd.read_csv(out / "steps.csv")  # rank 0's (PP stage 0)
    tp_min, hops = per_step(protocol, tp, pp)
    # SGLang's check_hicache_events beside the harness's step agreement, which takes the
    # shape of the same release's model: each its MINs over the TP group (none at TP1), at
    # PP > 1 each relayed (_pp_sync's send); 0.5.23 reduces once a step, 0.5.19 at PP > 1
    # twice (its ready counts, then drain_storage_control_queues' queue sizes)
    assert (steps["per_step_min"] == 2 * tp_min).all()
    assert (steps["pp_hop"] == 2 * hops).all()


def _writes(storage) -> ControllerWrites:
    """A ControllerWrites with only what its storage check reads (no SGLang, no group)."""
    writes = object.__new__(ControllerWrites)
    writes.host = PagePool("host", 4, PAGE_ELEMS)
    writes.controller = types.SimpleNamespace(storage=storage)
    writes.tier = Tier(storage, KV, PAGE_ELEMS)
    return writes


@pytest.mark.parametrize("kind", ["sim", "file"])
def test_the_storage_check_finds_a_wrong_page_and_an_absent_one(kind, tmp_path):
    spec = StorageSpec(kind=kind, root=str(tmp_path) if kind == "file" else None)
    storage = make_storage(spec, rank=0, tp_rank=0)
    writes = _writes(storage)
    computed = expected_rows(["a", "b", "c"], 0, KV, PAGE_ELEMS)
    # SGLang's backup thread hands the backend a and b as computed (HarnessStorage.batch_set)
    writes.tier.record_write(["a", "b"], list(computed[:2]))
    storage.batch_set(["a", "b"], KV, computed[:2])
    assert writes._check(["a", "b"]) == (2, 0)
    assert writes._check(["a", "b", "c"]) == (2, 1)  # c never written
    # a backup of the wrong slot: b's name, a's page
    writes.tier.record_write(["b"], [computed[0]])
    storage.batch_set(["b"], KV, computed[:1])
    assert writes._check(["a", "b"]) == (2, 1)


def test_the_host_pool_serves_the_page_sglangs_backup_thread_reads():
    from sglang_adapter.controller.project_stand_ins import ProjectHostPool

    pool = PagePool("host", 4, PAGE_ELEMS)
    rows = expected_rows(["d", "e"], 0, KV, PAGE_ELEMS)
    pool.write([2, 3], rows)
    host = ProjectHostPool(pool, page_size=64)
    assert torch.equal(host.get_data_page(3 * 64), rows[1])  # slot 3's first token
    assert torch.equal(host.get_data_page(2 * 64 + 5), rows[0])


# 0.5.23 at TP2 in make test; PP > 1 and 0.5.19 in make sglang-check (a later stage pops
# stage 0's relayed counts of write acks and backup acks from its own queues; 0.5.19 locks
# through its embedded StreamingSession first).
LAYOUTS = [pytest.param(("0.5.23", 2, 1), id="tp2"),
           pytest.param(("0.5.23", 1, 2), marks=pytest.mark.sglang_matrix, id="tp1pp2"),
           pytest.param(("0.5.23", 2, 2), marks=pytest.mark.sglang_matrix, id="tp2pp2"),
           pytest.param(("0.5.19", 2, 2), marks=[pytest.mark.sglang_matrix, pytest.mark.slow],
                        id="0.5.19-tp2pp2")]


@pytest.fixture(scope="module", params=LAYOUTS)
def written(request, tmp_path_factory) -> tuple[Path, int, int, str]:
    """One serve on SGLang's controller path with write_through, at TP x PP."""
    release, tp, pp = request.param
    out = tmp_path_factory.mktemp("ctl_write") / "run"
    argv = ["--preset", "ci", "--requests", "4", "--bystanders", "2", "--output-tokens", "2",
            "--repeats", "1", "--seed", "3", "--schedule", "free", "--tp", str(tp), "--pp",
            str(pp),
            "--policies", "wait_complete", "--cache", "sglang",
            "--sglang", str(sglang_wheel(release)), "--sglang-path", "controller",
            "--write-policy", "write_through", "--out", str(out)]
    done = subprocess.run([sys.executable, "-m", "bench", "run", *argv], cwd=REPO,
                          capture_output=True, text=True, timeout=80,
                          env={**os.environ, "BENCH_NO_PLOTS": "1"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1].startswith("OK"), done.stdout[-2000:]
    return out, tp, pp, release


@pytest.mark.dist
@pytest.mark.timeout(120)
def test_sglangs_backups_write_what_the_harness_computed(written):
    out, tp, pp, _ = written
    ranks = pd.read_csv(out / "ranks.csv")
    assert len(ranks) == tp * pp
    assert (ranks["host_copy_pages"] > 0).all()
    # every host copy SGLang's writing_check acked went through its backup thread to
    # storage, was drained, and holds the computed KV (else data_ok is False below)
    assert (ranks["storage_write_pages"] == ranks["host_copy_pages"]).all()
    assert ranks["host_copy_pages"].nunique() == 1  # the ranks copied alike
    assert ranks["crosscheck_ok"].all() and (ranks["host_slots_unaccounted"] == 0).all()
    reqs = pd.read_csv(out / "requests.csv")
    assert reqs["data_ok"].all() and reqs["ranks_agree"].all()


@pytest.mark.dist
@pytest.mark.timeout(120)
def test_the_write_path_costs_no_collective_per_request_or_step(written):
    """Per request: SGLang's hit-query and ack MINs as the model prices them, none at a
    frame of the write path; per step: the packed MIN (write acks and backup acks in it)
    and the harness's agreement beside it, nothing more."""
    costs_no_write_collective(*written)
