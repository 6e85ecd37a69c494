"""Lining ranks up: each rank's clock offset to rank 0, and each collective's wait.

Every rank stamps with its own `time.monotonic()`. The offset o_i (rank i's clock minus
rank 0's) is bounded by the collectives both ranks joined, NTP-style, with no message of
its own: a rank cannot leave an all-reduce before every rank has entered it, so for the
k-th all-reduce of a group holding ranks 0 and i (entries e, exits x, each on its own
clock) e_i - x_0 < o_i < x_i - e_0; a broadcast from rank 0 gives the upper bound alone (a
receiver leaves after the root entered). The estimate is the middle of the tightest bounds
over the cell, and half their width its uncertainty. On one node all ranks share one
monotonic clock, so the estimate is near 0 and its width says how well it can be told.

A group's collectives are issued in one order on every member (each group has one owner
thread, and the counts are cross-checked), so the k-th call on one rank is the k-th on
every other: that pairing also gives each call's wait, the time from a rank's entry to the
last member's entry (on rank 0's clock): the time it sat in the collective for a peer.
"""

from __future__ import annotations

from dataclasses import dataclass

from hicache.memory.events import COLLECTIVE

SYMMETRIC_OPS = ("all_reduce",)  # every member waits for every other
ROOTED_OPS = ("broadcast",)  # receivers wait for the group's first rank


@dataclass(frozen=True)
class Offset:
    seconds: float  # rank i's clock minus rank 0's
    half_width_s: float | None  # None: an upper bound only (no all-reduce with rank 0)
    pairs: int  # collectives that bounded it


def group_calls(rank: dict) -> dict[tuple[str, tuple[int, ...]], list[list]]:
    """(group name, member ranks) -> the rank's collective events on it, in call order."""
    members = {name: tuple(r) for name, r in rank["groups"].items()}
    out: dict[tuple[str, tuple[int, ...]], list[list]] = {}
    for events in rank["threads"].values():
        for e in events:
            if e[0] == COLLECTIVE and e[5] in members:
                out.setdefault((e[5], members[e[5]]), []).append(e)
    for calls in out.values():
        calls.sort(key=lambda e: e[1])
    return out


def paired_calls(ranks: list[dict]) -> dict[tuple[str, tuple[int, ...]], dict[int, list]]:
    """Per group (name, members): rank -> its calls, for groups every member recorded with
    the same number of calls (the k-th call of one rank is the k-th of the others)."""
    by_rank = [group_calls(r) for r in ranks]
    out = {}
    for key in {k for calls in by_rank for k in calls}:
        members = key[1]
        if len(members) < 2 or any(m >= len(ranks) for m in members):
            continue
        calls = {m: by_rank[m].get(key, []) for m in members}
        if len({len(c) for c in calls.values()}) == 1:
            out[key] = calls
    return out


def estimate_offsets(ranks: list[dict]) -> list[Offset]:
    """Each rank's offset to rank 0 (rank 0's is 0), from the collectives they shared."""
    lo = [float("-inf")] * len(ranks)
    hi = [float("inf")] * len(ranks)
    pairs = [0] * len(ranks)
    for (_, members), calls in paired_calls(ranks).items():
        if 0 not in members:
            continue
        for i in (m for m in members if m != 0):
            for c0, ci in zip(calls[0], calls[i], strict=True):
                pairs[i] += 1
                if c0[3] in SYMMETRIC_OPS:
                    lo[i] = max(lo[i], ci[1] - c0[2])
                if c0[3] in SYMMETRIC_OPS or (c0[3] in ROOTED_OPS and members[0] == 0):
                    hi[i] = min(hi[i], ci[2] - c0[1])
    return [Offset(0.0, 0.0, 0)] + [_offset(lo[i], hi[i], pairs[i])
                                    for i in range(1, len(ranks))]


def _offset(lo: float, hi: float, pairs: int) -> Offset:
    if hi == float("inf"):  # no collective shared with rank 0 (another PP stage)
        return Offset(0.0, None, 0)
    if lo == float("-inf"):
        return Offset(hi, None, pairs)
    return Offset((lo + hi) / 2, abs(hi - lo) / 2, pairs)


def waits(ranks: list[dict], offsets: list[Offset]) -> dict[int, dict[int, tuple[float, int]]]:
    """rank -> id() of a collective event -> (seconds it waited for a peer, that peer)."""
    out: dict[int, dict[int, tuple[float, int]]] = {r: {} for r in range(len(ranks))}
    for (_, members), calls in paired_calls(ranks).items():
        for k, first in enumerate(calls[members[0]]):
            entries = {m: calls[m][k][1] - offsets[m].seconds for m in members}
            if first[3] in SYMMETRIC_OPS:
                last = max(entries, key=entries.get)
            elif first[3] in ROOTED_OPS:
                last = members[0]
            else:
                continue  # point to point (the PP hop): not paired by call order
            for m in members:
                e = calls[m][k]
                wait = min(max(0.0, entries[last] - entries[m]), e[2] - e[1])
                out[m][id(e)] = (wait, last)
    return out
