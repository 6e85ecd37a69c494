"""Pinned schedules (hicache.spec.pinned): the schedule is a function of the seed alone.

The pure tests replay the IO queue on the virtual clock. The distributed ones serve on real
gloo groups while the real threads are slowed at random (a different delay every run):
under a pinned schedule that must change nothing the schedule digest sees, and protocols
that decide alike (bench.verdict.schedule_digests) must run one schedule. A wall-clock read
planted in one decision (IO completion) must make the digest check fail. The count
contract and the independent counter of test_counts hold under pinned schedules too.
"""

from __future__ import annotations

import hashlib
import random
import time

import pytest

from bench.verdict.schedule_digests import DECIDE_ALIKE, digest_failures
from hicache.cache.operations import PrefetchOp
from hicache.memory.storage import SimStorage, StorageSpec
from hicache.spec.config import HiCacheConfig
from hicache.spec.cost_model import POLICIES, PROTOCOLS
from hicache.spec.pinned import VirtualIO
from hicache.spec.step_time import StepTimeModel
from tests.helpers import case, run_cases
from tests.test_counts import FAST_TIMEOUT, N_REQUESTS, PREFIX, STORAGE, _check_layout

STEP = StepTimeModel(prefill_base_ms=3.0, prefill_ms_per_token=0.001, decode_base_ms=3.0,
                     decode_ms_per_ktoken=0.1)
PINNED = {"schedule": "pinned", "step_time": STEP, "tp": 2}
JITTER = {**STORAGE, "jitter": 0.8}
ALIKE = sorted({p for group in DECIDE_ALIKE.values() for g in group for p in g})


# ---- pure: the IO queue on the virtual clock ----------------------------------------------

def _op(rid: str, pages: int, stamp: float = 0.0) -> PrefetchOp:
    op = PrefetchOp(rid, [0] * (pages * 64), None, 0.0, stamp)
    op.hash_value = [hashlib.sha256(f"{rid}-{i}".encode()).hexdigest() for i in range(pages)]
    return op


def _replay(storage: SimStorage, ops: list[PrefetchOp]) -> VirtualIO:
    io = VirtualIO(64, uses_acks=True)
    for op in ops:
        storage.put(op.hash_value, "kv", 128)
        plans = [storage.plan_read(op.hash_value[i: i + 128], "kv", 128)
                 for i in range(0, len(op.hash_value), 128)]
        io.submit(op, op.start_stamp, plans)
    return io


def test_jitter_makes_ranks_see_different_progress():
    """Same op, same virtual time: the slower rank's read is still pending."""
    spec = StorageSpec(latency_ms=10.0, jitter=1.0, seed=3)

    def acks(rank: int, now: float) -> list[float]:
        io = _replay(SimStorage(spec, rank, rank), [_op("a", 4)])  # fresh draws
        return [e.due for e in io.advance(now) if e.kind == "ack"]

    ends = [acks(r, 1.0)[0] for r in range(2)]  # every batch ended before 1 s
    assert ends[0] != ends[1]
    between = sum(ends) / 2
    seen = [len(acks(r, between)) for r in range(2)]
    assert sorted(seen) == [0, 1] and seen[ends.index(min(ends))] == 1, (ends, seen)


def test_a_poll_stops_the_reads_at_the_next_batch_on_the_virtual_clock():
    storage = SimStorage(StorageSpec(latency_ms=10.0), 0, 0)
    a, b = _op("a", 300), _op("b", 8)  # a: three batches
    io = _replay(storage, [a, b])
    first = storage.plan_read(a.hash_value[:128], "kv", 128).seconds
    events = io.advance(first / 2)
    assert events == []  # nothing has completed yet
    a.terminated_v = first / 2  # a poll ends it while its first batch is read
    events = io.advance(10.0)
    acks_a = [e.due for e in events if e.op is a]
    # the first batch completes; the other two and the final ack come at once, unread
    assert acks_a == pytest.approx([first] * 4)
    b_end = [e.due for e in events if e.op is b][-1]
    assert b_end == pytest.approx(first + 0.010, rel=0.01)  # b starts when a stopped


