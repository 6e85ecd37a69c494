"""What one cell of the hazard matrix found, from its ranks' reports (bench.hazards.cell).

A cell whose ranks ran past its bound is bench.hazards.hang's (a livelock, a deadlock outside
any collective, or the harness's failure). Else, in this order: a rank without a report (the
harness failed: it could not start its serve);
the earlier of the first unpaired collective (deadlock: two ranks of a group issued the
same operation at different call sites or for different requests; gloo either fails it or
pairs it silently) and the first record where the ranks' rank-consensus logs differ
(divergence: the ranks answered one poll differently or polled different requests); a
failed collective (deadlock, named by call site, group, ranks and step, with each rank's
last collectives); pages whose bytes
differ from storage (corrupt); ranks that ended prefetches differently or polled a different
number of times (divergence); else OK, with the cost the protocol paid.
"""

from __future__ import annotations

import json
import re

from hicache.comm.comm import MODEL_ALLREDUCE, PP_HOP, REQUEST_BROADCAST, SCHEDULER_SITES

OK, DEADLOCK, ABORT, DIVERGENCE, CORRUPT, FAILED, HARNESS = (
    "OK", "deadlock", "abort", "divergence", "corrupt", "failed", "harness")
LIVELOCK = "livelock"  # ranks stepping without progress past the cell's bound (hazards.hang)
# A side that cannot run the cell, said in one line before anything serves
# (bench.hazards.matrix.refusal): no outcome, never a failure
REFUSED = "refused"
LOCKSTEP = SCHEDULER_SITES | {MODEL_ALLREDUCE}  # issued by every rank in the same step
SITE = re.compile(r"call site '(\w+)' on group '(\w+)' \(ranks (\[[\d, ]*\])\) failed on rank "
                  r"(\d+) at step (-?\d+)(?: for request (\S+?):)?")


def first_divergence(logs: list[list[str]]) -> tuple[int, list[str | None]] | None:
    """(index, each rank's record there) of the first record at which two ranks that both
    have one differ; None when every log is a prefix of the longest."""
    longest = max((len(log) for log in logs), default=0)
    for i in range(longest):
        seen = [log[i] if i < len(log) else None for log in logs]
        if len({s for s in seen if s is not None}) > 1:
            return i, seen
    return None


def collective_failure(error: str | None) -> dict | None:
    """The failed collective a rank's error names (its own or a background thread's)."""
    m = SITE.search(error or "")
    if m is None:
        return None
    site, group, ranks, rank, step, rid = m.groups()
    return {"site": site, "group": group, "ranks": ranks, "rank": int(rank),
            "step": int(step), "rid": rid}


def _last(rep: dict, n: int = 3) -> str:
    calls = [f"{c['site']}@{c['step']}" + (f"({c['rid']})" if c["rid"] else "")
             for c in rep["recent"][-n:]]
    return ", ".join(calls) or "none"


def _deadlock(reports: list[dict], key: str = "error") -> dict | None:
    """The failed collectives the ranks' errors name (`key`: the scheduler thread's, or
    "thread_error": a background thread's), the earliest first."""
    named = [(r, collective_failure(rep.get(key))) for r, rep in enumerate(reports)]
    named = [(r, f) for r, f in named if f is not None]
    if not named:
        return None
    parts = [f"rank {r}: {f['site']} on {f['group']} {f['ranks']} at step {f['step']}"
             + (f" ({f['rid']})" if f["rid"] else "") + f", after {_last(reports[r])}"
             for r, f in named]
    first = min(named, key=lambda rf: (rf[1]["step"], rf[0]))[1]
    return {"outcome": DEADLOCK, "site": first["site"], "step": first["step"],
            "detail": "; ".join(parts)}


def first_mispair(reports: list[dict]) -> dict | None:
    """The earliest (by step) pair of collectives two ranks of one group issued as the same
    operation but at different call sites or for different requests: gloo pairs them
    silently when their sizes agree, or fails; either way the first unpaired collective."""
    best = None
    for members, seqs in _group_sequences(reports):
        for i, calls in enumerate(zip(*seqs, strict=False)):
            if _unmatched(calls):
                step = min(c[3] for c in calls)
                if best is None or step < best["step"]:
                    best = {"step": step, "members": members, "calls": calls, "index": i}
                break
    return best


