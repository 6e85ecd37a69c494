"""Judging schedule digests (docs/design.md, "Pinned schedules").

Every serve ends with a digest of its schedule: each step's kind, batch, polled requests
and their outcomes (hicache.serve.scheduler). Under a pinned schedule the digest is a function of
the seed, so two serves of one seed must agree, and so must protocols that decide alike
by design: same inputs, same answers, only the collectives they pay differ. Under a free
schedule digests are reported, never judged (the schedule follows the wall clock).
"""

from __future__ import annotations

from collections import defaultdict

# Protocols whose every poll answers alike under a pinned schedule, by policy (why:
# docs/design.md, "Pinned schedules"). pre27010 ends a finished prefetch at a poll (its
# progress is rank-local), where the ack protocols end it by the final ack before the walk
# (under best_effort too, when the walk reaches it only after its IO): one more poll.
# Under timeout step-batched and step-clock decide in the step's agreement, before that
# step's acks are drained, and keep the prefix acked by then: the same step as pr27010 /
# pr36425, possibly fewer pages. sglang-0.5.23 starts its timeout clock at the first
# blocked poll, with a budget from the requested pages.
_ACK = ("pr27010", "pr36425", "step-batched", "step-clock")
DECIDE_ALIKE: dict[str, tuple[tuple[str, ...], ...]] = {
    "best_effort": ((*_ACK, "sglang-0.5.23"),),
    "wait_complete": ((*_ACK, "sglang-0.5.23"),),
    "timeout": (("pr27010", "pr36425"), ("step-batched", "step-clock")),
}
KEY = ("rate_rps", "policy", "repeat")  # one seed's serves, protocol aside


def alike_group(protocol: str, policy: str) -> tuple[str, ...] | None:
    return next((g for g in DECIDE_ALIKE.get(policy, ()) if protocol in g), None)


def digest_failures(rows: list[dict], schedule: str, same_seed: bool = False) -> list[str]:
    """One line per group of decide-alike serves of one seed whose digests differ: the
    protocols of a repeat, or with `same_seed` (every repeat replays one seed) the
    protocols of every repeat; none under a free schedule, or where a row has no digest (a
    run before digests)."""
    if schedule != "pinned":
        return []
    groups: dict[tuple, dict[tuple, str]] = defaultdict(dict)
    for r in rows:
        group = alike_group(r["protocol"], r["policy"])
        if group is None or not r.get("schedule_digest"):
            continue
        key = (r.get("rate_rps"), r.get("policy"),
               None if same_seed else r.get("repeat"), group)
        groups[key][(r["protocol"], r.get("repeat"))] = r["schedule_digest"]
    out = []
    for (rate, policy, repeat, _), digests in sorted(groups.items(), key=str):
        if len(set(digests.values())) > 1:
            if same_seed:
                first = {}
                for (proto, rep), d in sorted(digests.items(), key=str):
                    first.setdefault(d, f"{proto} repeat {rep}")
                seen = ", ".join(f"{who} {d}" for d, who in first.items())
                where = f"{policy}, every repeat replays one seed, rate {rate}"
            else:
                seen = ", ".join(f"{p} {d}" for (p, _), d in sorted(digests.items(), key=str))
                where = f"{policy}, repeat {repeat}, rate {rate}"
            out.append(f"pinned schedules differ between serves that decide alike on one "
                       f"seed ({where}): {seen}")
    return out


def repeat_failures(a: list[dict], b: list[dict]) -> list[str]:
    """Two pinned runs of one seed (e.g. the two sides of `bench ab X X`): every serve
    (protocol, policy, rate, repeat) both ran must have one digest."""
    def index(rows):
        return {(r["protocol"], *(r.get(k) for k in KEY)): r.get("schedule_digest")
                for r in rows if r.get("schedule_digest")}

    ia, ib = index(a), index(b)
    return [f"pinned schedule of {k[0]} ({k[2]}, repeat {k[3]}) differs between two runs "
            f"of one seed: {ia[k]} vs {ib[k]}" for k in sorted(set(ia) & set(ib), key=str)
            if ia[k] != ib[k]]


def serves_of_summary(summary) -> list[dict]:
    """summary.csv's rows (a DataFrame) as one row per serve: its per-repeat digests apart
    (in repeat order), pinned rows only."""
    out = []
    if "schedule_digest" not in summary or "schedule" not in summary:
        return out
    for r in summary.to_dict("records"):
        if r.get("schedule") != "pinned" or not isinstance(r.get("schedule_digest"), str):
            continue
        for repeat, digest in enumerate(r["schedule_digest"].split()):
            out.append({"protocol": r["protocol"], "policy": r["policy"],
                        "rate_rps": r.get("rate_rps"), "repeat": repeat,
                        "schedule_digest": digest})
    return out


def across_runs(summaries: list) -> list[str]:
    """Runs of one commit and seed (`bench noise`): every pinned serve must have the digest
    the first run's has."""
    if not summaries:
        return []
    first = serves_of_summary(summaries[0])
    return [line for s in summaries[1:] for line in repeat_failures(first, serves_of_summary(s))]