def test_bad_schedule_and_combinations_it_cannot_pin():
    with pytest.raises(ValueError, match="unknown schedule"):
        HiCacheConfig(schedule="fixed")
    with pytest.raises(ValueError, match="modelled forward"):
        HiCacheConfig(schedule="pinned")
    with pytest.raises(ValueError, match="write path"):
        HiCacheConfig(schedule="pinned", step_time=STEP, write_policy="write_through")


# ---- on real gloo groups --------------------------------------------------------------------

def slow_threads(system, rank: int) -> None:
    """Real delays only, different every run: the threads finish at random times."""
    rng = random.Random(time.perf_counter_ns())
    storage = system.storage
    for name in ("batch_get", "batch_exists"):
        real = getattr(storage, name)

        def slowed(*args, _real=real, **kw):
            time.sleep(rng.uniform(0.0, 0.02))
            return _real(*args, **kw)
        setattr(storage, name, slowed)


def slow_threads_and_wall_clock_acks(system, rank: int) -> None:
    """The planted bug: acks visible when really there (a wall-clock read), not when
    their virtual time has passed."""
    slow_threads(system, rank)
    pin = system.cache.pin
    pin.visible_acks = lambda: pin.synced_acks.qsize()


def _pinned_case(proto: str, policy: str, patch: str, **kw) -> dict:
    return case({**PINNED, "protocol": proto, "policy": policy, "timeout_base_s": 0.03,
                 "timeout_per_ki_token_s": 0.0, **kw}, JITTER, n=6, prefix_tokens=512,
                new_tokens=64, gap_s=0.004, patch=f"tests.test_pinned:{patch}")


def _rows(results, runs) -> list[dict]:
    return [{"protocol": p, "policy": q, "repeat": 0, "run": run,
             "schedule_digest": res[0]["steps"][-1]["schedule_digest"]}
            for (p, q, run), res in zip(runs, results, strict=True)]


@pytest.fixture(scope="module")
def pinned_runs():
    runs = [(p, q, run) for run in range(2) for q in POLICIES for p in ALIKE]
    runs += [("pr27010", "wait_complete", run) for run in range(2, 4)]
    cases = [_pinned_case(p, q, "slow_threads") for p, q, _ in runs[:-2]]
    cases += [_pinned_case(p, q, "slow_threads_and_wall_clock_acks") for p, q, _ in runs[-2:]]
    return runs, run_cases(2, cases, timeout_s=240)


@pytest.mark.dist
@pytest.mark.timeout(300)
def test_pinned_digest_is_one_schedule_per_seed_and_per_decide_alike_group(pinned_runs):
    runs, results = pinned_runs
    rows = _rows(results, runs)
    honest = [r for r in rows if r["run"] < 2]
    for run in (0, 1):
        assert digest_failures([r for r in honest if r["run"] == run], "pinned") == []
    by_run = [{(r["protocol"], r["policy"]): r["schedule_digest"] for r in honest
               if r["run"] == run} for run in (0, 1)]
    assert by_run[0] == by_run[1]  # randomly slowed threads, one schedule
    for res in results:  # every rank ran the same schedule
        assert res[0]["steps"][-1]["schedule_digest"] == res[1]["steps"][-1]["schedule_digest"]


@pytest.mark.dist
@pytest.mark.timeout(300)
def test_a_planted_wall_clock_read_fails_the_digest_check(pinned_runs):
    runs, results = pinned_runs
    planted = [r for r in _rows(results, runs) if r["run"] >= 2]
    honest = [r for r in _rows(results, runs) if r["run"] == 0 and
              (r["protocol"], r["policy"]) == ("pr27010", "wait_complete")]
    digests = {r["schedule_digest"] for r in planted + honest}
    assert len(digests) > 1, "a wall-clock ack went unnoticed"


@pytest.mark.dist
@pytest.mark.timeout(300)
def test_the_decision_waits_for_the_rank_whose_read_ends_later(pinned_runs):
    """Jitter under pinned: ranks end their reads at different virtual times, and the
    wait_complete decision comes only after the later one, with polls in between."""
    runs, results = pinned_runs
    res = results[runs.index(("pr36425", "wait_complete", 0))]
    split = 0
    for row0, row1 in zip(res[0]["rows"], res[1]["rows"], strict=True):
        ends = (row0["io_done_vt"], row1["io_done_vt"])
        if None in ends or row0["terminated_by"] != "ack":
            continue
        assert row0["ready_vt"] > max(ends) and row1["ready_vt"] == row0["ready_vt"]
        split += ends[0] != ends[1]
    assert split > 0, "jitter made no rank's read end later"