def _unmatched(calls) -> bool:
    """Different call sites; different requests where every rank knows the request (a
    later PP stage receives a ticket before it knows whose it is); or, for the scheduler
    thread's collectives, which every rank issues in the same step, different steps (the
    same site one step apart: a rank that skipped one)."""
    rids = {rid for _, _, rid, _ in calls}
    sites = {site for _, site, _, _ in calls}
    steps = {step for *_, step in calls}
    return len(sites) > 1 or (None not in rids and len(rids) > 1) or \
        (sites <= LOCKSTEP and len(steps) > 1)


def _group_sequences(reports: list[dict]):
    """(member ranks, each member's collectives on that group) for every group instance."""
    seen = {}
    for rep in reports:
        for group, ranks in rep["group_ranks"].items():
            seen.setdefault((group, tuple(ranks)), None)
    for group, ranks in seen:
        if len(ranks) > 1:
            yield (group, ranks), [[c for c in reports[r]["sequence"] if c[0] == group]
                                   for r in ranks]


def _mispair(reports: list[dict]) -> dict | None:
    m = first_mispair(reports)
    if m is None:
        return None
    (group, ranks), calls = m["members"], m["calls"]
    who = "; ".join(f"rank {r}: {site}" + (f"({rid})" if rid else "") + f" at step {step}"
                    for r, (_, site, rid, step) in zip(ranks, calls, strict=True))
    return {"outcome": DEADLOCK, "site": calls[0][1], "step": m["step"],
            "detail": f"first unpaired collective: #{m['index']} on {group} {list(ranks)}: "
                      f"{who}"}


def _divergence(reports: list[dict]) -> dict | None:
    found = first_divergence([rep["records"] for rep in reports])
    if found is None:
        return None
    i, seen = found
    ranks = "; ".join(f"rank {r}: {s}" for r, s in enumerate(seen) if s is not None)
    step = min(rep["record_steps"][i] for rep in reports if i < len(rep["record_steps"]))
    return {"outcome": DIVERGENCE, "site": "consensus", "step": step,
            "detail": f"rank-consensus record {i} (step {step}) differs: {ranks}"}


def _earliest(*found: dict | None) -> dict | None:
    """The first of the findings by step; a tie goes to the one named first."""
    found = [f for f in found if f is not None]
    return min(found, key=lambda f: f["step"]) if found else None


def _late_divergence(reports: list[dict]) -> dict | None:
    decisions = [rep["decisions"] for rep in reports]
    for rid in sorted(set().union(*decisions)):
        seen = [d.get(rid) for d in decisions]
        if any(s != seen[0] for s in seen):
            return {"outcome": DIVERGENCE, "site": "decisions", "step": None,
                    "detail": f"request {rid} ended differently: " +
                              "; ".join(f"rank {r}: {s}" for r, s in enumerate(seen))}
    steps = [rep["steps"] for rep in reports]
    if len(set(steps)) > 1:  # every rank leaves the loop at the same step, or none does
        return {"outcome": DIVERGENCE, "site": "steps", "step": None,
                "detail": f"ranks ran different numbers of steps: {steps}"}
    counts = [len(rep["records"]) for rep in reports]
    if len(set(counts)) > 1:
        return {"outcome": DIVERGENCE, "site": "consensus", "step": None,
                "detail": f"ranks logged different numbers of polls: {counts}"}
    return None


GLOO_ENFORCE = re.compile(r"enforce fail at [^\]]*\] (.*?)\. (\d+) vs (\d+)\.")


def gloo_abort(stderr: str) -> str | None:
    """gloo's own words when it aborted a rank: the check that failed and both sizes (bytes
    the peer sent vs bytes this rank expected), e.g. "op.preamble.length <= op.nbytes: 48
    vs 40 bytes"."""
    m = GLOO_ENFORCE.search(stderr)
    return None if m is None else f"{m.group(1)}: {m.group(2)} vs {m.group(3)} bytes"


def _aborted_in(reports: list[dict], found: dict | None) -> dict | None:
    """A failed collective, when gloo aborted a rank on a size mismatch, is an abort. Its
    site is the survivors' failed scheduler collective, unless every such failure is a
    cascade (below): then their background threads', one of which was in the collective
    the peer died in."""
    if not any(rep.get("aborted") is not None and rep.get("gloo") for rep in reports):
        return found
    if found is None or _only_cascades(reports):
        found = _deadlock(reports, "thread_error") or found
    if found is not None:
        found["outcome"] = ABORT
    return found


CASCADE_SITES = frozenset({REQUEST_BROADCAST, PP_HOP, MODEL_ALLREDUCE})


