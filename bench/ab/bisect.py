"""`bench bisect`'s engine: the first commit between GOOD and BAD that made a metric worse,
by binary search with `bench ab` at each step (Chromium's Pinpoint does this for Chrome).

Each step runs ab(GOOD, commit) and reads one verdict: the metric of the chosen configuration
(or of any configuration) worse than GOOD's, or not. The search assumes one change made it
worse and stayed (monotone); it first checks that BAD itself is worse than GOOD.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from bench.ab.blocks import AbPlan, comparison, run_blocks, write_plan
from bench.ab.revisions import Revision
from bench.compare.comparison import Comparison
from bench.compare.report import write_outputs
from bench.verdict.exact import worst


@dataclass(frozen=True)
class Step:
    commit: str
    verdict: str  # worse, better, same, not comparable
    detail: str  # the judged row(s): B/A [interval]


Judge = Callable[[str], Step]  # commit -> its ab step against GOOD


def search(commits: list[str], judge: Judge, verify: bool = True,
           log: Callable[[Step], None] = lambda s: None) -> tuple[str | None, list[Step]]:
    """The first commit of `commits` (oldest first; the last is BAD) that `judge` calls
    worse, assuming every later one is worse too; None when BAD is not worse (verify)."""
    steps = []

    def ask(commit: str) -> bool:
        steps.append(judge(commit))
        log(steps[-1])
        return steps[-1].verdict == "worse"

    if not commits or (verify and not ask(commits[-1])):
        return None, steps
    good, bad = -1, len(commits) - 1  # indices: known good (-1: GOOD), known bad
    while bad - good > 1:
        mid = (good + bad) // 2
        if ask(commits[mid]):
            bad = mid
        else:
            good = mid
    return commits[bad], steps


def judged_rows(comp: Comparison, metric: str, config: str | None) -> list[dict]:
    """The timing rows of `metric` (for protocol/policy `config`, or every configuration)."""
    rows = [r for r in comp.rows if r.get("metric") == metric]
    if config is not None:
        rows = [r for r in rows if f"{r['protocol']}/{r['policy']}" == config]
    return rows


def step_of(commit: str, comp: Comparison, metric: str, config: str | None) -> Step:
    """One step's verdict: the worst of the judged rows, each shown as B/A [low, high]."""
    rows = judged_rows(comp, metric, config)
    if not rows:
        return Step(commit, "not comparable", f"no {metric} row"
                    + (f" for {config}" if config else ""))
    verdict = worst([r["verdict"] for r in rows])
    shown = [r for r in rows if r["verdict"] == verdict][:3]
    detail = "; ".join(f"{r['protocol']}/{r['policy']} {_ratio(r)}" for r in shown)
    return Step(commit, verdict, detail)


def _ratio(row: dict) -> str:
    from bench.report.printer import interval_text

    return "B/A " + interval_text(row.get("ratio_b_over_a"), row.get("ratio_ci_low"),
                                  row.get("ratio_ci_high"), ".3f")


def ab_judge(base: AbPlan, metric: str, config: str | None, out: Path,
             log: Callable[[str], None]) -> Judge:
    """A Judge that runs ab(GOOD, commit) into out/<step>_<sha>/ for each commit."""
    count = [0]

    def judge(commit: str) -> Step:
        count[0] += 1
        plan = replace(base, b=Revision(commit[:10], commit),
                       out=out / f"{count[0]:02d}_{commit[:10]}")
        plan.out.mkdir(parents=True, exist_ok=True)
        runs = run_blocks(plan, log=log)
        comp = comparison(plan, runs)
        write_outputs(comp, plan.out)
        write_plan(plan, runs)
        return step_of(commit, comp, metric, config)
    return judge