# Every protocol under the short timeout, and each under one of the three policies in turn:
# every protocol, every policy and the clock-decided path in the fast tier. The other
# protocol x policy pairs are the slow tier's: the same checks, 18 more serves on the
# virtual clock (about a minute on a shared 2-core machine).
PINNED_VARIANTS = [(p, q, "") for p in PROTOCOLS for q in POLICIES]
PINNED_VARIANTS += [(p, "timeout", "fast") for p in PROTOCOLS]
PINNED_FAST = [(p, POLICIES[i % len(POLICIES)], "") for i, p in enumerate(PROTOCOLS)]
PINNED_FAST += [(p, "timeout", "fast") for p in PROTOCOLS]
PINNED_SLOW = [v for v in PINNED_VARIANTS if v not in PINNED_FAST]


def _pinned_counts(variants: list) -> dict:
    cases = [case({"protocol": p, "policy": q, **PINNED,
                   **(FAST_TIMEOUT if v else {})}, STORAGE, n=N_REQUESTS,
                  prefix_tokens=PREFIX, new_tokens=64) for p, q, v in variants]
    results = run_cases(2, cases, timeout_s=200, flight_recorder=True)
    return dict(zip(variants, results, strict=True))


@pytest.fixture(scope="module")
def pinned_counts():
    return _pinned_counts(PINNED_FAST)


@pytest.fixture(scope="module")
def pinned_counts_slow():
    return _pinned_counts(PINNED_SLOW)


@pytest.mark.dist
@pytest.mark.timeout(250)
def test_count_contract_and_counter_hold_under_pinned(pinned_counts):
    for variant in pinned_counts:
        _check_layout(pinned_counts, variant, 2, 1)


@pytest.mark.long  # make test-long: the other protocol pairs pinned, beside the first pair's test
@pytest.mark.slow
@pytest.mark.dist
@pytest.mark.timeout(250)
def test_count_contract_holds_under_pinned_for_the_other_pairs(pinned_counts_slow):
    assert sorted(PINNED_FAST + PINNED_SLOW) == sorted(PINNED_VARIANTS)
    for variant in pinned_counts_slow:
        _check_layout(pinned_counts_slow, variant, 2, 1)


# ---- the harness: flag, digest judging -----------------------------------------------------

