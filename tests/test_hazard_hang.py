"""A cell past its bound is an outcome (bench.hazards.hang): the decision table on fake
journals, the repeating tail it reads progress from, and the exit codes that tell a hazard
from the harness's failure (bench.hazards.report.exit_code). No timing: every input is
made here."""

from __future__ import annotations

import pytest

from bench.hazards.hang import MIN_REPEATS, Killed, classify_hang, repeating_tail
from bench.hazards.report import exit_code, past_bound
from bench.hazards.review import Part, verdict

STALL_S, BOUND_S = 6.0, 44.0
CYCLE = ["check_prefetch_progress('r00',)", "check_prefetch_progress -> False",
         "check_prefetch_progress('r01',)", "check_prefetch_progress -> False"]
START = ["check_prefetch_progress('r02',)", "check_prefetch_progress -> True"]


def _records(steps: int, lead: int = 2) -> tuple[list[str], list[int]]:
    """`lead` steps that make progress, then `steps` steps repeating CYCLE."""
    records = START * lead + CYCLE * steps
    return records, [i // 2 for i in range(2 * lead)] + \
        [lead + i // len(CYCLE) for i in range(len(CYCLE) * steps)]


def _seq(last_step: int) -> list[list]:
    return [["tp_cpu", "decision", "r00", s] for s in range(last_step + 1)]


def _killed(rank: int, quiet_s: float | None = 0.1, serving: bool = True,
            steps: int = 200, records: list[str] | None = None) -> Killed:
    recs, rsteps = _records(steps)
    if records is not None:
        recs, rsteps = records, list(range(len(records)))
    return Killed(rank, serving, quiet_s, recs, rsteps, _seq(rsteps[-1] if rsteps else 0))


@pytest.mark.parametrize("killed, outcome, site, step", [
    # a rank that never began its serve: the harness could not run the cell
    ([_killed(0), _killed(1, serving=False)], "harness", None, None),
    ([_killed(0), _killed(1, quiet_s=None)], "harness", None, None),
    # silent for longer than a collective could block it: a wait outside any collective
    ([_killed(0), _killed(1, quiet_s=30.0)], "deadlock", "decision", 201),
    # stepping to the end, the same cycle of records over and over: a livelock
    ([_killed(0), _killed(1)], "livelock", "check_prefetch_progress", 2),
    # stepping and progressing (no repeating tail): a bound too short, the harness's
    ([_killed(0, records=[f"r{i}" for i in range(400)])], "harness", None, None),
    # one rank stalled beside a livelocked one: the stall names it
    ([_killed(0), _killed(1, quiet_s=STALL_S)], "deadlock", "decision", 201),
])
def test_a_cell_past_its_bound_is_classified_by_its_journals(killed, outcome, site, step):
    row = classify_hang(killed, STALL_S, BOUND_S)
    assert (row["outcome"], row["site"], row["step"]) == (outcome, site, step), row


def test_a_livelock_names_the_step_it_began_and_the_cycle_that_repeats():
    row = classify_hang([_killed(0), _killed(3)], STALL_S, BOUND_S)
    assert row["detail"].startswith("ranks [0, 3] kept stepping without progress until "
                                    "the cell's bound (44 s, rank 0 at step 201): from "
                                    "step 2 rank 0 repeats one cycle of 4 record(s), 200 "
                                    "times: check_prefetch_progress('r00',); ")


def test_a_stall_and_the_harness_say_which_rank_and_why():
    row = classify_hang([_killed(2, quiet_s=12.34)], STALL_S, BOUND_S)
    assert row["detail"] == ("rank 2: no collective for 12.3 s before the cell's bound (a "
                             "wait outside any collective), after decision@199(r00), "
                             "decision@200(r00), decision@201(r00)")
    row = classify_hang([_killed(1, serving=False)], STALL_S, BOUND_S)
    assert row["detail"] == ("rank(s) [1] still running at the cell's bound (44 s), killed "
                             "(rank 1: never began its serve)")


def test_without_records_the_collective_sequence_shows_the_repetition():
    seq = [["sched", "request_broadcast", None, s] for s in range(100)]
    row = classify_hang([Killed(0, True, 0.0, [], [], seq)], STALL_S, BOUND_S)
    assert (row["outcome"], row["site"], row["step"]) == ("livelock", "request_broadcast", 0)


@pytest.mark.parametrize("items, want", [
    (["a", "b"] * MIN_REPEATS, (0, 2)),
    (["x", "y", "z"] + ["a"] * 30, (3, 1)),
    (["a", "b", "c"] * (MIN_REPEATS - 1), None),  # too few cycles
    (list(range(50)) + ["a"] * 30, None),  # the repetition is under half the log
    ([], None),
])
def test_the_repeating_tail_is_the_smallest_cycle_from_its_earliest_start(items, want):
    assert repeating_tail(items) == want


def _row(outcome: str, codes: str = "1 1") -> dict:
    return {"outcome": outcome, "exit_codes": codes}


@pytest.mark.parametrize("rows, alike, worse, code", [
    ([_row("OK", "0 0"), _row("deadlock"), _row("abort", "1 -6")], True, 0, 0),
    ([_row("OK", "0 0"), _row("livelock", "- - 1 -")], True, 0, 1),
    ([_row("deadlock", "- 1")], True, 0, 1),  # hung past its bound outside a collective
    ([_row("OK", "0 0")], False, 0, 1),  # differed between two runs
    ([_row("OK", "0 0")], True, 1, 1),  # a side worse than the reference
    ([_row("harness", "- -"), _row("livelock", "- -")], True, 0, 3),
    ([_row("harness", "1 0")], True, 0, 3),  # a rank that failed before its serve
])
def test_exit_codes_tell_a_hazard_from_the_harness(rows, alike, worse, code):
    assert exit_code(rows, alike, worse)[0] == code


def test_past_bound_counts_cells_with_a_killed_rank():
    assert past_bound([_row("OK", "0 0"), _row("livelock", "- - 1 -"),
                       _row("harness", "- -")]) == 2


def test_the_review_says_whether_the_matrix_found_a_hazard_or_its_harness_failed():
    run = Part("c", "r/run", 0)
    hazard = verdict(run, Part("h", "r/h", 1), [], False)
    harness = verdict(run, Part("h", "r/h", 3), [], False)
    assert hazard == ["the hazard matrix FAILED (exit 1: a hazard: a cell hung past its "
                      "bound (livelock or deadlock) or differed between two runs): r/h"]
    assert harness == ["the hazard matrix FAILED (exit 3: its harness failed: a cell it "
                       "could not run): r/h"]


def test_killed_ranks_are_read_from_their_journals_and_their_silence(tmp_path):
    """A rank with a report, one that ended or died is not killed; a killed rank's journals
    are read whole, and its silence is the kill's time minus its newest journal line's."""
    import json
    import os

    from bench.hazards.cell import journal_paths
    from bench.hazards.matrix import killed_ranks

    for r in (1, 2):
        for kind, path in journal_paths(tmp_path, r).items():
            item = {"records": "check_prefetch_progress -> False", "record_steps": 7,
                    "sequence": ["tp_cpu", "decision", "r00", 7]}[kind]
            path.write_text(json.dumps(item) + "\n")
            os.utime(path, (1000.0, 1000.0 + r))  # rank 2's newest line 1 s after rank 1's
    (tmp_path / "rank1.serving").touch()
    reports = [{"rank": 0}, None, None, None]
    killed = killed_ranks(tmp_path, reports, {}, {3: (-9, 0.0)}, killed_at=1010.0)
    assert [(k.rank, k.serving, k.quiet_s) for k in killed] == [(1, True, 9.0), (2, False, 8.0)]
    assert killed[0].records == ["check_prefetch_progress -> False"]
    assert killed[0].sequence == [["tp_cpu", "decision", "r00", 7]]


def test_sglang_poll_hazard_cells_past_their_bound_are_classified_as_the_matrix_does(
        tmp_path, monkeypatch):
    """`bench sglang-poll --hazard`: two ranks still stepping at the bound, each repeating
    one cycle of poll records, are a livelock (bench.hazards.hang), not `harness`; its
    exit code is the hazard's, 1, as `bench hazards` gives it."""
    from pathlib import Path

    import bench.hazards.sglang as engine
    from bench.hazards.cell import Journal, journal_paths, mark_serving
    from bench.hazards.sglang_case import HazardCase

    def launched(world, fn, args, **kwargs):  # both ranks serve, stepping, until killed
        cell_dir = args[2]
        for r in range(world):
            mark_serving(cell_dir, r)
            logs = {k: Journal(p) for k, p in journal_paths(Path(cell_dir), r).items()}
            records, steps = _records(200)
            for item, step in zip(records, steps, strict=True):
                logs["records"].append(item)
                logs["record_steps"].append(step)
                logs["sequence"].append(["tp", "decision", "r00", step])
        return {}, {}

    monkeypatch.setattr(engine, "launch_to_end", launched)
    case = HazardCase("walk-skew", "timeout", 2, 4.0)
    row = engine.run_hazard(engine.Source("/nowhere", "0.5.23", "0.5.23"), case, tmp_path,
                            bound_s=BOUND_S)
    assert (row["outcome"], row["site"], row["step"]) == \
        ("livelock", "check_prefetch_progress", 2), row
    assert past_bound([row]) == 1 and exit_code([row], True, 0) == (1, "FAILED (hazard)")
