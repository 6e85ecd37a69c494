"""Exact checks: counts never depend on timing, so any change is flagged whatever the
threshold. Equality and ceilings up to EPS (a CSV round trip of a mean), and bench compare's
count rules: worse when B issues more collectives, better when fewer; when polls/req differ
the collectives issued inside polls are judged per poll, step collectives per step kind
when the steps carry `kind`. The counts: bench.compare.metrics.Counts (exact fractions)."""

from __future__ import annotations

from fractions import Fraction

from bench.verdict.words import BETTER, NOT_COMPARABLE, SAME, WORSE

EPS = 1e-9  # CSV round trips of means; per-request counts are compared exactly


def close(a: float, b: float) -> bool:
    """Equal up to a CSV round trip."""
    return abs(float(a) - float(b)) <= EPS


def at_most(value: float, ceiling: float) -> bool:
    """At most the ceiling, up to a CSV round trip."""
    return float(value) <= ceiling + EPS


def direction(a: Fraction | None, b: Fraction | None) -> str:
    """B's count against A's: worse when more, better when fewer, else same."""
    if a is None or b is None:
        return SAME if a == b else NOT_COMPARABLE
    return WORSE if b > a else BETTER if b < a else SAME


def worst(verdicts: list[str]) -> str:
    """The worst of several verdicts: not comparable, worse, better, same."""
    for v in (NOT_COMPARABLE, WORSE, BETTER):
        if v in verdicts:
            return v
    return SAME


def _q(x: Fraction | None) -> str:
    return "-" if x is None else f"{float(x):.4g}"


def judge_decision(a, b) -> tuple[str, str]:
    """Decision collectives per request, or per poll when the number of polls differs."""
    if (a.decision_per_req == b.decision_per_req or a.polls_per_req == b.polls_per_req
            or None in (a.decision_per_poll, b.decision_per_poll)):
        return direction(a.decision_per_req, b.decision_per_req), ""
    return (direction(a.decision_per_poll, b.decision_per_poll), "polls/req differ: judged "
            f"per poll, {_q(a.decision_per_poll)} -> {_q(b.decision_per_poll)}")


def judge_critical(a, b) -> tuple[str, str]:
    """Critical collectives per request, or split into in-poll (per poll) and completion."""
    if (a.critical_per_req == b.critical_per_req or a.polls_per_req == b.polls_per_req
            or None in (a.poll_sites_per_poll, b.poll_sites_per_poll)):
        return direction(a.critical_per_req, b.critical_per_req), ""
    verdict = worst([direction(a.poll_sites_per_poll, b.poll_sites_per_poll),
                     direction(a.completion_per_req, b.completion_per_req)])
    return verdict, (f"polls/req differ: judged as in-poll per poll {_q(a.poll_sites_per_poll)}"
                     f" -> {_q(b.poll_sites_per_poll)} and completion per request "
                     f"{_q(a.completion_per_req)} -> {_q(b.completion_per_req)}")


def judge_steps(a, b) -> tuple[str, str]:
    """Step collectives per step; per step kind when both runs' steps carry `kind`."""
    if a.step_per_step is None or b.step_per_step is None:
        side = "A" if a.step_per_step is None else "B"
        return NOT_COMPARABLE, f"no steps.csv rows in {side}"
    ka, kb = a.step_per_step_by_kind, b.step_per_step_by_kind
    kinds = sorted(set(ka) & set(kb))
    if not kinds:
        return direction(a.step_per_step, b.step_per_step), ""
    verdict = worst([direction(ka[k], kb[k]) for k in kinds])
    if verdict == SAME and a.step_per_step == b.step_per_step:
        return verdict, ""
    return verdict, "judged per step kind: " + ", ".join(f"{k} {_q(ka[k])} -> {_q(kb[k])}"
                                                         for k in kinds)
