"""SGLang's own rank-consensus checker (PR #34406, `sglang/srt/utils/rank_consensus_checker.py`
from 0.5.23) switched on in a rank as SGLang's scheduler switches it on, and read back.

In a rank (`Checker`): `enable()` sets SGLANG_ENABLE_RANK_CONSENSUS_CHECKER before SGLang
is imported (its decorators choose at import whether to wrap); `Checker.start`, on the
scheduler thread, calls SGLang's `configure` with the TP and PP group coordinators (its own
dedicated gloo groups, its own background thread) and journals every record SGLang queues
(`assert_same`) with the step and request in hand, before the checker sees it. SGLang's
worker compares the records' digests and, at the first difference, logs them and calls
`os._exit(1)`: its log goes to a file the harness reads (`Checker.log_path`).

In the harness (`verdict`): whether the checker fired, and at which record: the first
record the ranks' journals disagree on names the function, the step, the request and what
each rank said.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

ENV = "SGLANG_ENABLE_RANK_CONSENSUS_CHECKER"
MODULE = "sglang.srt.utils.rank_consensus_checker"
FIRED = "Found rank divergence"
GROUP = "rank_consensus"  # the door's name for the checker's own groups
POLL = "check_prefetch_progress called"  # SGLang's record of a poll's start


def enable() -> None:
    """Before SGLang is imported in this process: its decorators wrap only if this is set."""
    os.environ[ENV] = "1"


def ships_checker(root: str) -> bool:
    """Whether the SGLang imported from `root` has the checker (0.5.23 on)."""
    return (Path(root) / "sglang" / "srt" / "utils" / "rank_consensus_checker.py").exists()


def paths(folder: str | Path, rank: int) -> tuple[Path, Path]:
    """(the records journal, the checker's log) of one rank."""
    folder = Path(folder)
    return folder / f"rank{rank}.consensus.jsonl", folder / f"rank{rank}.consensus.log"


def count_path(folder: str | Path, rank: int) -> Path:
    """How many collectives the checker issued on this rank's own groups in the serve."""
    return Path(folder) / f"rank{rank}.consensus.count"


def write_count(folder: str | Path, rank: int, n: int) -> None:
    count_path(folder, rank).write_text(f"{n}\n")


def collectives(folder: str | Path, world: int) -> int | None:
    """The checker's collectives over every rank of one serve, counted apart from the
    serve's (None where a rank wrote no count: it did not end its serve)."""
    counts = [count_path(folder, r) for r in range(world)]
    if not all(c.exists() for c in counts):
        return None
    return sum(int(c.read_text()) for c in counts)


class Checker:
    """SGLang's checker in one rank. Built and started on the scheduler thread (SGLang's
    `assert_same` refuses records from any other thread); its worker thread owns SGLang's
    dedicated gloo groups."""

    def __init__(self, folder: str | Path, rank: int,
                 where: Callable[[], tuple[int | None, str | None]]):
        self.records_path, self.log_path = paths(folder, rank)
        self.where = where  # (step, request) in hand, for each record
        self.module = sys.modules.get(MODULE)
        self.groups: list = []

    @property
    def present(self) -> bool:
        """Whether this SGLang ships the checker (0.5.23 does; 0.5.18 and 0.5.19 do not)."""
        return self.module is not None and hasattr(self.module, "configure")

    def start(self, coordinators: list) -> None:
        """SGLang's `configure`, as its scheduler calls it, with the harness's TP and PP
        gloo groups as the coordinators' CPU groups (None: a layout without that group)."""
        if not self.present:
            return
        self._handler = logging.FileHandler(self.log_path, mode="w")
        logging.getLogger(MODULE).addHandler(self._handler)  # flushed before os._exit
        self._journal = open(self.records_path, "w")  # noqa: SIM115 (closed in stop)
        self._wrap_assert_same()
        self.module.configure([SimpleNamespace(cpu_group=g) for g in coordinators
                               if g is not None])
        self.groups = list(self.module._sync_groups)

    def _wrap_assert_same(self) -> None:
        """Every record journaled, flushed, before SGLang queues it: a rank the checker
        stops keeps every record it made. The decorators look `assert_same` up at each call."""
        # the release's own, not a wrapper an earlier serve's checker left on this rank
        real = getattr(self.module.assert_same, "sglang_own", self.module.assert_same)
        self._real = real

        def journaled(fmt: str, *args) -> None:
            if self.module.enabled():
                step, rid = self.where()
                self._journal.write(json.dumps([step, rid, fmt % args]) + "\n")
                self._journal.flush()
            real(fmt, *args)
        journaled.sglang_own = real
        self.module.assert_same = journaled

    def stop(self, wait: bool) -> None:
        """After a serve that ended on every rank (`wait`): SGLang's `shutdown` compares the
        last records (a collective on its groups). After a failure: nothing is waited on."""
        if not self.present or not hasattr(self, "_journal"):
            return
        if wait:
            self.module.shutdown()
        # the next serve on this rank (a run's warm-up, then its main serve) starts clean
        self.module.assert_same = self._real
        logging.getLogger(MODULE).removeHandler(self._handler)
        self._handler.close()
        self._journal.close()


def read_records(path: Path) -> list[list]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut short by the exit
            break
    return out


def verdict(folder: str | Path, world: int, present: bool = True) -> dict:
    """What SGLang's checker said of one serve: `fired: <function>` (the request, its
    poll, the step and each rank's record in `detail`), `silent`, or `absent` where the
    release ships no checker."""
    if not present:
        return {"sglang_consensus": "absent", "consensus_detail": "this SGLang ships no "
                "rank-consensus checker (PR #34406 is in 0.5.23)"}
    logs = [paths(folder, r)[1] for r in range(world)]
    fired = [r for r, p in enumerate(logs) if p.exists() and FIRED in p.read_text()]
    records = [read_records(paths(folder, r)[0]) for r in range(world)]
    first = _first_difference(records)
    if not fired:
        return {"sglang_consensus": "silent", "consensus_detail": _unseen(records, first)}
    if first is None:
        return {"sglang_consensus": "fired", "consensus_detail": f"ranks {fired} logged a "
                "divergence; their journals agree on every record both made"}
    i, (step, rid) = first
    said = [f"rank {r}: {rec[i][2] if i < len(rec) else '(no record)'}"
            for r, rec in enumerate(records)]
    maker = next(rec for rec in records if i < len(rec))
    function = maker[i][2].split()[0]
    # The column names the function alone: a matrix cell serves on the wall clock, so the
    # step and the request's poll at which the ranks' records part vary from one serve of
    # a seed to the next (step 0 or 1, poll 1 or 2 in ongoing-skew); the detail has both.
    polls = sum(1 for s, r, text in maker[: i + 1] if r == rid and text.startswith(POLL))
    at = f"{rid}'s poll {polls}" if rid is not None and polls else "no poll"
    return {"sglang_consensus": f"fired: {function}",
            "consensus_detail": f"at {at}, step {step}, record {i}; " + "; ".join(said)}


def _unseen(records: list[list[list]], first: tuple[int, tuple] | None) -> str:
    """Why a silent checker saw nothing where the journals differ: it compares only the
    records every rank has made (a MIN of the queue sizes), so a rank that stops making
    records (blocked in a collective) hides the records the others made after it."""
    if first is None:
        return ""
    counts = ", ".join(f"rank {r} {len(rec)}" for r, rec in enumerate(records))
    i, (step, rid) = first
    return (f"records made: {counts}; they part at record {i} (step {step}, request {rid}), "
            "which not every rank made, and the checker compares only records all ranks made")


def _first_difference(records: list[list[list]]) -> tuple[int, tuple] | None:
    """The first record index at which the ranks' journals differ (in text, or one rank has
    none there), with the (step, request) of the rank that made it."""
    longest = max(len(r) for r in records)
    for i in range(longest):
        texts = {rec[i][2] if i < len(rec) else None for rec in records}
        if len(texts) > 1:
            maker = next(rec[i] for rec in records if i < len(rec))
            return i, (maker[0], maker[1])
    return None
