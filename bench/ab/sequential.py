"""The sequential rule of a served A/B: add repeats only while a gated check is undecided.

Each gated check (a configuration's ratio B/A of one timing metric, with its 95% interval
over the paired repeats) is decided against its threshold t:
- PASS when the whole interval lies below 1 + t: B is not slower by t;
- FAIL when the whole interval lies above 1 + t: B is slower by more than t;
- UNRESOLVED while the interval holds 1 + t: the run cannot yet tell.
After each stage the run stops when no check is UNRESOLVED, when a check FAILs (the gate's
verdict is then known), or when the budget (repeats or seconds) is spent; otherwise it adds
a stage sized to what the most undecided check needs, from how its half-width shrinks
(1/sqrt(n)) and how far its point lies from 1 + t, but never more than the pairs so far (a
stage at most doubles them: a point read off a few pairs lies far from the truth, so a check
that looked near its threshold at 12 pairs is looked at again at 24 before the budget goes
on it; on the quiet A/As of docs/results/2026-12-06_gate_power_7863880.md this decided at
12-36 pairs what the unbounded stage decided at 38-42, and on no gate another state). The
rule looks at where intervals lie against the threshold and stops on either side, as
Pinpoint's "collect more data" does; an UNRESOLVED check left at the budget is no PASS (the
gate fails it).

Looks planned in advance (`planned_looks`: the first stage's pairs, doubled until the
budget's) keep the intervals valid across the looks: the k-th look's interval is made at
level 1 - (spent(t_k) - spent(t_{k-1})) of an alpha-spending function (`spent`, t the
look's share of the budget's pairs), so by the union bound all looks together exclude the
truth at most alpha (1 - LEVEL) of the time, however the run stops. With `looks`, `more`
steps to the next planned look (or to what the seconds left allow: a last, shorter look at
that look's level).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from bench.stats import LEVEL
from bench.verdict.words import FAIL, UNRESOLVED

SPENDING = ("pocock", "obf")  # Lan-DeMets' Pocock-type and O'Brien-Fleming-type functions
SPEND = "pocock"  # the spending function where looks are planned (a time budget often ends a
# run before its last looks: Pocock-type spends early)
# Whether served A/Bs and reviews plan their looks and spend alpha over them. Off: every look
# at 95 %, stages sized by `more`'s rule (the design with a measured quiet-machine power);
# the planned looks' intervals are 1.26-1.38x wider, too wide for the gate's budget on a slow
# quiet VM (docs/results/2026-12-07_estimators_7e9aeff.md, "Planned looks on a quiet VM").
PLAN_LOOKS = False


# One gated check as the rule reads it: (state, point, low, high, threshold).
State = tuple[str, float, float | None, float | None, float]


@dataclass(frozen=True)
class Budget:
    """How far a served A/B may grow: repeats in all, and seconds in all (stages started
    after the seconds are spent are not started)."""

    repeats: int
    seconds: float
    least_more: int = 4  # the smallest stage added (each stage starts both sides anew)


def needed(point: float, low: float, high: float, threshold: float, n: int) -> float:
    """Paired repeats in all at which this check's interval, shrinking as 1/sqrt(n) about
    its point, would clear 1 + threshold on the point's side (inf at the threshold)."""
    gap = abs(math.log(point) - math.log(1 + threshold))
    half = (math.log(high) - math.log(low)) / 2
    return math.inf if gap == 0 else n * (half / gap) ** 2


def planned_looks(first: int, last: int) -> tuple[int, ...]:
    """The looks' pairs: `first`, doubled while below `last`, then `last`."""
    if first < 1 or last < first:
        raise ValueError(f"need 1 <= first <= last, got {first}, {last}")
    out = [first]
    while out[-1] * 2 < last:
        out.append(out[-1] * 2)
    return tuple(out + [last]) if out[-1] < last else tuple(out)


def looks_for(first: int, last: int) -> tuple[int, ...] | None:
    """The planned looks of a sequential run where PLAN_LOOKS is on, else None (every look
    at 95 %)."""
    return planned_looks(first, max(first, last)) if PLAN_LOOKS else None