@pytest.mark.parametrize("argv, says", [
    (["--schedule", "fixed"], "invalid choice: 'fixed'"),
    (["--schedule", "pinned", "--gpu", "none"], "needs a modelled forward time"),
    (["--schedule", "pinned", "--extra-pool"], "side-car"),
    (["--schedule", "pinned", "--preset", "trace"], "write path"),
])
def test_bad_schedule_input_is_one_line_and_exit_2(argv, says, tmp_path, capsys):
    from bench.commands.run import main

    assert main([*argv, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and says in err, err


def test_presets_pin_where_they_can_and_flags_choose():
    from bench.commands.run import build_plan, parser

    def schedule(*argv):
        return build_plan(parser().parse_args(list(argv))).schedule

    # make bench (default) measures end to end: free; the cost decomposition is pinned.
    assert schedule() == schedule("--preset", "sweep") == "free"
    assert schedule("--preset", "cost") == schedule("--preset", "queue") == \
        schedule("--preset", "ci") == "pinned"
    assert schedule("--schedule", "pinned") == "pinned"
    assert schedule("--preset", "cost", "--schedule", "free") == "free"
    # a preset's pinning yields to what cannot be pinned
    assert schedule("--preset", "cost", "--gpu", "none") == "free"
    assert schedule("--preset", "sweep", "--schedule", "pinned") == "pinned"


def _serves(digests: dict, schedule: str = "pinned") -> list[dict]:
    return [{"protocol": p, "policy": q, "rate_rps": 16.0, "repeat": 0, "schedule": schedule,
             "schedule_digest": d} for (p, q), d in digests.items()]


def test_digest_check_fails_decide_alike_protocols_that_differ_only_when_pinned():
    alike = {("pr27010", "wait_complete"): "a", ("pr36425", "wait_complete"): "a",
             ("step-clock", "wait_complete"): "a", ("pre27010", "wait_complete"): "b"}
    assert digest_failures(_serves(alike), "pinned") == []  # pre27010 decides otherwise
    split = {**alike, ("step-clock", "wait_complete"): "c"}
    (line,) = digest_failures(_serves(split), "pinned")
    assert "step-clock c" in line and "wait_complete" in line
    assert digest_failures(_serves(split, "free"), "free") == []  # reported, not judged


def test_same_repeat_seeds_judge_every_repeat_of_a_protocol_alike():
    """Under --repeat-seeds same every repeat replays one seed: repeat 1 of pr27010 must
    have repeat 0's digest; with distinct seeds repeats are never compared."""
    rows = [{"protocol": p, "policy": "timeout", "rate_rps": 16.0, "repeat": rep,
             "schedule_digest": d} for p in ("pr27010", "pr36425")
            for rep, d in ((0, "a"), (1, "a" if p == "pr27010" else "z"))]
    (line,) = digest_failures(rows, "pinned", same_seed=True)
    assert "every repeat replays one seed" in line and "pr36425 repeat 1 z" in line
    assert len(digest_failures(rows, "pinned")) == 1  # repeat 1's pair differs in itself
    rows[1]["schedule_digest"] = "z"  # repeat 1: both z, repeat 0: both a
    assert digest_failures(rows, "pinned") == []  # distinct seeds: repeats not compared
    assert digest_failures(rows, "pinned", same_seed=True)  # one seed: they are


def test_repeat_seeds_option_sets_every_repeats_seed():
    from bench.commands.run import build_plan, parser

    def seeds(*argv):
        plan = build_plan(parser().parse_args(list(argv)))
        return plan.repeat_seeds, sorted({plan.repeat_seed(c) for c in plan.cells()})

    assert seeds() == ("same", [0])  # make bench: twenty serves of one workload
    assert seeds("--preset", "cost") == ("same", [0])  # six replays of one pinned schedule
    assert seeds("--seed", "2") == ("same", [2000])
    assert seeds("--preset", "cost", "--repeat-seeds", "distinct") == (None, [0, 1, 2, 3, 4, 5])
    assert seeds("--preset", "sweep")[0] is None
    assert seeds("--preset", "ci")[0] is None  # one repeat: the gate's baseline plan
    assert seeds("--preset", "sweep", "--repeat-seeds", "same") == ("same", [0])


def test_verdict_fails_a_pinned_run_whose_alike_protocols_differ():
    import pandas as pd

    from bench.verdict.run_rules import schedule_failures

    split = {("pr27010", "timeout"): "a", ("pr36425", "timeout"): "b"}
    rows = pd.DataFrame(_serves(split) * 3)  # three requests per serve
    assert len(schedule_failures(rows)) == 1
    assert schedule_failures(pd.DataFrame(_serves(split, "free"))) == []


def test_two_runs_of_one_seed_must_share_every_digest():
    from bench.verdict.schedule_digests import repeat_failures

    a = _serves({("pr27010", "timeout"): "a", ("pr36425", "timeout"): "a"})
    b = _serves({("pr27010", "timeout"): "a", ("pr36425", "timeout"): "z"})
    assert repeat_failures(a, a) == []
    (line,) = repeat_failures(a, b)
    assert "pr36425" in line


def test_noise_fails_pinned_runs_of_one_seed_with_different_schedules():
    import pandas as pd

    from bench.verdict.schedule_digests import across_runs

    def summary(digests: str, schedule: str = "pinned") -> pd.DataFrame:
        return pd.DataFrame([{"protocol": "pr36425", "policy": "timeout", "rate_rps": 16.0,
                              "schedule": schedule, "schedule_digest": digests}])

    assert across_runs([summary("a b"), summary("a b")]) == []
    (line,) = across_runs([summary("a b"), summary("a c")])
    assert "repeat 1" in line and "b vs c" in line
    assert across_runs([summary("a b", "free"), summary("a c", "free")]) == []