def _only_cascades(reports: list[dict]) -> bool:
    """Whether every survivor's scheduler failure only followed a death: on a group without
    an aborted rank (a survivor that failed first exited), or in a collective every rank
    issues each step whatever its state (the request broadcast, the forward's all-reduce,
    the PP relay), where a dead peer is simply missed. A heuristic: the journals do not say
    which in-flight collective gloo aborted."""
    dead = {rep["rank"] for rep in reports if rep.get("aborted") is not None}
    fails = [collective_failure(rep.get("error")) for rep in reports]
    fails = [f for f in fails if f is not None]
    return all(f["site"] in CASCADE_SITES or not dead & set(json.loads(f["ranks"]))
               for f in fails)


def _abort_note(reports: list[dict]) -> str:
    """Ranks gloo aborted (a peer sent a collective of another size): their report is what
    their journals logged before it (bench.hazards.cell.Journal), and gloo's message."""
    dead = [f"rank {rep['rank']} (exit {rep['aborted']}"
            + (f", gloo: {rep['gloo']}" if rep.get("gloo") else "") + ")"
            for rep in reports if rep.get("aborted") is not None]
    return f"{', '.join(dead)} aborted by gloo (a collective of another size)" if dead else ""


def _aborted(reports: list[dict]) -> dict:
    """Only an abort and the survivors' failures to go by."""
    failed = _deadlock_among([rep for rep in reports if rep.get("aborted") is None])
    note = _abort_note(reports)
    return {"outcome": DEADLOCK, "site": failed["site"] if failed else None,
            "step": failed["step"] if failed else None,
            "detail": note + (f"; {failed['detail']}" if failed else "")}


def _deadlock_among(alive: list[dict]) -> dict | None:
    for rep in alive:
        f = collective_failure(rep["error"])
        if f is not None:
            return {"site": f["site"], "step": f["step"],
                    "detail": f"rank {rep['rank']}: {f['site']} on {f['group']} {f['ranks']} "
                              f"at step {f['step']}, after {_last(rep)}"}
    return None


KILLED = "killed at the cell's bound"


def classify(reports: list[dict | None], unreported: dict[int, str] | None = None) -> dict:
    """The cell's outcome row (outcome, site, step, detail); costs are added for OK. A rank
    without a report failed before it served (`unreported`: what the launcher heard from
    it) or was killed at the cell's bound; one gloo aborted is reported from its journals
    (`aborted`: its exit code)."""
    missing = [r for r, rep in enumerate(reports) if rep is None]
    unfit = [(r, rep["error"]) for r, rep in enumerate(reports)
             if rep is not None and rep.get("error_kind") == "LoadError"]
    if unfit:  # the SGLang under test cannot be driven in this cell: not a finding
        return {"outcome": HARNESS, "site": None, "step": None,
                "detail": "; ".join(f"rank {r}: {e[:200]}" for r, e in unfit)}
    if missing:
        heard = unreported or {}
        why = [f"rank {r}: {heard.get(r, KILLED)}" for r in missing]
        return {"outcome": HARNESS, "site": None, "step": None,
                "detail": f"rank(s) {missing} wrote no report ({'; '.join(why)})"}
    # A collective that paired wrongly and a poll answered differently: whichever came
    # first is the cause; a collective that failed (or an abort) names the deadlock otherwise.
    mispair = _mispair(reports)
    found = _earliest(mispair, _divergence(reports))
    if found is not None and found is mispair:
        failed = _deadlock(reports)
        if failed is not None:
            found["detail"] += "; then " + failed["detail"]
    if found is None:
        found = _aborted_in(reports, _deadlock(reports))
    if found is not None:
        note = _abort_note(reports)
        found["detail"] += f"; {note}" if note else ""
        return found
    if any(rep.get("aborted") is not None for rep in reports):
        return _aborted(reports)
    errors = [(r, rep["error"]) for r, rep in enumerate(reports) if rep["error"]]
    if errors:
        kind = DIVERGENCE if any("ConsensusError" in e for _, e in errors) else FAILED
        return {"outcome": kind, "site": None, "step": None,
                "detail": "; ".join(f"rank {r}: {e[:200]}" for r, e in errors)}
    bad = sum(rep["data_errors"] for rep in reports)
    if bad:
        return {"outcome": CORRUPT, "site": "load_back", "step": None,
                "detail": f"{bad} loaded pages differ from storage (page checksums)"}
    return _late_divergence(reports) or {"outcome": OK, "site": None, "step": None,
                                         "detail": ""}
