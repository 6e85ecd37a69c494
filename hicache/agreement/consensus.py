"""Rank-consensus checking (docs/design.md section 6) and the end-of-run decision comparison.

`@rank_consensus` mirrors SGLang's decorator: off by default at the cost of one attribute
test; when the owner has a `consensus` checker, each call appends "name(params)" and/or
"name -> result" to a log on the scheduler thread (no collective there). The checker's own
thread periodically agrees on a record count (MIN), hashes that many records, and compares
the MIN and MAX of the digest across ranks on its own gloo group; on divergence it stores an
error that the scheduler raises at its next step.
"""

from __future__ import annotations

import functools
import hashlib
import threading

import torch
import torch.distributed as dist

from hicache.comm.comm import CONSENSUS, Comm


class ConsensusError(RuntimeError):
    pass


def rank_consensus(same_params: bool = False, same_results: bool = False):
    def wrap(fn):
        @functools.wraps(fn)
        def inner(self, *args):
            checker = self.consensus
            if checker is None:  # the default: zero extra work
                return fn(self, *args)
            if same_params:
                checker.record(f"{fn.__name__}{args!r}")
            result = fn(self, *args)
            if same_results:
                checker.record(f"{fn.__name__} -> {result!r}")
            return result
        return inner
    return wrap


class ConsensusChecker:
    """Owns group `consensus`; its thread is the only one that uses it."""

    def __init__(self, comm: Comm, interval_s: float):
        self.comm, self.interval_s = comm, interval_s
        self.records: list[str] = []
        self.record_steps: list[int] = []  # the scheduler step of each record
        self.error: ConsensusError | None = None
        self._sha, self._hashed = hashlib.sha256(), 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="consensus")

    def record(self, line: str) -> None:
        self.record_steps.append(self.comm.counter.step)  # only the scheduler records
        self.records.append(line)  # list.append is atomic under the GIL

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float) -> None:
        """Ends after a final round that also compares the total record counts; that round
        comes once every rank has called stop, so a lagging rank's last records count."""
        self._stop.set()
        self._thread.join(timeout_s)

    def _loop(self) -> None:
        try:
            while True:
                stopping = self._stop.wait(self.interval_s)
                if self._round(stopping):
                    return
        except Exception as e:  # a failed collective is a failed check
            self.error = ConsensusError(f"consensus thread failed: {e}")

    def _round(self, stopping: bool) -> bool:
        n = len(self.records)
        # One MIN of [count, stop, -count]: agreed prefix length, whether every rank stops
        # (a rank still in its last scheduler step may record more), and the largest count
        # (to catch a rank that recorded more calls than the others).
        t = torch.tensor([n, int(stopping), -n], dtype=torch.int64)
        self.comm.all_reduce(t, dist.ReduceOp.MIN, "consensus", CONSENSUS)
        agreed, stop, most = int(t[0]), t[1] == 1, -int(t[2])
        digest = self._digest(agreed)
        lo, hi = digest.clone(), digest.clone()
        self.comm.all_reduce(lo, dist.ReduceOp.MIN, "consensus", CONSENSUS)
        self.comm.all_reduce(hi, dist.ReduceOp.MAX, "consensus", CONSENSUS)
        if not torch.equal(lo, hi):
            self.error = ConsensusError(f"ranks diverged within the first {agreed} records "
                                        f"(rank {self.comm.layout.rank}'s last: "
                                        f"{self.records[agreed - 1] if agreed else None})")
            return True
        if stop and agreed != most:
            self.error = ConsensusError(f"ranks recorded different numbers of calls "
                                        f"({agreed} vs {most})")
        return bool(stop)

    def _digest(self, upto: int) -> torch.Tensor:
        for line in self.records[self._hashed: upto]:
            self._sha.update(line.encode() + b"\n")
        self._hashed = max(self._hashed, upto)
        d = self._sha.copy().digest()
        # Four 62-bit chunks: MIN == MAX over ranks iff every rank has the same digest.
        return torch.tensor([int.from_bytes(d[i: i + 8], "little") >> 2 for i in (0, 8, 16, 24)],
                            dtype=torch.int64)


def compare_decisions(logs: list[dict[str, tuple]]) -> tuple[dict[str, bool], str | None]:
    """Per request, whether every rank ended its prefetch the same way; and the first
    disagreement in words (None when all agree). A request missing on a rank disagrees."""
    rids = sorted(set().union(*logs)) if logs else []
    agree, first = {}, None
    for rid in rids:
        seen = [log.get(rid) for log in logs]
        agree[rid] = all(s == seen[0] for s in seen)
        if not agree[rid] and first is None:
            first = f"request {rid}: " + ", ".join(f"rank {r}={s}" for r, s in enumerate(seen))
    return agree, first


def disagreements(logs: list[dict[str, tuple]]) -> dict[str, list[tuple[tuple | None, list[int]]]]:
    """For each request whose ranks disagree: the distinct decisions (None where a rank has no
    record), each with the ranks that hold it, in rank order."""
    out = {}
    for rid in sorted(set().union(*logs)) if logs else []:
        groups: dict = {}
        for rank, log in enumerate(logs):
            groups.setdefault(log.get(rid), []).append(rank)
        if len(groups) > 1:
            out[rid] = list(groups.items())
    return out


def disagreement_scope(logs: list[dict[str, tuple]], tp: int) -> dict[str, str]:
    """For each disagreeing request: "pp_stages" when the TP ranks of every PP stage agree
    among themselves and only the stages differ (pre27010's known hazard, SGLang #22607),
    else "ranks"."""
    out = {}
    for rid, groups in disagreements(logs).items():
        per_stage: dict[int, set] = {}
        for decision, ranks in groups:
            for r in ranks:
                per_stage.setdefault(r // tp, set()).add(decision)
        stages_only = len(per_stage) > 1 and all(len(d) == 1 for d in per_stage.values())
        out[rid] = "pp_stages" if stages_only else "ranks"
    return out


def describe_disagreements(logs: list[dict[str, tuple]], tp: int | None = None) -> list[str]:
    """One line per disagreeing request, naming the ranks and PP stages behind each decision
    (global rank r is TP rank r % tp of PP stage r // tp; tp None: one stage, no PP)."""
    tp = tp or len(logs)
    return [f"request {rid}: " + "; ".join(f"{_who(ranks, tp, len(logs))} = {decision}"
                                           for decision, ranks in groups)
            for rid, groups in disagreements(logs).items()]


def _who(ranks: list[int], tp: int, world: int) -> str:
    if world <= tp:  # a single PP stage: the ranks say it all
        return f"ranks {ranks}"
    stages = sorted({r // tp for r in ranks})
    if set(ranks) == {s * tp + i for s in stages for i in range(tp)}:  # whole stages
        return f"ranks {ranks} (PP stage {', '.join(map(str, stages))})"
    return f"ranks {ranks} (" + ", ".join(f"stage {r // tp} tp {r % tp}" for r in ranks) + ")"
