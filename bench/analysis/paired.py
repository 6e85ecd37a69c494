"""Paired estimators over a run's steps (steps.csv), for the serve designs of
docs/usage.md, "Pairing":

- `step_ratio`: b's step time over a's, per repeat (one pair of serves), a t interval over
  the pairs' log ratios: what the summary reports, for one metric, as a function of rows.
- `repaired_ratio`: the same after pairing b's serves with a's at random (a seeded
  permutation of the repeats): duet benchmarking's control. Where the pairing in time is
  what cancels the machine's bursts, re-pairing widens the interval; where it does not
  (serial serves far apart in time), it changes little.
- `step_delta`: under a pinned schedule, step k of a and step k of b hold the same batch,
  the same waiting requests, the same polls (their schedule digests say so), so b's extra
  host ms per step is the mean over steps of (b's step k - a's step k), per repeat, with a
  t interval over repeats. Steps are paired by index only where the digests agree: a
  disagreement is a PairingError, never a silent estimate.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from bench.stats import Interval, diff_interval, ratio_interval


class PairingError(ValueError):
    """Steps cannot be paired by index: the two sides' schedules differ."""


def _side(steps: pd.DataFrame, protocol: str, policy: str) -> pd.DataFrame:
    side = steps[(steps["protocol"] == protocol) & (steps["policy"] == policy)]
    if side.empty:
        raise PairingError(f"no steps of {protocol} under {policy}")
    return side


def per_repeat_step_ms(steps: pd.DataFrame, protocol: str, policy: str) -> dict[int, float]:
    """Repeat -> the mean step time of that serve."""
    side = _side(steps, protocol, policy)
    return {int(r): float(g["step_ms"].mean()) for r, g in side.groupby("repeat")}


def step_ratio(steps: pd.DataFrame, a: str, b: str, policy: str) -> Interval:
    """b's step time over a's, paired by repeat."""
    return ratio_interval(per_repeat_step_ms(steps, b, policy),
                          per_repeat_step_ms(steps, a, policy))


def repaired_ratio(steps: pd.DataFrame, a: str, b: str, policy: str, seed: int = 0
                   ) -> Interval:
    """step_ratio after pairing b's serves with a's at random (a derangement when there
    are at least 2 repeats, so no serve keeps its partner in time)."""
    x, y = per_repeat_step_ms(steps, b, policy), per_repeat_step_ms(steps, a, policy)
    keys = sorted(set(x) & set(y))
    shift = int(np.random.default_rng(seed).integers(1, len(keys))) if len(keys) > 1 else 0
    moved = {keys[i]: x[keys[(i + shift) % len(keys)]] for i in range(len(keys))}
    return ratio_interval(moved, y)


def step_delta(steps: pd.DataFrame, a: str, b: str, policy: str,
               polled_only: bool = True) -> Interval:
    """b's extra ms per step over a's, steps paired by index within each repeat (steps
    whose walk polled, by default: where a per-poll cost can land). PairingError when a
    repeat's two schedules differ (digest, step count or polls)."""
    sa, sb = _side(steps, a, policy), _side(steps, b, policy)
    per_repeat = {}
    for r in sorted(set(sa["repeat"]) & set(sb["repeat"])):
        x = sa[sa["repeat"] == r].sort_values("step")
        y = sb[sb["repeat"] == r].sort_values("step")
        _check_same_schedule(x, y, a, b, policy, int(r))
        keep = (x["polled"].to_numpy() > 0) if polled_only else np.ones(len(x), bool)
        d = y["step_ms"].to_numpy()[keep] - x["step_ms"].to_numpy()[keep]
        per_repeat[int(r)] = float(d.mean()) if d.size else float("nan")
    return diff_interval(per_repeat, {r: 0.0 for r in per_repeat})


def _check_same_schedule(x: pd.DataFrame, y: pd.DataFrame, a: str, b: str, policy: str,
                         repeat: int) -> None:
    where = f"{a} and {b} under {policy}, repeat {repeat}"
    if len(x) != len(y):
        raise PairingError(f"{where}: {len(x)} against {len(y)} steps; steps pair by index "
                           f"only on one schedule")
    for col in ("schedule_digest", "polled"):
        if col not in x or x[col].isna().all():
            continue
        differ = np.flatnonzero(x[col].to_numpy() != y[col].to_numpy())
        if differ.size:
            k = int(x["step"].to_numpy()[differ[0]])
            raise PairingError(f"{where}: the decisions disagree from step {k} ({col} "
                               f"differs); steps pair by index only on one schedule")


# ---- the step-paired design (bench run --pairing step, hicache.cache.twin) -----------------------
#
# Every step of a cell holds both sides' polls, timed back to back: poll_ms (the cell's
# protocol) and twin_poll_ms (the reference's). Per step d_k = poll_ms - twin_poll_ms is the
# protocol's extra host cost on that very step; the step as each side alone would have
# lasted is step_ms less the other side's polls.

def _twin_cells(steps: pd.DataFrame, protocol: str, policy: str) -> pd.DataFrame:
    side = _side(steps, protocol, policy)
    if "twin_poll_ms" not in side or side["twin_poll_ms"].isna().all():
        raise PairingError(f"{protocol} under {policy}: no twin polls (run with --pairing "
                           f"step)")
    return side


def twin_delta(steps: pd.DataFrame, protocol: str, policy: str,
               polled_only: bool = True) -> Interval:
    """The protocol's extra host ms per step over its twin (the reference), measured in
    the same steps: per repeat the mean of d_k (over steps whose walk polled, by default)
    balanced over the order drawn per step, a t interval over repeats.

    Balanced: the side that polls first also waits for the other ranks to reach the poll
    (their skew), so d_k carries +-o by order; the mean of the two orders' means cancels
    o, where a plain mean would keep o x (the share of one order - 1/2)."""
    side = _twin_cells(steps, protocol, policy)
    per_repeat = {}
    for r, g in side.groupby("repeat"):
        if polled_only:
            g = g[g["polled"] > 0]
        d = g["poll_ms"] - g["twin_poll_ms"]
        order = g["twin_first"].astype(bool) if "twin_first" in g else pd.Series(True, g.index)
        means = [d[order == first].mean() for first in (True, False)]
        means = [m for m in means if pd.notna(m)]
        per_repeat[int(r)] = float(np.mean(means)) if means else float("nan")
    return diff_interval(per_repeat, {r: 0.0 for r in per_repeat})


def twin_ratio(steps: pd.DataFrame, protocol: str, policy: str) -> Interval:
    """The protocol's step time over its twin's, each as the step less the other side's
    polls: per repeat mean(step - twin polls) / mean(step - own polls), a t interval over
    repeats of the log ratios."""
    side = _twin_cells(steps, protocol, policy)
    own, twin = {}, {}
    for r, g in side.groupby("repeat"):
        own[int(r)] = float((g["step_ms"] - g["twin_poll_ms"]).mean())
        twin[int(r)] = float((g["step_ms"] - g["poll_ms"]).mean())
    return ratio_interval(own, twin)