def spent(t: float, alpha: float = 1 - LEVEL, kind: str = SPEND) -> float:
    """The alpha spent by information share t (0..1) under Lan-DeMets' spending functions:
    pocock alpha ln(1 + (e - 1) t), obf 2 - 2 Phi(z_{alpha/2} / sqrt t) (needs scipy)."""
    t = min(max(t, 0.0), 1.0)
    if t == 0:
        return 0.0
    if kind == "pocock":
        return alpha * math.log(1 + (math.e - 1) * t)
    if kind == "obf":
        stats = _stats()
        return float(2 - 2 * stats.norm.cdf(stats.norm.ppf(1 - alpha / 2) / math.sqrt(t)))
    raise ValueError(f"unknown spending function {kind!r}; use one of {SPENDING}")


def look_level(n: int, looks: tuple[int, ...] | None, alpha: float = 1 - LEVEL,
               kind: str = SPEND) -> float:
    """The level of the interval made at n pairs: that of the first planned look at or
    after n (a look cut short by the seconds takes its planned look's level); 1 - alpha
    without planned looks (one look)."""
    if not looks:
        return 1 - alpha
    k = next((i for i, m in enumerate(looks) if n <= m), len(looks) - 1)
    before = spent(looks[k - 1] / looks[-1], alpha, kind) if k else 0.0
    return 1 - (spent(looks[k] / looks[-1], alpha, kind) - before)


def more(states: list[State], n: int, spent_s: float, budget: Budget,
         looks: tuple[int, ...] | None = None) -> int:
    """Repeats to add after a stage (0: stop). `states`: per gated check (state, point,
    low, high, threshold); `n`: paired repeats so far; `spent_s`: seconds so far; `looks`:
    the planned looks (the next stage ends at the next one)."""
    if any(s[0] == FAIL for s in states) or all(s[0] != UNRESOLVED for s in states):
        return 0
    room = _room(n, spent_s, budget)
    if room < 1:
        return 0
    if looks:
        nxt = next((m for m in looks if m > n), None)
        return 0 if nxt is None else min(room, nxt - n)
    want = max(math.inf if lo is None else needed(p, lo, hi, t, n)
               for s, p, lo, hi, t in states if s == UNRESOLVED)
    return _toward(want, n, room, budget)


def to_resolve(halves: Sequence[float | None], target: float, n: int, spent_s: float,
               budget: Budget) -> int:
    """Repeats to add to a run staged to resolve (`bench run --resolve`: no threshold, a
    half-width to reach): 0 once every interval's half-width (a fraction; None: no interval
    yet) is at most `target` or the budget is spent; else sized, as `more` sizes, to what
    the widest needs as its half-width shrinks as 1/sqrt(n)."""
    wide = [h for h in halves if h is None or h > target]
    room = _room(n, spent_s, budget)
    if not wide or room < 1:
        return 0
    want = math.inf if None in wide else n * (max(wide) / target) ** 2
    return _toward(want, n, room, budget)


def _room(n: int, spent_s: float, budget: Budget) -> int:
    """The repeats the budget leaves: in repeats, and in seconds at the pace so far."""
    left = budget.repeats - n
    per_repeat = spent_s / n if n else math.inf
    afford = int((budget.seconds - spent_s) / per_repeat) if per_repeat > 0 else left
    return min(left, afford)


def _toward(want: float, n: int, room: int, budget: Budget) -> int:
    """A stage toward `want` pairs in all (a fifth more, for the estimate's error), at most
    doubling the pairs and at least `least_more`, within `room`."""
    add = budget.least_more if math.isinf(want) else math.ceil(want * 1.2) - n
    add = min(add, max(n, budget.least_more))  # at most double the pairs
    return max(1, min(room, max(add, budget.least_more)))


# ---- the stages of a run that grows while a check is undecided ---------------------------

class Staged(Protocol):
    repeats: int  # the stage's paired repeats


S = TypeVar("S", bound=Staged)
R = TypeVar("R")


