"""Does a run measure what a server sees? Its headline ratios held against a free-running run
of the same workload and seed (docs/metrics.md, "The fidelity check").

A schedule mode other than the free one may lead `make bench` only while its ratios to
pr27010 land inside the free-running intervals: a pinned clock charges every IO-wait step its
host-inclusive time, so a slower poll lengthens the IO itself and its TTFT ratio is not the
server's (docs/results/2026-12-03_headline_end_to_end.md). The rule:
bench.verdict.fidelity.
"""

from __future__ import annotations

import pandas as pd

from bench.run.plan import plan_differences
from bench.rundir.schema import REFERENCE_PROTOCOL
from bench.verdict.fidelity import METRICS, Row, interval

# What may differ between the two runs: the thing under test and how many serves each took.
FREE_TO_DIFFER = ("system.schedule", "repeats", "preset", "protocols", "policies",
                  "redo_disturbed")

def check_comparable(candidate_plan: dict | None, free_plan: dict | None,
                     free: pd.DataFrame) -> None:
    """ValueError (one line) unless the second run is free-running and the two ran one
    workload on one layout: only the schedule and the number of repeats may differ."""
    kinds = set(free["schedule"].dropna()) if "schedule" in free else set()
    if kinds != {"free"}:
        raise ValueError(f"the reference run must be free-running (its schedule: "
                         f"{', '.join(sorted(map(str, kinds))) or 'unknown'})")
    if candidate_plan is None or free_plan is None:
        raise ValueError("both runs need env.json's plan, to check they ran one workload")
    differ = [d for d in plan_differences(candidate_plan, free_plan, "vs")
              if not d.startswith(FREE_TO_DIFFER)]
    if differ:
        raise ValueError(f"the runs differ in more than their schedule: {differ[0]}")


def fidelity_rows(candidate: pd.DataFrame, free: pd.DataFrame) -> list[Row]:
    """Per protocol x policy run in both (pr27010, the reference, aside) and metric: the
    candidate's ratio to pr27010 beside the free run's."""
    keyed = {(r["protocol"], r["policy"]): r for r in free.to_dict("records")}
    out = []
    for r in candidate.to_dict("records"):
        other = keyed.get((r["protocol"], r["policy"]))
        if other is None or r["protocol"] == REFERENCE_PROTOCOL:
            continue
        out += [Row(r["protocol"], r["policy"], m, interval(r, m), interval(other, m))
                for m in METRICS]
    return out


def verdict(rows: list[Row]) -> tuple[bool, str]:
    """(faithful, one line): faithful when every judged ratio lies inside the free run's
    interval and one was judged."""
    judged = [r for r in rows if r.judged]
    bad = [r for r in judged if not r.inside]
    if not judged:
        return False, "fidelity: nothing to judge (no free interval to hold a ratio in): FAILED"
    text = (f"fidelity: {len(judged) - len(bad)} of {len(judged)} ratios inside the free run's "
            "intervals")
    if bad:
        worst = bad[0]
        text += (f"; {worst.protocol}/{worst.policy} {worst.metric} {worst.candidate[0]:.2f} "
                 f"against {worst.free[0]:.2f}")
    return not bad, text + (": OK" if not bad else ": FAILED")