# A sizing rule: (the judged states, pairs so far, seconds so far) -> (repeats to add, why)
Size = Callable[[Sequence, int, float], tuple[int, str]]


def deciding(budget: Budget | None, looks: tuple[int, ...] | None = None) -> Size | None:
    """The sizing of a run with gated checks (`bench ab`, the gate, `bench review`): `more`
    over their states; None without a budget (one stage)."""
    if budget is None:
        return None

    def size(states: Sequence, n: int, spent_s: float) -> tuple[int, str]:
        return (more(list(states), n, spent_s, budget, looks),
                f"{sum(s[0] == UNRESOLVED for s in states)} gated check(s) undecided")

    return size


def resolving(target: float, budget: Budget) -> Size:
    """The sizing of a run staged to resolve (`bench run --resolve`): `to_resolve` over its
    ratios' half-widths (states: a dict, ratio -> half-width or None)."""
    def size(states: dict, n: int, spent_s: float) -> tuple[int, str]:
        wide = sum(h is None or h > target for h in states.values())
        return (to_resolve(list(states.values()), target, n, spent_s, budget),
                f"{wide} headline ratio(s) not yet resolved to {target:.1%}")

    return size


def staged(first: int, seed: int, serve: Callable[[int, int, int], S],
           judge: Callable[[list[S]], tuple[Sequence, R] | None], size: Size | None,
           log: Callable[[str], None], who: str) -> tuple[list[S], R | None]:
    """The one stage loop of every sequential run (`bench ab` and the gate's served
    revisions, `bench review`'s sides, `bench run --resolve`'s protocols): `serve(index,
    repeats, seed)` runs stage `index` (first `first` paired repeats on `seed`, stage k on
    seed + k) and `judge(stages)` reads every stage so far as one run: its states and what
    the caller keeps (its comparison, its verdicts, its summary), or None when the last
    stage failed (no stage follows, and the last judged result stands). `size` (`deciding`,
    `resolving`) sizes each next stage from the states; None: one stage."""
    t0, repeats, stages, found = time.monotonic(), first, [], None
    while repeats > 0:
        index = len(stages)
        stages.append(serve(index, repeats, seed + index))
        judged = judge(stages)
        if judged is None or size is None:
            found = found if judged is None else judged[1]
            break
        states, found = judged
        n = sum(s.repeats for s in stages)
        repeats, why = size(states, n, time.monotonic() - t0)
        if repeats:
            log(f"{who}: {why} after {n} paired repeats: a stage of {repeats} more "
                f"(seed {seed + index + 1})")
    return stages, found


# ---- sizing the budget from an A/A's spread ---------------------------------------------

def spread(low: float, high: float, n: int, level: float = 0.95) -> float:
    """The sd of one pair's log ratio behind a 95 % t interval [low, high] over n pairs (the
    t-mean's; the served A/B's cpu-adjusted interval gives the residual sd near enough,
    n - 2 degrees of freedom against n - 1)."""
    stats = _stats()
    return (math.log(high) - math.log(low)) / 2 / stats.t.ppf((1 + level) / 2, n - 1) \
        * math.sqrt(n)


def left_unresolved(sd: float, threshold: float, n: int, lean: float = 0.0,
                    level: float = 0.95) -> float:
    """The chance that a check whose pairs' log ratios spread with `sd` about log(1 + lean)
    still holds 1 + threshold in its interval after n pairs, so that a run stopped there
    ends it UNRESOLVED. The run looked earlier too and stopped where it had decided, so this
    is an upper bound on a run of n pairs at most ending UNRESOLVED on this check."""
    stats = _stats()
    se = sd / math.sqrt(n)
    half = stats.t.ppf((1 + level) / 2, n - 1) * se
    edge, mu = math.log(1 + threshold), math.log(1 + lean)
    return float(stats.norm.cdf((edge + half - mu) / se) - stats.norm.cdf((edge - half - mu) / se))


def _stats():
    from bench.stats import NO_SCIPY, _scipy_stats

    stats = _scipy_stats()
    if stats is None:
        raise RuntimeError(f"sizing a budget needs scipy.stats: {NO_SCIPY}")
    return stats
